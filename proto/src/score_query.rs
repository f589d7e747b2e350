//! ScoreTokens' request encoded from token ids the caller keeps. A router sends one prompt to an
//! indexer (or, hedging, to several) and keeps the ids for its decision: with the generated
//! message, each attempt first copies the ids into a message of its own, and prost then writes
//! their varints one byte at a time into the transport's buffer (~40 µs for 8.8k ids, a few
//! percent of a router's turn). A [`ScoreQuery`] shares the ids (`Arc`), writes their varints
//! a chunk at a time, and carries every other field in the generated message, so a field added
//! to the contract travels without a change here. The bytes are a valid `ScoreTokensRequest`:
//! the ids go last, as a packed field of their own, which protobuf concatenates with any ids
//! in the generated message (none, as the router builds it).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, DecodeContext, WireType};
use prost::{DecodeError, Message};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, Body, BoxFuture, GrpcMethod, Service, StdError};

use crate::kvindex::v1::{ScoreTokensRequest, ScoreTokensResponse};

/// `ScoreTokensRequest.token_ids`.
const TOKEN_IDS_TAG: u32 = 2;

/// Ids whose varints are written to one stack buffer before it is copied to the transport's.
const CHUNK_IDS: usize = 256;

/// A `ScoreTokensRequest` whose token ids are shared with the caller, not owned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreQuery {
    /// Every other field (and ids, if any, that come before `tokens`).
    rest: ScoreTokensRequest,
    tokens: Arc<Vec<u32>>,
    /// Bytes of the varints of `tokens`.
    packed_len: usize,
}

impl ScoreQuery {
    /// The request `rest` with `tokens` appended to its token ids.
    pub fn new(rest: ScoreTokensRequest, tokens: Arc<Vec<u32>>) -> ScoreQuery {
        // One byte per 7 bits: 1 + how many of 2^7, 2^14, 2^21, 2^28 the id reaches (vectorizes).
        let widths = |id: u32| 1 + [7, 14, 21, 28].iter().map(|&bits| usize::from(id >= 1 << bits)).sum::<usize>();
        let packed_len = tokens.iter().map(|&id| widths(id)).sum();
        ScoreQuery { rest, tokens, packed_len }
    }

    /// Every field but the shared ids.
    pub fn rest(&self) -> &ScoreTokensRequest {
        &self.rest
    }

    pub fn tokens(&self) -> &Arc<Vec<u32>> {
        &self.tokens
    }
}

/// Writes the varints of `ids` a chunk at a time (prost's `put_u8` per byte costs ~3× more).
fn put_varints(ids: &[u32], buf: &mut impl BufMut) {
    let mut chunk = [0u8; 5 * CHUNK_IDS];
    for part in ids.chunks(CHUNK_IDS) {
        let mut n = 0;
        for &id in part {
            let mut v = id;
            while v >= 0x80 {
                chunk[n] = (v as u8) | 0x80;
                v >>= 7;
                n += 1;
            }
            chunk[n] = v as u8;
            n += 1;
        }
        buf.put_slice(&chunk[..n]);
    }
}

impl Message for ScoreQuery {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.rest.encode_raw(buf);
        if self.packed_len > 0 {
            encode_key(TOKEN_IDS_TAG, WireType::LengthDelimited, buf);
            encode_varint(self.packed_len as u64, buf);
            put_varints(&self.tokens, buf);
        }
    }

    /// Decoding (never done by a client, but a `Message` must) fills the generated message:
    /// every id lands in `rest`.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        self.rest.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let ids = if self.packed_len > 0 {
            key_len(TOKEN_IDS_TAG) + encoded_len_varint(self.packed_len as u64) + self.packed_len
        } else {
            0
        };
        self.rest.encoded_len() + ids
    }

    fn clear(&mut self) {
        *self = ScoreQuery::default();
    }
}

/// `kvindex.v1.Indexer/ScoreTokens` with a [`ScoreQuery`], as the generated client calls it, over
/// any gRPC transport (tonic's `Channel`, or one HTTP/2 connection driven directly).
pub async fn score_tokens<T>(
    transport: T,
    request: tonic::Request<ScoreQuery>,
) -> Result<tonic::Response<ScoreTokensResponse>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut grpc = tonic::client::Grpc::new(transport);
    grpc.ready().await.map_err(|e| tonic::Status::unknown(format!("Service was not ready: {}", e.into())))?;
    let codec = tonic_prost::ProstCodec::<ScoreQuery, ScoreTokensResponse>::default();
    let path = PathAndQuery::from_static("/kvindex.v1.Indexer/ScoreTokens");
    let mut request = request;
    request.extensions_mut().insert(GrpcMethod::new("kvindex.v1.Indexer", "ScoreTokens"));
    grpc.unary(request, path, codec).await
}

/// A gRPC transport (tonic's `Channel`) whose requests are handed over with their body gathered
/// whole, as one body that says it ends with its data. tonic's body for a unary call learns it
/// has ended only when polled again after the message, so HTTP/2 sends the message and then an
/// empty DATA frame to end the stream, each its own write, and the server wakes for each; and
/// hyper hands a body it cannot send at once to a task of its own. A unary request's body is
/// ready at once (the message is encoded as it is polled), so gathering it costs no wait.
#[derive(Debug, Clone)]
pub struct WholeRequests<T>(pub T);

/// A body of one chunk, known to end after it.
struct Whole(Option<Bytes>);

impl Body for Whole {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|data| Ok(http_body::Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |data| data.len() as u64))
    }
}

/// Every data frame of `body`, concatenated (the request's trailers, which gRPC clients do not
/// send, are dropped).
async fn gather(mut body: tonic::body::Body) -> Result<Bytes, tonic::Status> {
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(data) = frame?.into_data() else { continue };
        match &first {
            None => first = Some(data),
            Some(head) => {
                if more.is_empty() {
                    more.extend_from_slice(head);
                }
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(if more.is_empty() { first.unwrap_or_default() } else { more.freeze() })
}

impl<T> Service<http::Request<tonic::body::Body>> for WholeRequests<T>
where
    T: Service<http::Request<tonic::body::Body>> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<StdError>,
{
    type Response = T::Response;
    type Error = StdError;
    type Future = BoxFuture<T::Response, StdError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // The service polled ready makes the call (tower's contract); a clone takes its place.
        let clone = self.0.clone();
        let mut ready = std::mem::replace(&mut self.0, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let whole = tonic::body::Body::new(Whole(Some(gather(body).await?)));
            ready.call(http::Request::from_parts(parts, whole)).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tokens: Vec<u32>) -> ScoreTokensRequest {
        let mut request = ScoreTokensRequest { model: "m".into(), token_ids: tokens, ..Default::default() };
        request.pods = vec!["a:1".into(), "b:2".into()];
        request.lora_name = "lora".into();
        request.cache_salt = "salt".into();
        request
    }

    #[test]
    fn decodes_as_the_generated_request_with_the_same_ids() {
        // Every varint width a u32 has, and chunk boundaries.
        let widths = [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455, 268_435_456, u32::MAX];
        for len in [0, 1, 255, 256, 257, 8_860] {
            let ids: Vec<u32> = (0..len).map(|i| widths[i % widths.len()] ^ (i as u32 & 1)).collect();
            let query = ScoreQuery::new(request(Vec::new()), Arc::new(ids.clone()));
            let bytes = query.encode_to_vec();
            assert_eq!(bytes.len(), query.encoded_len());
            assert_eq!(ScoreTokensRequest::decode(&bytes[..]).unwrap(), request(ids.clone()), "{len} ids");
            // The same bytes a ScoreQuery decodes into: all ids in the generated message.
            let back = ScoreQuery::decode(&bytes[..]).unwrap();
            assert_eq!((back.rest(), back.tokens().len()), (&request(ids), 0));
        }
    }

    #[test]
    fn ids_in_the_generated_message_come_first() {
        let query = ScoreQuery::new(request(vec![1, 2]), Arc::new(vec![3, 300_000]));
        let decoded = ScoreTokensRequest::decode(&query.encode_to_vec()[..]).unwrap();
        assert_eq!(decoded.token_ids, [1, 2, 3, 300_000]);
    }
}
