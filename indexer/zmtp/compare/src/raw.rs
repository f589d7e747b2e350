//! A hostile peer written byte by byte (std sockets, no ZMTP library): greeting and READY by
//! hand, then whatever a scenario wants to send: a huge frame header, an endless multi-part
//! message, silence, a trickle.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub fn greeting(minor: u8) -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = minor;
    g[12..16].copy_from_slice(b"NULL");
    g
}

pub fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    if body.len() > 255 {
        out.push(flags | 0x02);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
    out
}

pub fn ready(socket_type: &[u8]) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type);
    frame(0x04, &body)
}

/// `tcp://127.0.0.1:port` → the address.
pub fn addr(endpoint: &str) -> SocketAddr {
    endpoint.trim_start_matches("tcp://").parse().expect("a tcp://ip:port endpoint")
}

/// Connects from `source` (any loopback address works on Linux), giving up after 500 ms (a
/// full accept backlog drops SYNs, and a flood must not stall on one).
pub fn connect(endpoint: &str, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let target = addr(endpoint);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    if let Some(ip) = source {
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    sock.connect_timeout(&target.into(), Duration::from_millis(500))?;
    Ok(sock.into())
}

fn read_frame(s: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut flags = [0u8; 1];
    s.read_exact(&mut flags)?;
    let len = if flags[0] & 0x02 != 0 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b)?;
        u64::from_be_bytes(b)
    } else {
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
        u64::from(b[0])
    };
    let mut body = vec![0u8; len.min(1 << 20) as usize];
    s.read_exact(&mut body)?;
    Ok((flags[0], body))
}

/// Greets as `socket_type` (ZMTP 3.`minor`) and reads the peer's greeting and READY.
pub fn handshake(s: &mut TcpStream, minor: u8, socket_type: &[u8]) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut hello = greeting(minor).to_vec();
    hello.extend(ready(socket_type));
    s.write_all(&hello)?;
    let mut theirs = [0u8; 64];
    s.read_exact(&mut theirs)?;
    let (flags, _) = read_frame(s)?;
    if flags & 0x04 == 0 {
        return Err(io::Error::other("expected READY"));
    }
    Ok(())
}

/// Reads (and discards) until the peer closes; how long that took, or `None` within `limit`.
pub fn time_to_close(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(start.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok()?;
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return None,
            Err(_) => return Some(start.elapsed()),
        }
    }
}

/// Whether the peer has closed `s` (non-blocking check).
pub fn closed(s: &mut TcpStream) -> bool {
    let _ = s.set_nonblocking(true);
    let mut buf = [0u8; 512];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    let _ = s.set_nonblocking(false);
    closed
}
