//! The proxy's retry loop: the ranked pods tried in order, at most `1 + --upstream-retries`,
//! each committed (counted in flight, credited) before it is sent to. A pod that fails before
//! any response byte (refused, reset, closed) is left for the next; once a response has begun
//! nothing is retried, because the client may already have part of it.

use hyper::body::Incoming;

use super::app::App;
use crate::metrics as m;
use crate::place::decision::Decision;
use crate::pods::fleet::InFlight;
use crate::upstream::{self, Failure, Outgoing};

/// A response whose head arrived from `decision.ranked[attempt]`.
pub struct Forwarded {
    pub attempt: usize,
    pub response: hyper::Response<Incoming>,
    /// Keep until the response body ends: they count the request in flight.
    pub guards: Vec<InFlight>,
}

/// Tries the ranked pods in order; `Err` with the number tried when none answered.
pub async fn forward(app: &App, decision: &Decision, outgoing: Outgoing<'_>) -> Result<Forwarded, usize> {
    let attempts = decision.ranked.len().min(app.upstream_retries.saturating_add(1));
    let prefill = decision.prefill.as_ref().map(|p| p.pod.as_str());
    for attempt in 0..attempts {
        let choice = &decision.ranked[attempt];
        let Some(pod) = choice.handle.as_ref() else { continue };
        let Some(guards) = app.router.commit(decision, attempt) else { continue };
        let to = upstream::Destination { base_url: &pod.url, dp_rank: pod.dp.named_rank() };
        match upstream::send(&app.client, to, prefill, &outgoing).await {
            Ok(response) => return Ok(Forwarded { attempt, response, guards }),
            Err(Failure::Unsendable) => continue,
            Err(failure) => {
                let reason = failure.label();
                metrics::counter!(m::UPSTREAM_RETRIES, "reason" => reason).increment(1);
                tracing::warn!(request_id = decision.id, pod = %choice.pod, reason, "pod failed before responding; trying the next");
            }
        }
    }
    Err(attempts)
}
