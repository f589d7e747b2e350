//! The response body passed through from the pod: frames go to the client as they arrive (no
//! buffering), and the request stays counted in flight until the body ends; its first byte
//! means the pod computed the prompt, so its queued prefill is released then. If the client goes
//! away first, hyper drops this body, which drops the pod's connection and so cancels the
//! request upstream; that is counted. A successful response's frames are also shown to a
//! [`UsageTap`] on the way through, which compares the engine's cached tokens with the
//! prediction when the body ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::doors::http::usage::UsageTap;
use crate::metrics as m;
use crate::pods::fleet::InFlight;

pub struct PassThrough {
    inner: Incoming,
    guards: Vec<InFlight>,
    ended: bool,
    /// A body byte came: the guards' queued prefill is released.
    answered: bool,
    usage: Option<UsageTap>,
}

impl PassThrough {
    pub fn new(inner: Incoming, guards: Vec<InFlight>) -> PassThrough {
        let ended = inner.is_end_stream();
        PassThrough { inner, guards, ended, answered: false, usage: None }
    }

    /// Also reads the engine's usage as the body passes and compares it at the end.
    pub fn with_usage(mut self, tap: UsageTap) -> PassThrough {
        if self.ended {
            tap.finish();
        } else {
            self.usage = Some(tap);
        }
        self
    }
}

impl Body for PassThrough {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if frame.data_ref().is_some_and(|d| !d.is_empty()) && !this.answered {
                    // The pod computed the prompt: it no longer delays the next request there.
                    this.answered = true;
                    this.guards.iter_mut().for_each(InFlight::prefilled);
                }
                if let (Some(tap), Some(data)) = (this.usage.as_mut(), frame.data_ref()) {
                    tap.feed(data);
                }
                // A body of known length is complete with its last byte: hyper polls no further.
                if this.inner.is_end_stream() {
                    if let Some(tap) = this.usage.take() {
                        tap.finish();
                    }
                }
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.guards.clear();
                if let Some(tap) = this.usage.take() {
                    tap.finish();
                }
            }
            Poll::Ready(Some(Err(_))) => {
                this.ended = true;
                this.guards.clear();
                this.usage = None;
            }
            Poll::Pending => {}
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
