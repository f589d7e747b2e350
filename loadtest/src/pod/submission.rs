//! What submitting a request to a pod gives: its [`RequestEvent`]s in order, or the
//! [`SubmitError`] that refused it. A leaf shared by the pod, its ranks and the HTTP handlers.

use crate::engine::{RejectReason, RequestSummary};

/// What a request's HTTP handler receives, in order: `Scheduled`, then tokens, then `Finished`.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    Scheduled { cached_tokens: usize },
    Token(u32),
    Finished(RequestSummary),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Rejected(RejectReason),
    #[error("the engine has stopped")]
    Stopped,
}
