//! The response body passed through from the pod: frames go to the client as they arrive (no
//! buffering), and the request stays counted in flight until the body ends. If the client goes
//! away first, hyper drops this body, which drops the pod's connection and so cancels the
//! request upstream; that is counted.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::fleet::InFlight;
use crate::metrics as m;

pub struct PassThrough {
    inner: Incoming,
    guards: Vec<InFlight>,
    ended: bool,
}

impl PassThrough {
    pub fn new(inner: Incoming, guards: Vec<InFlight>) -> PassThrough {
        let ended = inner.is_end_stream();
        PassThrough { inner, guards, ended }
    }
}

impl Body for PassThrough {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.ended = true;
            this.guards.clear();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PassThrough {
    fn drop(&mut self) {
        if !self.ended && !self.inner.is_end_stream() {
            metrics::counter!(m::CLIENT_DISCONNECTS).increment(1);
        }
    }
}
