//! One ext_proc stream is one HTTP request through the gateway. Envoy sends, in order, the
//! request headers, the request body in chunks (`FULL_DUPLEX_STREAMED`), maybe request
//! trailers; then the response headers, body chunks and maybe trailers (an HTTP/1 response
//! may end on a body chunk with `end_of_stream` instead). We buffer the request body (bounded),
//! run the router's pipeline, answer the headers with the pick, re-emit the body, and echo the
//! response without holding any of it back. A message out of that order, or a body past the
//! limit, ends this stream only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, ProcessingRequest, ProcessingResponse,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::budget::{Budget, Reservation};
use super::envoy;
use super::prefilter;
use super::Mode;
use crate::cost::{self, Candidate, Policy};
use crate::decision::Decision;
use crate::fleet::InFlight;
use crate::http::errors::ApiError;
use crate::metrics as m;
use crate::pipeline::{RouteError, Router};
use crate::request::{self, Endpoint};

/// What every stream shares.
pub struct Shared {
    pub router: Arc<Router>,
    pub mode: Mode,
    pub max_body_bytes: usize,
    /// Pods named after the primary (`--upstream-retries`).
    pub fallbacks: usize,
    pub load_band: f64,
    /// From the stream's start to the end of its request (headers, body, trailers).
    pub request_timeout: std::time::Duration,
    pub budget: Arc<Budget>,
}

pub type Outbound = mpsc::Sender<Result<ProcessingResponse, Status>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    RequestHeaders,
    RequestBody,
    /// The request went on; the response has not started.
    Answered,
    ResponseBody,
    Done,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::RequestHeaders => "awaiting request headers",
            Phase::RequestBody => "reading the request body",
            Phase::Answered => "awaiting response headers",
            Phase::ResponseBody => "reading the response body",
            Phase::Done => "after the response ended",
        }
    }
}

/// Why a stream ends without a normal answer.
enum Stop {
    /// Answered with an `ImmediateResponse` (already counted).
    Immediate(Box<ProcessingResponse>),
    /// The peer broke the protocol: a gRPC error on this stream only.
    Protocol { reason: &'static str, message: String },
}

struct State {
    shared: Arc<Shared>,
    phase: Phase,
    headers: HashMap<String, String>,
    metadata: Option<Metadata>,
    body: Vec<u8>,
    reservation: Reservation,
    first_byte: Option<Instant>,
    decision: Option<Decision>,
    /// The pod counted in flight (index into the ranking), moved to the served endpoint.
    attempt: Option<usize>,
    guards: Vec<InFlight>,
}

/// Serves one stream until the gateway closes it or it fails.
pub async fn run(shared: Arc<Shared>, mut inbound: Streaming<ProcessingRequest>, out: Outbound) {
    let reservation = Reservation::new(shared.budget.clone());
    let mut state = State {
        shared,
        phase: Phase::RequestHeaders,
        headers: HashMap::new(),
        metadata: None,
        body: Vec::new(),
        reservation,
        first_byte: None,
        decision: None,
        attempt: None,
        guards: Vec::new(),
    };
    // The request must be complete by then; the response phase has no bound (a generation
    // may take minutes).
    let request_deadline = tokio::time::Instant::now() + state.shared.request_timeout;
    let outcome = loop {
        let next = inbound.message();
        let received = if matches!(state.phase, Phase::RequestHeaders | Phase::RequestBody) {
            match tokio::time::timeout_at(request_deadline, next).await {
                Ok(received) => received,
                Err(_) => {
                    // Envoy's own request timeouts answer 408; so does the picker for a request
                    // whose body never came (GIE's protocol has no rule of its own for it).
                    let ms = state.shared.request_timeout.as_millis();
                    let error = ApiError::new(
                        axum::http::StatusCode::REQUEST_TIMEOUT,
                        "request_timeout",
                        format!("the request did not arrive in full within {ms} ms"),
                    );
                    let _ = out.send(Ok(immediate_response(error))).await;
                    break "timeout";
                }
            }
        } else {
            next.await
        };
        let message = match received {
            Ok(Some(message)) => message,
            Ok(None) | Err(_) => break if state.phase == Phase::Done { "completed" } else { "closed" },
        };
        match state.handle(message).await {
            Ok(responses) => {
                let mut sent = true;
                for response in responses {
                    if out.send(Ok(response)).await.is_err() {
                        sent = false;
                        break;
                    }
                }
                if !sent {
                    break "closed";
                }
            }
            Err(Stop::Immediate(response)) => {
                let _ = out.send(Ok(*response)).await;
                break "immediate";
            }
            Err(Stop::Protocol { reason, message }) => {
                metrics::counter!(m::EXTPROC_PROTOCOL_ERRORS, "reason" => reason).increment(1);
                tracing::warn!(reason, phase = state.phase.label(), "ext_proc stream broke the protocol: {message}");
                let _ = out.send(Err(Status::invalid_argument(message))).await;
                break "protocol_error";
            }
        }
    };
    metrics::counter!(m::EXTPROC_STREAMS, "outcome" => outcome).increment(1);
}

fn out_of_order(what: &str, phase: Phase) -> Stop {
    Stop::Protocol { reason: "out_of_order", message: format!("{what} received while {}", phase.label()) }
}

fn immediate(error: ApiError) -> Stop {
    Stop::Immediate(Box::new(immediate_response(error)))
}

/// The `ImmediateResponse` for `error`, counted in `kvindex_router_request_errors_total`.
fn immediate_response(error: ApiError) -> ProcessingResponse {
    metrics::counter!(m::REQUEST_ERRORS, "reason" => error.code).increment(1);
    envoy::immediate(error.status.as_u16(), error.code, &error.message)
}

/// The OpenAI endpoint of a request: by path, else by the body's shape.
fn endpoint(path: &str, body: &[u8]) -> Endpoint {
    let path = path.split('?').next().unwrap_or_default();
    if path.ends_with("/chat/completions") {
        Endpoint::ChatCompletions
    } else if path.ends_with("/completions") {
        Endpoint::Completions
    } else if serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v.get("messages").is_some()) {
        Endpoint::ChatCompletions
    } else {
        Endpoint::Completions
    }
}

impl State {
    async fn handle(&mut self, message: ProcessingRequest) -> Result<Vec<ProcessingResponse>, Stop> {
        if message.metadata_context.as_ref().is_some_and(|m| !m.filter_metadata.is_empty()) {
            self.metadata = message.metadata_context;
        }
        let Some(request) = message.request else {
            return Ok(Vec::new()); // a flow-control-only message: nothing to answer
        };
        match (request, self.phase) {
            (Request::RequestHeaders(h), Phase::RequestHeaders) => {
                self.headers = envoy::headers(h.headers.as_ref());
                let declared = self.headers.get("content-length").and_then(|v| v.parse::<u64>().ok());
                if declared.is_some_and(|n| n > self.shared.max_body_bytes as u64) {
                    return Err(immediate(ApiError::too_large(self.shared.max_body_bytes)));
                }
                if h.end_of_stream {
                    self.first_byte = Some(Instant::now());
                    self.phase = Phase::Answered;
                    return self.answer_without_body();
                }
                self.phase = Phase::RequestBody;
                Ok(Vec::new())
            }
            (Request::RequestBody(b), Phase::RequestBody) => {
                self.first_byte.get_or_insert_with(Instant::now);
                if self.body.len() + b.body.len() > self.shared.max_body_bytes {
                    return Err(immediate(ApiError::too_large(self.shared.max_body_bytes)));
                }
                if !self.reservation.grow(b.body.len()) {
                    return Err(immediate(ApiError::new(
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        "shed",
                        "the endpoint picker is buffering too many requests; retry later",
                    )));
                }
                self.body.extend_from_slice(&b.body);
                if !b.end_of_stream {
                    return Ok(Vec::new());
                }
                self.phase = Phase::Answered;
                self.answer(true).await
            }
            (Request::RequestTrailers(_), Phase::RequestBody) => {
                self.first_byte.get_or_insert_with(Instant::now);
                self.phase = Phase::Answered;
                let mut responses = self.answer(false).await?;
                responses.push(envoy::request_trailers());
                Ok(responses)
            }
            (Request::ResponseHeaders(h), Phase::Answered) => {
                let served = envoy::served_endpoint(self.metadata.as_ref());
                let set = self.account_served(served);
                self.phase = if h.end_of_stream { Phase::Done } else { Phase::ResponseBody };
                if h.end_of_stream {
                    self.guards.clear();
                }
                Ok(vec![envoy::response_headers(set)])
            }
            (Request::ResponseBody(b), Phase::ResponseBody) => {
                if b.end_of_stream {
                    self.phase = Phase::Done;
                    self.guards.clear();
                }
                Ok(vec![envoy::response_body(b.body, b.end_of_stream)])
            }
            (Request::ResponseTrailers(_), Phase::ResponseBody | Phase::Answered) => {
                self.phase = Phase::Done;
                self.guards.clear();
                Ok(vec![envoy::response_trailers()])
            }
            (Request::RequestHeaders(_), phase) => Err(out_of_order("request headers", phase)),
            (Request::RequestBody(_), phase) => Err(out_of_order("a request body chunk", phase)),
            (Request::RequestTrailers(_), phase) => Err(out_of_order("request trailers", phase)),
            (Request::ResponseHeaders(_), phase) => Err(out_of_order("response headers", phase)),
            (Request::ResponseBody(_), phase) => Err(out_of_order("a response body chunk", phase)),
            (Request::ResponseTrailers(_), phase) => Err(out_of_order("response trailers", phase)),
        }
    }

    fn subset(&self) -> Option<Vec<String>> {
        envoy::subset_hint(self.metadata.as_ref())
    }

    /// The body is complete: place the request, then answer the headers and re-emit the body
    /// (`ends` = the last chunk ends the stream; false when trailers follow).
    async fn answer(&mut self, ends: bool) -> Result<Vec<ProcessingResponse>, Stop> {
        let body = std::mem::take(&mut self.body);
        let placed = self.place(&body).await;
        let mut set = vec![envoy::set_header("content-length", &body.len().to_string())];
        let metadata = match (self.shared.mode, placed) {
            (Mode::EndpointPicker, Err(error)) => return Err(immediate(error)),
            (Mode::EndpointPicker, Ok(decision)) => {
                let destination = self.commit(&decision, &mut set);
                self.decision = Some(decision);
                Some(envoy::destination_metadata(&destination))
            }
            (Mode::Prefilter, placed) => {
                let hint = match &placed {
                    Ok(decision) => prefilter::hint(&decision.ranked, self.shared.load_band),
                    Err(_) => None,
                };
                let outcome = match (&placed, &hint) {
                    (Err(_), _) => "error",
                    (Ok(_), None) => "miss",
                    (Ok(_), Some(_)) => "hint",
                };
                metrics::counter!(m::PREFILTER, "outcome" => outcome).increment(1);
                if let Ok(decision) = &placed {
                    log_decision(decision, Mode::Prefilter);
                }
                self.decision = placed.ok();
                hint.map(|pods| envoy::subset_metadata(&pods))
            }
        };
        self.picked();
        let mut responses = vec![envoy::request_headers(set, metadata)];
        responses.extend(envoy::chunks(&body).map(|(chunk, last)| envoy::request_body(chunk.to_vec(), last && ends)));
        self.reservation.release();
        Ok(responses)
    }

    /// A request without a body (e.g. `GET /v1/models`): placed by load at once.
    fn answer_without_body(&mut self) -> Result<Vec<ProcessingResponse>, Stop> {
        if self.shared.mode == Mode::Prefilter {
            metrics::counter!(m::PREFILTER, "outcome" => "miss").increment(1);
            self.picked();
            return Ok(vec![envoy::request_headers(Vec::new(), None)]);
        }
        let ranked = load_only(&self.shared.router, self.subset()).map_err(|e| immediate(e.into()))?;
        let destination = ranked.iter().take(1 + self.shared.fallbacks).cloned().collect::<Vec<_>>().join(",");
        if let Some(pod) = ranked.first().and_then(|id| self.shared.router.fleet().get(id)) {
            self.guards = vec![self.shared.router.fleet().begin(&pod)];
        }
        self.picked();
        let set = vec![envoy::set_header(envoy::DESTINATION, &destination)];
        Ok(vec![envoy::request_headers(set, Some(envoy::destination_metadata(&destination)))])
    }

    fn picked(&self) {
        if let Some(start) = self.first_byte {
            metrics::histogram!(m::EXTPROC_PICK_SECONDS, "mode" => self.shared.mode.label())
                .record(start.elapsed().as_secs_f64());
        }
    }

    /// Parses the body and runs the pipeline (subset hint included).
    async fn place(&self, body: &[u8]) -> Result<Decision, ApiError> {
        let path = self.headers.get(":path").map(String::as_str).unwrap_or_default();
        let mut request = request::parse(endpoint(path, body), body)?;
        request.subset = self.subset();
        if request.subset.as_ref().is_some_and(Vec::is_empty) {
            return Err(RouteError::NoEligiblePods.into());
        }
        Ok(self.shared.router.route(&request).await?)
    }

    /// Counts the request in flight on the primary pick, names it and its fallbacks, and the
    /// prefill pod in P/D mode. Returns the destination value.
    fn commit(
        &mut self,
        decision: &Decision,
        set: &mut Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption>,
    ) -> String {
        let destination = decision
            .ranked
            .iter()
            .take(1 + self.shared.fallbacks)
            .map(|c| c.pod.as_str())
            .collect::<Vec<_>>()
            .join(",");
        self.guards = self.shared.router.commit(decision, 0).unwrap_or_default();
        self.attempt = Some(0);
        set.push(envoy::set_header(envoy::DESTINATION, &destination));
        if let Some(prefill) = &decision.prefill {
            set.push(envoy::set_header(envoy::PREFILLER, &prefill.pod));
        }
        log_decision(decision, self.shared.mode);
        destination
    }

    /// The gateway names the pod that served: count the request in flight there (it may be a
    /// fallback, or in pre-filter mode whatever the picker behind us chose), and tell the client
    /// where it went and why.
    fn account_served(
        &mut self,
        served: Option<String>,
    ) -> Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption> {
        let Some(decision) = &self.decision else { return Vec::new() };
        let position = served.as_deref().and_then(|id| decision.ranked.iter().position(|c| c.pod == id));
        match (position, self.attempt) {
            (Some(now), Some(before)) if now != before => {
                if let Some(pod) = decision.ranked[now].handle.as_ref() {
                    // Keep the prefill pod's guard (P/D); move the decode pod's.
                    if !self.guards.is_empty() {
                        self.guards[0] = self.shared.router.fleet().begin(pod);
                    }
                }
                self.attempt = Some(now);
            }
            (Some(now), None) => {
                self.guards = self.shared.router.commit(decision, now).unwrap_or_default();
                self.attempt = Some(now);
            }
            _ => {}
        }
        match self.attempt {
            Some(attempt) => {
                decision.headers(attempt).into_iter().map(|(name, value)| envoy::set_header(name, &value)).collect()
            }
            None => Vec::new(),
        }
    }
}

/// Pods by load alone (no prompt to score), best first, within the subset if any.
fn load_only(router: &Router, subset: Option<Vec<String>>) -> Result<Vec<String>, RouteError> {
    let fleet = router.fleet();
    let pods: Vec<_> = match &subset {
        None => fleet.snapshot(),
        Some(allowed) => allowed.iter().filter_map(|id| fleet.get(id)).collect(),
    };
    if pods.is_empty() {
        return Err(if subset.is_some() && !fleet.is_empty() {
            RouteError::NoEligiblePods
        } else {
            RouteError::NoPods
        });
    }
    let now = Instant::now();
    let candidates: Vec<Candidate> = pods
        .iter()
        .map(|pod| {
            let load = pod.load(now, fleet.stale_after());
            Candidate {
                matched_blocks: 0,
                speculative_blocks: 0,
                running: load.load - load.waiting.unwrap_or(0.0),
                waiting: load.waiting.unwrap_or(0.0),
                kv_usage: load.kv_usage,
                kv_blocks: load.kv_blocks,
                reachable: load.reachable,
                last_picked: pod.last_picked(),
                rendezvous: crate::rendezvous::weight(0, &pod.id),
            }
        })
        .collect();
    let weights = router.settings().weights;
    Ok(cost::rank(&candidates, 0, &weights, Policy::LoadOnly).into_iter().map(|r| pods[r.index].id.clone()).collect())
}

/// The per-request decision line (as the proxy's, without an upstream status).
fn log_decision(decision: &Decision, mode: Mode) {
    let chosen = decision.ranked.first();
    tracing::info!(
        target: "kvindex_router::decision",
        request_id = decision.id,
        door = "ext_proc",
        mode = mode.label(),
        model = %decision.model,
        policy = decision.policy,
        prompt_tokens = decision.prompt_tokens,
        total_blocks = decision.total_blocks,
        score = decision.score.label(),
        pod = chosen.map(|c| c.pod.as_str()),
        matched_blocks = chosen.map(|c| c.matched_blocks),
        cached_blocks = chosen.map(|c| c.cached_blocks),
        prefill = %decision.prefill_summary(),
        candidates = %decision.candidates_summary(),
        route_us = decision.timings.total_us,
        "routed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_comes_from_the_path_or_the_body() {
        assert_eq!(endpoint("/v1/chat/completions?x=1", b"{}"), Endpoint::ChatCompletions);
        assert_eq!(endpoint("/v1/completions", br#"{"messages": []}"#), Endpoint::Completions);
        assert_eq!(endpoint("/custom", br#"{"messages": []}"#), Endpoint::ChatCompletions);
        assert_eq!(endpoint("/custom", br#"{"prompt": "x"}"#), Endpoint::Completions);
    }
}
