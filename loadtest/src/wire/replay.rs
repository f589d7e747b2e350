//! The replay ROUTER: answers a DEALER's `[b"", start_seq]` with the buffered batches from that
//! seq and an end marker, in the layout of the chosen vLLM release.
//!
//! Layouts (`docs/reference/vllm-kv-events.md` §2): from vLLM 0.26 each reply is
//! `[b"", topic, seq, payload]` and the end marker `[b"", b"", ff×8, b""]`; up to 0.25 the
//! topic frame is absent. A request that is not exactly `[identity, b"", start]` is ignored,
//! as vLLM logs "Invalid replay request" and ignores it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::encode::WireVersion;
use super::replay_buffer::ReplayBuffer;

/// `END_SEQ`: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_OF_REPLAY_SEQ: [u8; 8] = [0xff; 8];

/// vLLM reads `start_seq` as an unsigned big-endian int of any length.
pub fn parse_start_seq(frame: &[u8]) -> u64 {
    let significant = frame.iter().skip_while(|&&b| b == 0).count();
    if significant > 8 {
        return u64::MAX; // beyond any seq: only the end marker comes back
    }
    frame.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// The frames (after the identity) answering a request from `start`.
pub fn replay_replies(buffer: &ReplayBuffer, topic: &[u8], version: WireVersion, start: u64) -> Vec<Vec<Bytes>> {
    let with_topic = version.replay_has_topic();
    let mut replies: Vec<Vec<Bytes>> = buffer
        .since(start)
        .into_iter()
        .map(|(seq, payload)| {
            let mut frames = vec![Bytes::new()];
            if with_topic {
                frames.push(Bytes::copy_from_slice(topic));
            }
            frames.push(Bytes::copy_from_slice(&seq.to_be_bytes()));
            frames.push(payload);
            frames
        })
        .collect();
    let mut end = vec![Bytes::new()];
    if with_topic {
        end.push(Bytes::new());
    }
    end.push(Bytes::copy_from_slice(&END_OF_REPLAY_SEQ));
    end.push(Bytes::new());
    replies.push(end);
    replies
}

/// Binds the ROUTER and serves it until the process ends. Returns the bound endpoint.
///
/// The `zeromq` crate panics (`todo!`) on some unexpected peer commands; the serving task is
/// therefore supervised and the ROUTER re-bound on the same endpoint if it dies.
pub async fn serve_replay(
    endpoint: &str,
    buffer: Arc<Mutex<ReplayBuffer>>,
    topic: Bytes,
    version: WireVersion,
) -> Result<String, zeromq::ZmqError> {
    let mut socket = RouterSocket::new();
    let bound = socket.bind(endpoint).await?.to_string();
    let label = bound.clone();
    tokio::spawn(async move {
        let mut socket = Some(socket);
        loop {
            let current = match socket.take() {
                Some(current) => current,
                None => {
                    let mut fresh = RouterSocket::new();
                    match fresh.bind(&label).await {
                        Ok(_) => fresh,
                        Err(error) => {
                            tracing::warn!(endpoint = %label, %error, "replay ROUTER re-bind failed; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    }
                }
            };
            let served = tokio::spawn(serve(current, label.clone(), buffer.clone(), topic.clone(), version));
            if let Err(error) = served.await {
                tracing::warn!(endpoint = %label, %error, "replay ROUTER task died; re-binding");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Ok(bound)
}

async fn serve(
    mut socket: RouterSocket,
    label: String,
    buffer: Arc<Mutex<ReplayBuffer>>,
    topic: Bytes,
    version: WireVersion,
) {
    loop {
        let message = match socket.recv().await {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(endpoint = %label, %error, "replay recv failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let frames = message.into_vec();
        let [identity, delimiter, start] = frames.as_slice() else {
            tracing::warn!(endpoint = %label, frames = frames.len(), "invalid replay request ignored");
            continue;
        };
        if !delimiter.is_empty() {
            tracing::warn!(endpoint = %label, "invalid replay request (no empty delimiter) ignored");
            continue;
        }
        let start = parse_start_seq(start);
        let replies = match buffer.lock() {
            Ok(buffer) => replay_replies(&buffer, &topic, version, start),
            Err(_) => continue,
        };
        tracing::debug!(endpoint = %label, start, replies = replies.len(), "replaying");
        for reply in replies {
            let mut frames = Vec::with_capacity(reply.len() + 1);
            frames.push(identity.clone());
            frames.extend(reply);
            let Ok(message) = ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(error) = socket.send(message).await {
                tracing::warn!(endpoint = %label, %error, "replay send failed");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_seq_is_any_length_big_endian() {
        assert_eq!(parse_start_seq(&[0, 0, 0, 0, 0, 0, 0, 7]), 7);
        assert_eq!(parse_start_seq(&[1, 0]), 256);
        assert_eq!(parse_start_seq(&[]), 0);
        assert_eq!(parse_start_seq(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
    }

    #[test]
    fn layouts_follow_the_release() {
        let mut buffer = ReplayBuffer::new(4);
        buffer.push(2, Bytes::from_static(b"p2"));
        let new = replay_replies(&buffer, b"kv@t", WireVersion::V0_33, 0);
        assert_eq!(
            new[0],
            vec![
                Bytes::new(),
                Bytes::from_static(b"kv@t"),
                Bytes::copy_from_slice(&2u64.to_be_bytes()),
                Bytes::from_static(b"p2")
            ]
        );
        assert_eq!(new[1], vec![Bytes::new(), Bytes::new(), Bytes::copy_from_slice(&[0xff; 8]), Bytes::new()]);
        let old = replay_replies(&buffer, b"kv@t", WireVersion::V0_23, 0);
        assert_eq!(old[0].len(), 3);
        assert_eq!(old[1], vec![Bytes::new(), Bytes::copy_from_slice(&[0xff; 8]), Bytes::new()]);
    }
}
