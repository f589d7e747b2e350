//! One ext_proc stream is one HTTP request through the gateway. Envoy sends, in order, the
//! request headers, the request body, maybe request trailers; then the response headers, body
//! chunks and maybe trailers (an HTTP/1 response may end on a body chunk with `end_of_stream`
//! instead). How the bodies come depends on the filter's processing mode, which Envoy states in
//! the stream's first message (`protocol_config`):
//! - `FULL_DUPLEX_STREAMED` (GIE's mode, the default when unstated): body chunks arrive without
//!   waiting for us; we buffer the request body (bounded), run the router's pipeline, answer the
//!   headers with the pick, re-emit the body, and echo the response as it comes. Envoy cannot
//!   fail open in this mode (a dead picker is a 500, a frozen one hangs the request).
//! - `BUFFERED` request body: Envoy holds the headers until we answer them (unchanged), then
//!   sends the whole body in one message; the pick rides on the body's answer as header
//!   mutations. Envoy's `message_timeout` and `failure_mode_allow` apply, so a dead or frozen
//!   picker costs at most one timeout: the mode the shipped Envoy configs use.
//! - `NONE` request body: nothing to read the prompt from; placed by load at the headers.
//!
//! Response bodies are echoed in full-duplex mode, acknowledged unchanged in the others, and not
//! seen at all with `NONE`.
//!
//! The response may start before the request reached us in full: Envoy (or a filter beside us)
//! answers a request itself with a local reply (a body past `request_body_buffer_limit`, headers
//! past their limit, a timeout), and the filter sends that reply's response headers, even as the
//! stream's first message. That is the protocol, not a break of it: the request is dropped
//! unplaced, the response answered like any other, and the stream counted as the gateway's reply.
//!
//! A message out of order (a second request or response head, a request message once the
//! response started), a body past the limit, or a request body mode we cannot pick in
//! (`STREAMED`, `BUFFERED_PARTIAL`: headers would leave before the prompt is known) ends this
//! stream only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, ProcessingRequest, ProcessingResponse,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::envoy::{self, BodyModes};
use super::prefilter;
use crate::config::ext_proc::Mode;
use crate::doors::budget::{Budget, Reservation};
use crate::error::{ApiError, RouteError};
use crate::metrics as m;
use crate::place::decision::{Decision, PodChoice};
use crate::place::log::{self, Door};
use crate::place::request::{self, Endpoint};
use crate::place::Router;
use crate::pods::fleet::InFlight;
use crate::upstream;

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
    /// Before any response message came.
    fn before_response(self) -> bool {
        matches!(self, Phase::RequestHeaders | Phase::RequestBody | Phase::Answered)
    }

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
    /// The filter's body modes, from the first message (`None` until it came).
    modes: Option<BodyModes>,
    headers: HashMap<String, String>,
    metadata: Option<Metadata>,
    body: Vec<u8>,
    reservation: Reservation,
    first_byte: Option<Instant>,
    /// The gateway answered the request itself before it reached us in full.
    gateway_replied: bool,
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
        modes: None,
        headers: HashMap::new(),
        metadata: None,
        body: Vec::new(),
        reservation,
        first_byte: None,
        gateway_replied: false,
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
                    let error = ApiError::request_incomplete(state.shared.request_timeout);
                    let _ = out.send(Ok(envoy::refusal(error))).await;
                    break "timeout";
                }
            }
        } else {
            next.await
        };
        let message = match received {
            Ok(Some(message)) => message,
            Ok(None) | Err(_) => break state.closed_outcome(),
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

/// The buffer bound over all streams is full: 429.
fn shed() -> Stop {
    immediate(ApiError::shed())
}

/// Answered by the gateway with `error` (counted).
fn immediate(error: ApiError) -> Stop {
    Stop::Immediate(Box::new(envoy::refusal(error)))
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
    /// How a stream the gateway closes now ended: `completed` after everything it was to carry
    /// (the response's end, or the request's answer when the filter sends us no response body:
    /// `NONE`, Envoy closes the stream when the HTTP request ends), `gateway_reply` likewise when
    /// the gateway answered the request itself, else `closed`.
    fn closed_outcome(&self) -> &'static str {
        let no_response_body = self.modes.is_some_and(|m| m.response == BodySendMode::None);
        let ran_to_its_end = match self.phase {
            Phase::Done => true,
            Phase::Answered | Phase::ResponseBody => no_response_body,
            Phase::RequestHeaders | Phase::RequestBody => false,
        };
        match (ran_to_its_end, self.gateway_replied) {
            (false, _) => "closed",
            (true, false) => "completed",
            (true, true) => "gateway_reply",
        }
    }

    /// A response message came. One that comes while the request is still coming is the
    /// gateway's own reply to it: what was buffered of the request goes, and nothing was placed.
    fn response_starts(&mut self) {
        if matches!(self.phase, Phase::RequestHeaders | Phase::RequestBody) {
            tracing::debug!(phase = self.phase.label(), "the gateway answered the request itself");
            self.gateway_replied = true;
            self.body = Vec::new();
            self.reservation.release();
            self.phase = Phase::Answered;
        }
    }

    async fn handle(&mut self, message: ProcessingRequest) -> Result<Vec<ProcessingResponse>, Stop> {
        let modes = match self.modes {
            Some(modes) => modes,
            None => {
                let modes = BodyModes::from_protocol(message.protocol_config.as_ref());
                tracing::debug!(
                    request_body = modes.request.as_str_name(),
                    response_body = modes.response.as_str_name(),
                    stated = message.protocol_config.is_some(),
                    "ext_proc stream body modes"
                );
                *self.modes.insert(modes)
            }
        };
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
                // With the request body not sent at all, the headers are all there is.
                if h.end_of_stream || modes.request == BodySendMode::None {
                    self.first_byte = Some(Instant::now());
                    self.phase = Phase::Answered;
                    return self.answer_without_body();
                }
                self.phase = Phase::RequestBody;
                match modes.request {
                    BodySendMode::FullDuplexStreamed => Ok(Vec::new()),
                    BodySendMode::Buffered => Ok(vec![envoy::request_headers_continue()]),
                    other => Err(Stop::Protocol {
                        reason: "unsupported_mode",
                        message: format!(
                            "request_body_mode {} is not supported: the pick needs the whole body before the \
                             headers go on (use BUFFERED or FULL_DUPLEX_STREAMED)",
                            other.as_str_name()
                        ),
                    }),
                }
            }
            (Request::RequestBody(b), Phase::RequestBody) if modes.request == BodySendMode::Buffered => {
                // The whole body in one message (end_of_stream is false only when trailers follow).
                self.first_byte = Some(Instant::now());
                if b.body.len() > self.shared.max_body_bytes {
                    return Err(immediate(ApiError::too_large(self.shared.max_body_bytes)));
                }
                self.phase = Phase::Answered;
                self.body = b.body;
                self.answer_buffered().await
            }
            (Request::RequestTrailers(_), Phase::Answered) if modes.request == BodySendMode::Buffered => {
                Ok(vec![envoy::request_trailers()])
            }
            (Request::RequestBody(b), Phase::RequestBody) => {
                self.first_byte.get_or_insert_with(Instant::now);
                if self.body.len() + b.body.len() > self.shared.max_body_bytes {
                    return Err(immediate(ApiError::too_large(self.shared.max_body_bytes)));
                }
                if !self.reservation.grow(b.body.len()) {
                    return Err(shed());
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
            (Request::ResponseHeaders(h), phase) if phase.before_response() => {
                self.response_starts();
                let served = envoy::served_endpoint(self.metadata.as_ref());
                let set = self.account_served(served);
                self.phase = if h.end_of_stream { Phase::Done } else { Phase::ResponseBody };
                if h.end_of_stream {
                    self.guards.clear();
                } else if modes.response == BodySendMode::None {
                    // No body will be shown to us: the head is the last sign of the prefill.
                    self.guards.iter_mut().for_each(InFlight::prefilled);
                }
                Ok(vec![envoy::response_headers(set)])
            }
            // In `Answered` (or a request phase) when the filter skips the response headers.
            (Request::ResponseBody(b), phase) if phase != Phase::Done => {
                self.response_starts();
                if !b.body.is_empty() {
                    // The pod's first bytes: the prompt is computed (see pods::fleet).
                    self.guards.iter_mut().for_each(InFlight::prefilled);
                }
                if b.end_of_stream {
                    self.phase = Phase::Done;
                    self.guards.clear();
                } else {
                    self.phase = Phase::ResponseBody;
                }
                Ok(vec![match modes.response {
                    BodySendMode::FullDuplexStreamed => envoy::response_body(b.body, b.end_of_stream),
                    _ => envoy::response_body_unchanged(),
                }])
            }
            (Request::ResponseTrailers(_), phase) if phase != Phase::Done => {
                self.response_starts();
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

    /// The body is complete (`FULL_DUPLEX_STREAMED`): place the request, then answer the headers
    /// and re-emit the body (`ends` = the last chunk ends the stream; false when trailers follow).
    async fn answer(&mut self, ends: bool) -> Result<Vec<ProcessingResponse>, Stop> {
        let body = std::mem::take(&mut self.body);
        let mut set = vec![envoy::set_header("content-length", &body.len().to_string())];
        let metadata = self.decide(&body, &mut set).await?;
        let mut responses = vec![envoy::request_headers(set, metadata)];
        responses.extend(envoy::chunks(&body).map(|(chunk, last)| envoy::request_body(chunk.to_vec(), last && ends)));
        self.reservation.release();
        Ok(responses)
    }

    /// The body came whole (`BUFFERED`): the pick goes on its answer, the body unchanged.
    async fn answer_buffered(&mut self) -> Result<Vec<ProcessingResponse>, Stop> {
        let body = std::mem::take(&mut self.body);
        if !self.reservation.grow(body.len()) {
            return Err(shed());
        }
        let mut set = Vec::new();
        let metadata = self.decide(&body, &mut set).await?;
        self.reservation.release();
        Ok(vec![envoy::request_body_buffered(set, metadata)])
    }

    /// Places the request and returns the metadata to answer with, adding the destination
    /// headers to `set` (endpoint-picker) or naming the hint (prefilter).
    async fn decide(
        &mut self,
        body: &[u8],
        set: &mut Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption>,
    ) -> Result<Option<envoy_types::pb::google::protobuf::Struct>, Stop> {
        let placed = self.place(body).await;
        let metadata = match (self.shared.mode, placed) {
            (Mode::EndpointPicker, Err(error)) => return Err(immediate(error)),
            (Mode::EndpointPicker, Ok(decision)) => {
                let destination = self.commit(&decision, set);
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
                    log::routed(decision, Door::ExtProc { mode: Mode::Prefilter });
                }
                self.decision = placed.ok();
                hint.map(|pods| envoy::subset_metadata(&pods))
            }
        };
        self.picked();
        Ok(metadata)
    }

    /// A request without a body (e.g. `GET /v1/models`): placed by load at once.
    fn answer_without_body(&mut self) -> Result<Vec<ProcessingResponse>, Stop> {
        if self.shared.mode == Mode::Prefilter {
            metrics::counter!(m::PREFILTER, "outcome" => "miss").increment(1);
            self.picked();
            return Ok(vec![envoy::request_headers(Vec::new(), None)]);
        }
        let router = &self.shared.router;
        let ranked = router.rank_by_load(self.subset().as_deref()).map_err(|e| immediate(e.into()))?;
        if let Some(pod) = ranked.first() {
            self.guards = vec![router.commit_by_load(pod)];
        }
        let mut destination: Vec<String> = Vec::new();
        for pod in &ranked {
            if destination.len() > self.shared.fallbacks {
                break;
            }
            if !destination.contains(&pod.spec_id) {
                destination.push(pod.spec_id.clone());
            }
        }
        self.picked();
        let set =
            destination.first().map(|primary| envoy::set_header(envoy::DESTINATION, primary)).into_iter().collect();
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

    /// Counts the request in flight on the primary pick, names it (header) and it with its
    /// fallbacks (metadata), and the prefill pod in P/D mode. Returns primary and fallbacks.
    fn commit(
        &mut self,
        decision: &Decision,
        set: &mut Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption>,
    ) -> Vec<String> {
        let destination = destinations(&decision.ranked, 1 + self.shared.fallbacks);
        self.guards = self.shared.router.commit(decision, 0).unwrap_or_default();
        self.attempt = Some(0);
        if let Some(primary) = destination.first() {
            set.push(envoy::set_header(envoy::DESTINATION, primary));
        }
        if let Some(rank) = decision.ranked.first().and_then(PodChoice::dp_rank) {
            set.push(envoy::set_header(upstream::DP_RANK_HEADER, &rank.to_string()));
        }
        if let Some(prefill) = &decision.prefill {
            set.push(envoy::set_header(envoy::PREFILLER, &prefill.pod));
        }
        log::routed(decision, Door::ExtProc { mode: self.shared.mode });
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
        // The endpoint that served, and the rank the request named there (the primary's).
        let rank = decision.ranked.first().and_then(PodChoice::dp_rank);
        let position = served
            .as_deref()
            .and_then(|id| decision.ranked.iter().position(|c| c.endpoint() == id && c.dp_rank() == rank));
        match (position, self.attempt) {
            (Some(now), Some(before)) if now != before => {
                if let Some(pod) = decision.ranked[now].handle.as_ref() {
                    // Keep the prefill pod's guard (P/D); move the decode pod's.
                    if !self.guards.is_empty() {
                        self.guards[0] = self.shared.router.commit_by_load(pod);
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

/// The endpoints to name, primary first, at most `count`: each choice's endpoint once, and only
/// choices that name the primary's data-parallel rank (none, or the same), since one request
/// carries one rank header whichever endpoint the gateway ends up using.
fn destinations(ranked: &[PodChoice], count: usize) -> Vec<String> {
    let rank = ranked.first().and_then(PodChoice::dp_rank);
    let mut endpoints: Vec<String> = Vec::with_capacity(count);
    for choice in ranked.iter().filter(|c| c.dp_rank() == rank) {
        if endpoints.len() >= count {
            break;
        }
        if !endpoints.iter().any(|e| e == choice.endpoint()) {
            endpoints.push(choice.endpoint().to_string());
        }
    }
    endpoints
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_destination_is_an_endpoint_and_fallbacks_are_those_the_one_rank_header_fits() {
        use crate::pods::fleet::{Fleet, Source};
        use crate::pods::spec::{DpRouting, PodSpec, Role};
        let fleet = Fleet::new(std::time::Duration::from_secs(2));
        let sglang = |id: &str| PodSpec {
            dp_size: 2,
            dp_routing: DpRouting::Router,
            ..PodSpec::new(id, format!("http://{id}"), Role::Both)
        };
        fleet.upsert(&sglang("a:30000"), Source::Static).unwrap();
        fleet.upsert(&sglang("b:30000"), Source::Static).unwrap();
        fleet.upsert(&PodSpec::new("v:8000", "http://v:8000", Role::Both), Source::Static).unwrap();
        let choice = |id: &str| PodChoice { handle: fleet.get(id), ..PodChoice::example(id, 0, 0.0) };
        let ranked: Vec<PodChoice> =
            ["a:30001", "a:30000", "v:8000", "b:30000", "b:30001"].into_iter().map(choice).collect();
        assert_eq!(ranked[0].dp_rank(), Some(1));
        assert_eq!(destinations(&ranked, 3), ["a:30000", "b:30000"], "rank 1 of each: the header names rank 1");
        assert_eq!(destinations(&ranked, 1), ["a:30000"]);
        let unranked: Vec<PodChoice> = ["v:8000", "a:30000", "b:30001"].into_iter().map(choice).collect();
        assert_eq!(destinations(&unranked, 3), ["v:8000"], "no rank header: no rank the router names");
    }

    #[test]
    fn the_endpoint_comes_from_the_path_or_the_body() {
        assert_eq!(endpoint("/v1/chat/completions?x=1", b"{}"), Endpoint::ChatCompletions);
        assert_eq!(endpoint("/v1/completions", br#"{"messages": []}"#), Endpoint::Completions);
        assert_eq!(endpoint("/custom", br#"{"messages": []}"#), Endpoint::ChatCompletions);
        assert_eq!(endpoint("/custom", br#"{"prompt": "x"}"#), Endpoint::Completions);
    }
}
