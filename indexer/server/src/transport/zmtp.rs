//! A minimal ZMTP 3.0 SUB peer (NULL mechanism) on plain tokio TCP, for the live streams.
//!
//! Why not the `zeromq` crate's `SubSocket` here: with many publishers on one socket (central
//! mode, 64 engines) its fair queue stops polling some peers. Their bytes stay in the kernel
//! receive queue (`ss -tn` shows a non-zero Recv-Q) until more data arrives, so the last
//! batches of a quiet engine are not applied, on single- and multi-threaded runtimes alike.
//! It also never reconnects a dialled peer and has no way to report a disconnect. A SUB peer
//! is small enough to own: greeting, READY, a subscription message, then length-prefixed
//! frames. The accept and dial loops around it are in `sub`.
//! The replay DEALER still uses the `zeromq` crate (one peer, short-lived): see `dealer`.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Largest frame accepted (a vLLM batch is far smaller); a bigger one drops the connection.
const MAX_FRAME: u64 = 64 << 20;
/// Most frames in one message (vLLM sends 3).
const MAX_PARTS: usize = 16;

fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3; // version 3.0
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn command(name: &str, props: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(name.len() as u8);
    body.extend_from_slice(name.as_bytes());
    for (k, v) in props {
        body.push(k.len() as u8);
        body.extend_from_slice(k.as_bytes());
        body.extend_from_slice(&(v.len() as u32).to_be_bytes());
        body.extend_from_slice(v);
    }
    let mut out = Vec::with_capacity(body.len() + 9);
    if body.len() > 255 {
        out.push(0x06);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(0x04);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(&body);
    out
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// One frame: (flags, body).
async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> io::Result<(u8, Bytes)> {
    let flags = r.read_u8().await?;
    let len = if flags & 0x02 != 0 { r.read_u64().await? } else { u64::from(r.read_u8().await?) };
    if len > MAX_FRAME {
        return Err(bad("frame too large"));
    }
    let mut buf = BytesMut::zeroed(len as usize);
    r.read_exact(&mut buf).await?;
    Ok((flags, buf.freeze()))
}

/// A connected, subscribed SUB session.
pub struct SubSession {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    _writer: tokio::net::tcp::OwnedWriteHalf,
}

impl SubSession {
    /// Handshakes as a SUB (either side of the TCP connection) and subscribes to `filter`.
    pub async fn handshake(stream: TcpStream, filter: &str, timeout: Duration) -> io::Result<SubSession> {
        stream.set_nodelay(true)?;
        let (r, mut w) = stream.into_split();
        let mut reader = BufReader::with_capacity(64 * 1024, r);
        let hs = async {
            w.write_all(&greeting()).await?;
            let mut peer = [0u8; 64];
            reader.read_exact(&mut peer).await?;
            if peer[0] != 0xff || peer[9] & 0x01 != 0x01 || peer[10] < 3 {
                return Err(bad("not a ZMTP 3 peer"));
            }
            if &peer[12..16] != b"NULL" {
                return Err(bad("only the NULL security mechanism is supported"));
            }
            w.write_all(&command("READY", &[("Socket-Type", b"SUB")])).await?;
            let (flags, body) = read_frame(&mut reader).await?;
            if flags & 0x04 == 0 || body.len() < 6 || &body[1..6] != b"READY" {
                return Err(bad("expected a READY command"));
            }
            let ty = socket_type(&body[6..]);
            if !matches!(ty.as_deref(), Some(b"PUB") | Some(b"XPUB")) {
                return Err(bad("peer is not a PUB or XPUB socket"));
            }
            // ZMTP 3.0 subscription: a message whose body is 0x01 + prefix.
            let mut sub = Vec::with_capacity(filter.len() + 3);
            sub.push(0x00);
            sub.push((filter.len() + 1) as u8);
            sub.push(0x01);
            sub.extend_from_slice(filter.as_bytes());
            if filter.len() + 1 > 255 {
                return Err(bad("topic filter longer than 254 bytes"));
            }
            w.write_all(&sub).await?;
            w.flush().await
        };
        tokio::time::timeout(timeout, hs)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "ZMTP handshake timed out"))??;
        Ok(SubSession { reader, _writer: w })
    }

    /// The next multipart message (commands such as PING are skipped).
    pub async fn recv(&mut self) -> io::Result<Vec<Bytes>> {
        let mut parts = Vec::with_capacity(3);
        loop {
            let (flags, body) = read_frame(&mut self.reader).await?;
            if flags & 0x04 != 0 {
                continue;
            }
            if parts.len() >= MAX_PARTS {
                return Err(bad("message has too many frames"));
            }
            parts.push(body);
            if flags & 0x01 == 0 {
                return Ok(parts);
            }
        }
    }
}

/// The Socket-Type property of a READY command's property list.
fn socket_type(mut props: &[u8]) -> Option<Vec<u8>> {
    while !props.is_empty() {
        let n = usize::from(props[0]);
        let name = props.get(1..1 + n)?;
        let len = u32::from_be_bytes(props.get(1 + n..5 + n)?.try_into().ok()?) as usize;
        let value = props.get(5 + n..5 + n + len)?;
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            return Some(value.to_vec());
        }
        props = &props[5 + n + len..];
    }
    None
}

/// `tcp://host:port` → `host:port`.
pub fn tcp_addr(endpoint: &str) -> io::Result<String> {
    endpoint.strip_prefix("tcp://").map(str::to_string).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("only tcp:// endpoints are supported: {endpoint}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_properties() {
        let c = command("READY", &[("Socket-Type", b"SUB")]);
        assert_eq!(c[0], 0x04);
        assert_eq!(&c[3..8], b"READY");
        assert_eq!(socket_type(&c[8..]).as_deref(), Some(&b"SUB"[..]));
        assert_eq!(socket_type(&[3, b'a']), None);
    }
}
