//! The gRPC status of an oversized request. tonic refuses a message over
//! `max_decoding_message_size` with `OUT_OF_RANGE`, but gRPC specifies `RESOURCE_EXHAUSTED` for
//! a message larger than the receiver accepts (and clients retry or alert on it as such). This
//! layer rewrites that one answer, before any body is read, and counts it
//! (`kvindex_grpc_rejected_total{reason="too_large"}`).

use tonic::codegen::http::{HeaderValue, Response};

use crate::telemetry as m;

/// What tonic's decoder says of a message over the limit (percent-encoded in `grpc-message`).
const TOO_LARGE: &str = "decoded%20message%20length%20too%20large";

/// `OUT_OF_RANGE` and `RESOURCE_EXHAUSTED` as `grpc-status` values.
const OUT_OF_RANGE: &str = "11";
const RESOURCE_EXHAUSTED: &str = "8";

/// The layer for `tonic::transport::Server::layer`.
pub fn layer<B>() -> tower::util::MapResponseLayer<fn(Response<B>) -> Response<B>> {
    tower::util::MapResponseLayer::new(resource_exhausted::<B> as fn(Response<B>) -> Response<B>)
}

/// Rewrites tonic's "decoded message length too large" refusal (a trailers-only answer: its
/// status is in the headers) to `RESOURCE_EXHAUSTED`; every other answer passes unchanged.
fn resource_exhausted<B>(mut response: Response<B>) -> Response<B> {
    let headers = response.headers();
    let too_large = headers.get("grpc-status").is_some_and(|s| s == OUT_OF_RANGE)
        && headers.get("grpc-message").and_then(|m| m.to_str().ok()).is_some_and(|m| m.contains(TOO_LARGE));
    if too_large {
        response.headers_mut().insert("grpc-status", HeaderValue::from_static(RESOURCE_EXHAUSTED));
        metrics::counter!(m::GRPC_REJECTED, "reason" => "too_large").increment(1);
    }
    response
}
