//! Envoy's ext_proc messages as the endpoint picker protocol uses them, in one place: reading
//! request headers and the gateway's subset hint out of `metadata_context`, and building the
//! answers (destination headers and `envoy.lb` metadata, the body re-emitted in chunks,
//! immediate errors). The protocol's names live here so the state machine reads as the
//! protocol does (`docs/reference/gie-epp.md`; the GIE proposal and llm-d's handlers win
//! where they disagree).

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse,
    ImmediateResponse, ProcessingResponse, ProtocolConfiguration, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use crate::error::ApiError;

/// The header (and `envoy.lb` metadata key) naming the destination. The header names the
/// primary pod alone: an `ORIGINAL_DST` cluster (llm-d's chart) reads it as one address, and a
/// list there is a 503 `no healthy upstream` (seen with Envoy 1.40). The metadata names the
/// primary then its fallbacks, comma-separated: `override_host` (and Istio's inference
/// clusters) read it first and walk it on retries. Both start with the same pod.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Where the destination metadata goes (read by `override_host` load balancing).
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The gateway's (or a pre-filter's) restriction of the candidates.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// In the response phase: the endpoint that actually served.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// llm-d's routing sidecar on a decode pod reads the prefill pod from this header.
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Envoy's limit for one streamed body message (llm-d's chunking).
pub const MAX_CHUNK: usize = 62_000;

/// Request headers by lower-case name; Envoy sends `raw_value` (newer) or `value` (older).
pub fn headers(map: Option<&HeaderMap>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for h in map.map(|m| m.headers.as_slice()).unwrap_or_default() {
        let value =
            if h.raw_value.is_empty() { h.value.clone() } else { String::from_utf8_lossy(&h.raw_value).into_owned() };
        out.insert(h.key.to_ascii_lowercase(), value);
    }
    out
}

/// The subset hint: `None` when absent, `Some(list)` when present (possibly empty: then
/// nothing is eligible). Accepts llm-d's list of strings and LWEPP's comma-separated string.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let value = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?.fields.get(SUBSET_KEY)?;
    let mut pods = Vec::new();
    let mut add = |text: &str| pods.extend(text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from));
    match &value.kind {
        Some(Kind::ListValue(list)) => {
            for item in &list.values {
                if let Some(Kind::StringValue(text)) = &item.kind {
                    add(text);
                }
            }
        }
        Some(Kind::StringValue(text)) => add(text),
        _ => {}
    }
    Some(pods)
}

/// The served endpoint the gateway reports in the response phase.
pub fn served_endpoint(metadata: Option<&Metadata>) -> Option<String> {
    let value = metadata?.filter_metadata.get(LB_NAMESPACE)?.fields.get(SERVED_KEY)?;
    match &value.kind {
        Some(Kind::StringValue(text)) => text.split(',').next().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()),
        _ => None,
    }
}

fn string(text: impl Into<String>) -> Value {
    Value { kind: Some(Kind::StringValue(text.into())) }
}

fn namespace(name: &str, key: &str, value: Value) -> Struct {
    let inner = Struct { fields: HashMap::from([(key.to_string(), value)]) };
    Struct { fields: HashMap::from([(name.to_string(), Value { kind: Some(Kind::StructValue(inner)) })]) }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": "<primary>,<fallback>,…"}}`.
pub fn destination_metadata(pods: &[String]) -> Struct {
    namespace(LB_NAMESPACE, DESTINATION, string(pods.join(",")))
}

/// How the gateway's filter sends each body (`ProcessingMode`), from the `protocol_config` Envoy
/// puts in a stream's first message; without one (older Envoys, the Python peer),
/// `FULL_DUPLEX_STREAMED` as GIE specifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyModes {
    pub request: BodySendMode,
    pub response: BodySendMode,
}

impl Default for BodyModes {
    fn default() -> BodyModes {
        BodyModes { request: BodySendMode::FullDuplexStreamed, response: BodySendMode::FullDuplexStreamed }
    }
}

impl BodyModes {
    pub fn from_protocol(config: Option<&ProtocolConfiguration>) -> BodyModes {
        let Some(config) = config else { return BodyModes::default() };
        let mode = |raw: i32| BodySendMode::try_from(raw).unwrap_or(BodySendMode::None);
        BodyModes { request: mode(config.request_body_mode), response: mode(config.response_body_mode) }
    }
}

/// `{"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": [pods]}}`.
pub fn subset_metadata(pods: &[String]) -> Struct {
    let list = ListValue { values: pods.iter().map(|p| string(p.as_str())).collect() };
    namespace(SUBSET_NAMESPACE, SUBSET_KEY, Value { kind: Some(Kind::ListValue(list)) })
}

/// A header set in `raw_value` only (Envoy rejects an option that sets both).
pub fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue { key: key.to_string(), value: String::new(), raw_value: value.as_bytes().to_vec() }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn respond(response: processing_response::Response, metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse { response: Some(response), dynamic_metadata: metadata, ..Default::default() }
}

/// Headers to set, with the route cache cleared only when the destination header is among them:
/// it is the one header the pick sets that a route may match on (GIE asks for the clear with
/// it). Envoy ignores a clear that comes without a header mutation, and counts it
/// (`clear_route_cache_ignored`); a clear for any other header costs a route lookup for nothing.
fn mutation(set: Vec<HeaderValueOption>) -> CommonResponse {
    let clear_route_cache = set.iter().any(|o| o.header.as_ref().is_some_and(|h| h.key == DESTINATION));
    CommonResponse {
        header_mutation: (!set.is_empty()).then(|| HeaderMutation { set_headers: set, remove_headers: Vec::new() }),
        clear_route_cache,
        ..Default::default()
    }
}

/// The answer to `request_headers`: headers to set (the route cache cleared with the
/// destination), and the dynamic metadata.
pub fn request_headers(set: Vec<HeaderValueOption>, metadata: Option<Struct>) -> ProcessingResponse {
    let common = mutation(set);
    respond(processing_response::Response::RequestHeaders(HeadersResponse { response: Some(common) }), metadata)
}

/// `BUFFERED` request bodies: the headers go on unchanged (Envoy holds them, and sends the body
/// only once this answer came); the pick rides on the body's answer instead.
pub fn request_headers_continue() -> ProcessingResponse {
    respond(processing_response::Response::RequestHeaders(HeadersResponse { response: None }), None)
}

/// The answer to a `BUFFERED` request body: the pick as header mutations (Envoy still holds the
/// headers, so they take effect; the route cache cleared with the destination), the metadata;
/// the body unchanged.
pub fn request_body_buffered(set: Vec<HeaderValueOption>, metadata: Option<Struct>) -> ProcessingResponse {
    let common = mutation(set);
    respond(processing_response::Response::RequestBody(BodyResponse { response: Some(common) }), metadata)
}

/// A response body chunk left as it is (`STREAMED` and `BUFFERED` modes, where a streamed
/// mutation is not allowed).
pub fn response_body_unchanged() -> ProcessingResponse {
    respond(processing_response::Response::ResponseBody(BodyResponse { response: None }), None)
}

/// The answer to `response_headers`, optionally adding headers to the client's response.
pub fn response_headers(set: Vec<HeaderValueOption>) -> ProcessingResponse {
    let common = mutation(set);
    respond(processing_response::Response::ResponseHeaders(HeadersResponse { response: Some(common) }), None)
}

fn streamed(body: Vec<u8>, end_of_stream: bool) -> BodyResponse {
    BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    }
}

/// One chunk of the request body re-emitted (`FULL_DUPLEX_STREAMED`).
pub fn request_body(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    respond(processing_response::Response::RequestBody(streamed(body, end_of_stream)), None)
}

/// One chunk of the response body echoed as it came.
pub fn response_body(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    respond(processing_response::Response::ResponseBody(streamed(body, end_of_stream)), None)
}

pub fn request_trailers() -> ProcessingResponse {
    respond(processing_response::Response::RequestTrailers(TrailersResponse::default()), None)
}

pub fn response_trailers() -> ProcessingResponse {
    respond(processing_response::Response::ResponseTrailers(TrailersResponse::default()), None)
}

/// `body` split into chunks of at most [`MAX_CHUNK`] bytes (an empty body is one empty chunk);
/// the flag says whether the chunk is the last.
pub fn chunks(body: &[u8]) -> impl Iterator<Item = (&[u8], bool)> {
    let count = body.len().div_ceil(MAX_CHUNK).max(1);
    (0..count).map(move |i| {
        let start = i * MAX_CHUNK;
        (&body[start.min(body.len())..((i + 1) * MAX_CHUNK).min(body.len())], i + 1 == count)
    })
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::try_from(i32::from(status)).unwrap_or(StatusCode::InternalServerError)
}

/// The endpoint picker's answer to a request it refuses: the gateway sends `error` to the
/// client itself, counted as the proxy counts its errors.
pub fn refusal(error: ApiError) -> ProcessingResponse {
    let error = error.counted();
    immediate(error.status.as_u16(), error.code, &error.message)
}

/// An answer the gateway sends to the client itself (the request goes nowhere): an
/// OpenAI-shaped JSON error, as the proxy would answer.
pub fn immediate(status: u16, code: &str, message: &str) -> ProcessingResponse {
    let kind = if status >= 500 { "server_error" } else { "invalid_request_error" };
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let response = ImmediateResponse {
        status: Some(HttpStatus { code: status_code(status) as i32 }),
        headers: Some(HeaderMutation {
            set_headers: vec![set_header("content-type", "application/json")],
            remove_headers: Vec::new(),
        }),
        body: body.to_string().into_bytes(),
        details: format!("kvindex_router_{code}"),
        ..Default::default()
    };
    respond(processing_response::Response::ImmediateResponse(response), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_an_openai_error_named_by_its_code() {
        let error = ApiError::from(crate::error::RouteError::NoPods);
        let answer = format!("{:?}", refusal(error));
        assert!(answer.contains("kvindex_router_no_pods"), "{answer}");
    }

    fn hint(value: Value) -> Metadata {
        Metadata {
            filter_metadata: HashMap::from([(
                SUBSET_NAMESPACE.to_string(),
                Struct { fields: HashMap::from([(SUBSET_KEY.to_string(), value)]) },
            )]),
            ..Default::default()
        }
    }

    #[test]
    fn the_subset_hint_is_a_list_or_a_comma_separated_string_and_absence_differs_from_empty() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue { values: vec![string("10.0.0.1:80"), string("10.0.0.2:80")] })),
        };
        assert_eq!(subset_hint(Some(&hint(list))).unwrap(), ["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(subset_hint(Some(&hint(string("a:1, b:2")))).unwrap(), ["a:1", "b:2"]);
        let empty = Value { kind: Some(Kind::ListValue(ListValue::default())) };
        assert_eq!(subset_hint(Some(&hint(empty))), Some(vec![]));
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        assert_eq!(subset_hint(None), None);
    }

    #[test]
    fn chunks_are_at_most_62000_bytes_and_only_the_last_ends_the_stream() {
        let body = vec![7u8; 2 * MAX_CHUNK + 5];
        let parts: Vec<_> = chunks(&body).collect();
        assert_eq!(parts.iter().map(|(c, _)| c.len()).collect::<Vec<_>>(), [MAX_CHUNK, MAX_CHUNK, 5]);
        assert_eq!(parts.iter().map(|(_, last)| *last).collect::<Vec<_>>(), [false, false, true]);
        assert_eq!(chunks(&body[..MAX_CHUNK]).count(), 1);
        assert_eq!(chunks(&[]).collect::<Vec<_>>(), [(&[][..], true)]);
    }

    #[test]
    fn body_modes_come_from_the_first_message_and_default_to_full_duplex() {
        assert_eq!(BodyModes::from_protocol(None), BodyModes::default());
        assert_eq!(BodyModes::default().request, BodySendMode::FullDuplexStreamed);
        let stated = ProtocolConfiguration {
            request_body_mode: BodySendMode::Buffered as i32,
            response_body_mode: BodySendMode::None as i32,
            ..Default::default()
        };
        let modes = BodyModes::from_protocol(Some(&stated));
        assert_eq!((modes.request, modes.response), (BodySendMode::Buffered, BodySendMode::None));
        let unknown = ProtocolConfiguration { request_body_mode: 99, ..Default::default() };
        assert_eq!(
            BodyModes::from_protocol(Some(&unknown)).request,
            BodySendMode::None,
            "an unknown mode sends no body"
        );
    }

    #[test]
    fn the_metadata_names_primary_then_fallbacks() {
        let metadata = destination_metadata(&["a:1".to_string(), "b:2".to_string()]);
        let Some(Kind::StructValue(inner)) = &metadata.fields[LB_NAMESPACE].kind else { panic!("a struct") };
        assert_eq!(inner.fields[DESTINATION].kind, Some(Kind::StringValue("a:1,b:2".into())));
    }

    fn common(response: &ProcessingResponse) -> &CommonResponse {
        let common = match &response.response {
            Some(processing_response::Response::RequestHeaders(h)) => h.response.as_ref(),
            Some(processing_response::Response::RequestBody(b)) => b.response.as_ref(),
            Some(processing_response::Response::ResponseHeaders(h)) => h.response.as_ref(),
            other => panic!("not a headers or body answer: {other:?}"),
        };
        common.expect("a common response")
    }

    #[test]
    fn the_route_cache_is_cleared_with_the_destination_only_and_never_without_a_mutation() {
        let destination = || vec![set_header(DESTINATION, "10.0.0.1:8000"), set_header("content-length", "9")];
        for answer in [request_headers(destination(), None), request_body_buffered(destination(), None)] {
            let common = common(&answer);
            assert!(common.clear_route_cache && common.header_mutation.is_some());
        }
        let length = || vec![set_header("content-length", "9")];
        for answer in
            [request_headers(length(), None), request_body_buffered(length(), None), response_headers(length())]
        {
            let common = common(&answer);
            assert!(!common.clear_route_cache && common.header_mutation.is_some());
        }
        for answer in
            [request_headers(Vec::new(), None), request_body_buffered(Vec::new(), None), response_headers(Vec::new())]
        {
            let common = common(&answer);
            assert!(!common.clear_route_cache && common.header_mutation.is_none(), "{common:?}");
        }
    }

    #[test]
    fn headers_are_set_in_raw_value_only() {
        let option = set_header(DESTINATION, "10.0.0.1:8000");
        let header = option.header.unwrap();
        assert!(header.value.is_empty());
        assert_eq!(header.raw_value, b"10.0.0.1:8000");
    }
}
