//! ScoreTokens' request decoded without prost's per-value `Buf` calls, for the server. A
//! router's prompt is thousands of packed varints (~26 kB for 8.8k ids); prost decodes each
//! through the generic `Buf` (a chunk, a slice decode, an advance and a push per id), which costs
//! ~10 ns an id, ~0.1 ms of a request, more than the index takes to answer it. Here the packed ids
//! are read from the message's one contiguous slice in a tight loop into a vector sized once;
//! every other field, and anything unusual in the ids (a varint longer than a `u32`'s, a
//! truncated one, ids sent unpacked), goes through prost's own generated decoder, so the result,
//! and the error for a malformed request, is prost's. The wire format is unchanged.
//!
//! [`IndexerRoutes`] is `kvindex.v1.Indexer` as the generated server serves it, but ScoreTokens'
//! requests go through [`ScoreTokensCodec`].

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, DecodeContext, WireType};
use prost::{DecodeError, Message};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::kvindex::v1::indexer_server::{Indexer, IndexerServer};
use crate::kvindex::v1::{ScoreTokensRequest, ScoreTokensResponse};

/// `ScoreTokensRequest.token_ids`.
const TOKEN_IDS_TAG: u32 = 2;

/// The path ScoreTokens is served on.
const SCORE_TOKENS_PATH: &str = "/kvindex.v1.Indexer/ScoreTokens";

/// Decodes a whole `ScoreTokensRequest` from `bytes`: what `ScoreTokensRequest::decode` returns
/// (the same message, or an error where prost fails), faster for packed token ids.
pub fn decode_request(mut bytes: &[u8]) -> Result<ScoreTokensRequest, DecodeError> {
    let mut request = ScoreTokensRequest::default();
    let ctx = DecodeContext::default();
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes)?;
        if tag == TOKEN_IDS_TAG && wire_type == WireType::LengthDelimited {
            if let Some(rest) = append_packed(&mut request.token_ids, bytes) {
                bytes = rest;
                continue;
            }
        }
        request.merge_field(tag, wire_type, &mut bytes, ctx.clone())?;
    }
    Ok(request)
}

/// Appends the packed varints of the length-delimited field at the start of `bytes` to `ids`
/// and returns what follows it; `None` (with `ids` as it was) when the field is not plain
/// `u32` varints that end where it ends, for prost to decode (or refuse) instead.
fn append_packed<'a>(ids: &mut Vec<u32>, mut bytes: &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
    if len > bytes.len() {
        return None;
    }
    let (field, rest) = bytes.split_at(len);
    // Every varint ends in exactly one byte below 0x80: that many ids (vectorizes).
    let count = field.iter().filter(|&&b| b < 0x80).count();
    let kept = ids.len();
    ids.reserve_exact(count);
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b < 0x80 {
            ids.push(u32::from(b));
            i += 1;
            continue;
        }
        let mut value = u32::from(b & 0x7f);
        let mut shift = 7;
        let mut end = None;
        for (k, &b) in field[i + 1..].iter().take(4).enumerate() {
            // The fifth byte holds the top 4 bits of a u32: more is a wider value.
            if shift == 28 && b > 0x0f {
                break;
            }
            value |= u32::from(b & 0x7f) << shift;
            if b < 0x80 {
                end = Some(i + k + 2);
                break;
            }
            shift += 7;
        }
        let Some(next) = end else {
            ids.truncate(kept);
            return None;
        };
        ids.push(value);
        i = next;
    }
    Some(rest)
}

/// The decoder of ScoreTokens' requests: [`decode_request`] over the message's bytes.
#[derive(Debug, Clone, Default)]
pub struct ScoreTokensDecoder;

impl Decoder for ScoreTokensDecoder {
    type Item = ScoreTokensRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<ScoreTokensRequest>, Status> {
        let len = buf.remaining();
        let decoded = if buf.chunk().len() >= len {
            let decoded = decode_request(&buf.chunk()[..len]);
            buf.advance(len);
            decoded
        } else {
            // Not one slice (never, with tonic's decoder): prost's own decode.
            ScoreTokensRequest::decode(buf)
        };
        // As tonic-prost maps a decode error: INTERNAL, with prost's message.
        decoded.map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

/// ScoreTokens' server codec: prost's encoder for the answer, [`ScoreTokensDecoder`] for the request.
#[derive(Debug, Clone, Default)]
pub struct ScoreTokensCodec;

impl Codec for ScoreTokensCodec {
    type Encode = ScoreTokensResponse;
    type Decode = ScoreTokensRequest;
    type Encoder = ProstEncoder<ScoreTokensResponse>;
    type Decoder = ScoreTokensDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<ScoreTokensResponse, ScoreTokensRequest>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ScoreTokensDecoder
    }
}

/// `kvindex.v1.Indexer` served by the generated server, except ScoreTokens, whose requests are
/// decoded by [`ScoreTokensCodec`] (same limits: the largest message decoded).
pub struct IndexerRoutes<T> {
    service: Arc<T>,
    generated: IndexerServer<T>,
    max_decoding_message_size: Option<usize>,
}

impl<T: Indexer> IndexerRoutes<T> {
    pub fn new(service: T) -> Self {
        let service = Arc::new(service);
        IndexerRoutes { generated: IndexerServer::from_arc(service.clone()), service, max_decoding_message_size: None }
    }

    /// The largest request decoded (tonic's default, 4 MiB, without).
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.generated = self.generated.max_decoding_message_size(limit);
        self.max_decoding_message_size = Some(limit);
        self
    }
}

impl<T> Clone for IndexerRoutes<T> {
    fn clone(&self) -> Self {
        IndexerRoutes {
            service: self.service.clone(),
            generated: self.generated.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
        }
    }
}

impl<T> NamedService for IndexerRoutes<T> {
    const NAME: &'static str = <IndexerServer<T> as NamedService>::NAME;
}

/// ScoreTokens' handler, as the generated server wraps it.
struct ScoreTokensService<T>(Arc<T>);

impl<T: Indexer> tonic::server::UnaryService<ScoreTokensRequest> for ScoreTokensService<T> {
    type Response = ScoreTokensResponse;
    type Future = BoxFuture<tonic::Response<ScoreTokensResponse>, Status>;

    fn call(&mut self, request: tonic::Request<ScoreTokensRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.score_tokens(request).await })
    }
}

impl<T, B> Service<http::Request<B>> for IndexerRoutes<T>
where
    T: Indexer,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SCORE_TOKENS_PATH {
            return self.generated.call(request);
        }
        let (service, max) = (self.service.clone(), self.max_decoding_message_size);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ScoreTokensCodec).apply_max_message_size_config(max, None);
            Ok(grpc.unary(ScoreTokensService(service), request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::encoding::{encode_key, encode_varint};

    use super::*;

    /// Both decoders on `bytes`: the same message, or both an error.
    fn same_as_prost(bytes: &[u8]) {
        let ours = decode_request(bytes);
        let prost = ScoreTokensRequest::decode(bytes);
        match (&ours, &prost) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{bytes:02x?}"),
            (Err(_), Err(_)) => {}
            _ => panic!("ours {ours:?}, prost {prost:?} on {bytes:02x?}"),
        }
    }

    fn packed(ids: &[u64]) -> Vec<u8> {
        let mut field = Vec::new();
        for &id in ids {
            encode_varint(id, &mut field);
        }
        let mut bytes = Vec::new();
        encode_key(TOKEN_IDS_TAG, WireType::LengthDelimited, &mut bytes);
        encode_varint(field.len() as u64, &mut bytes);
        bytes.extend(field);
        bytes
    }

    #[test]
    fn decodes_what_prost_decodes() {
        let widths =
            [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455, 268_435_456, u64::from(u32::MAX)];
        let ids: Vec<u64> = (0..8_800).map(|i| widths[i % widths.len()] ^ (i as u64 & 1)).collect();
        let request = ScoreTokensRequest {
            model: "m".into(),
            lora_name: "l".into(),
            cache_salt: "s".into(),
            pods: vec!["a:1".into(), "b:2".into()],
            token_ids: ids.iter().map(|&id| id as u32).collect(),
        };
        let bytes = request.encode_to_vec();
        assert_eq!(decode_request(&bytes).unwrap(), request);
        same_as_prost(&bytes);
        // Two packed runs (a ScoreQuery's ids follow the generated message's), an unpacked id
        // between, and fields after the ids.
        let mut bytes = packed(&ids[..100]);
        encode_key(TOKEN_IDS_TAG, WireType::Varint, &mut bytes);
        encode_varint(7, &mut bytes);
        bytes.extend(packed(&ids[100..]));
        bytes.extend(ScoreTokensRequest { model: "m".into(), ..Default::default() }.encode_to_vec());
        same_as_prost(&bytes);
        assert_eq!(decode_request(&bytes).unwrap().token_ids.len(), 8_801);
        // The empty request, and an empty packed field.
        same_as_prost(&[]);
        same_as_prost(&packed(&[]));
    }

    #[test]
    fn unusual_ids_are_prost_s_values_or_errors() {
        // Wider than a u32 (prost keeps the low 32 bits), a 10-byte varint, an 11-byte one (an
        // error), non-minimal encodings.
        for ids in [vec![1u64 << 32, 5], vec![u64::MAX], vec![(1u64 << 35) + 9, 1]] {
            same_as_prost(&packed(&ids));
        }
        let overlong = [0x12, 11, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        same_as_prost(&overlong);
        same_as_prost(&[0x12, 3, 0x80, 0x80, 0x00]);
        // Truncated: the varint runs past the field, the field past the message, a key alone.
        same_as_prost(&[0x12, 2, 0x05, 0x80, 0x01]);
        same_as_prost(&[0x12, 9, 0x05]);
        same_as_prost(&[0x12]);
        same_as_prost(&[0x12, 0x80]);
        // Every prefix of a real request: each is what prost makes of it.
        let bytes = ScoreTokensRequest {
            model: "model".into(),
            token_ids: vec![1, 300, 70_000, u32::MAX],
            pods: vec!["p".into()],
            ..Default::default()
        }
        .encode_to_vec();
        for end in 0..=bytes.len() {
            same_as_prost(&bytes[..end]);
        }
    }
}
