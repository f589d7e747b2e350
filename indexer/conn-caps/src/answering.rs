//! The app of a listener held to [`ConnectionCaps`](crate::ConnectionCaps), noting on each
//! connection's place when a request is being answered, so that a connection is never closed to
//! make room while it answers (only idle ones are).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};

use crate::{Answering, Place};

/// The app, noting on the connection's place that a request is being answered: from the moment
/// it reaches the app until its answer's body is written out (or dropped), the connection is
/// busy, never closed to make room.
#[derive(Clone)]
pub struct NotingAnswers {
    app: axum::Router,
    place: Arc<Place>,
}

impl NotingAnswers {
    /// `app`, serving the connection that holds `place`.
    pub fn new(app: axum::Router, place: Arc<Place>) -> NotingAnswers {
        NotingAnswers { app, place }
    }
}

impl tower::Service<Request<Incoming>> for NotingAnswers {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<Request<Incoming>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let answering = self.place.answering();
        let answer = tower::Service::call(&mut self.app, request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Body::new(WhileAnswering { body, _answering: answering })))
        })
    }
}

/// An answer's body, holding its connection busy until it is written out or dropped.
struct WhileAnswering {
    body: Body,
    _answering: Answering,
}

impl hyper::body::Body for WhileAnswering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
