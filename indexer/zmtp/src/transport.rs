//! TCP and Unix sockets behind one type, so the ZMTP code above never asks which it has.
//!
//! `ipc://` binding replaces a stale socket file (one nobody accepts on, as a crashed process
//! leaves) but refuses to steal a live one; the [`SocketFile`] it hands back removes the file
//! when dropped, if the file is still the one it created.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::endpoint::Endpoint;
use crate::peer::Peer;

pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

fn unix_peer(stream: &UnixStream, path: &Arc<str>) -> Peer {
    let cred = stream.peer_cred().ok();
    Peer::Ipc { path: path.clone(), uid: cred.map(|c| c.uid()), pid: cred.and_then(|c| c.pid()) }
}

fn path_str(path: &Path) -> Arc<str> {
    path.to_string_lossy().into()
}

/// Dials `endpoint`.
pub(crate) async fn connect(endpoint: &Endpoint) -> io::Result<(Stream, Peer)> {
    match endpoint {
        Endpoint::Tcp { host, .. } if host == "*" => {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot dial the wildcard host *"))
        }
        Endpoint::Tcp { .. } => {
            let stream = TcpStream::connect(endpoint.socket_addr().expect("tcp")).await?;
            stream.set_nodelay(true)?;
            let peer = Peer::Tcp(stream.peer_addr()?);
            Ok((Stream::Tcp(stream), peer))
        }
        Endpoint::Ipc(path) => {
            let stream = UnixStream::connect(path).await?;
            let peer = unix_peer(&stream, &path_str(path));
            Ok((Stream::Unix(stream), peer))
        }
    }
}

pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix { listener: UnixListener, path: PathBuf, name: Arc<str> },
}

/// The socket file of a bound `ipc://` listener; removed when dropped (if still ours).
pub(crate) struct SocketFile {
    path: PathBuf,
    inode: (u64, u64),
}

impl Listener {
    /// Binds `endpoint`; for `ipc://`, also returns the guard that removes the socket file.
    pub(crate) async fn bind(endpoint: &Endpoint) -> io::Result<(Listener, Option<SocketFile>)> {
        match endpoint {
            Endpoint::Tcp { .. } => {
                Ok((Listener::Tcp(TcpListener::bind(endpoint.socket_addr().expect("tcp")).await?), None))
            }
            Endpoint::Ipc(path) => {
                remove_stale_socket(path).await?;
                let listener = UnixListener::bind(path)?;
                let meta = std::fs::metadata(path)?;
                let file = SocketFile { path: path.clone(), inode: (meta.dev(), meta.ino()) };
                Ok((Listener::Unix { listener, path: path.clone(), name: path_str(path) }, Some(file)))
            }
        }
    }

    /// The endpoint as bound (port 0 resolved).
    pub(crate) fn local_endpoint(&self) -> io::Result<String> {
        match self {
            Listener::Tcp(l) => Ok(format!("tcp://{}", l.local_addr()?)),
            Listener::Unix { path, .. } => Ok(format!("ipc://{}", path.display())),
        }
    }

    pub(crate) async fn accept(&self) -> io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (stream, addr) = l.accept().await?;
                stream.set_nodelay(true)?;
                Ok((Stream::Tcp(stream), Peer::Tcp(addr)))
            }
            Listener::Unix { listener, name, .. } => {
                let (stream, _) = listener.accept().await?;
                let peer = unix_peer(&stream, name);
                Ok((Stream::Unix(stream), peer))
            }
        }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes a socket file at `path` that nobody accepts on; refuses a live one.
async fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "path exists and is not a socket"));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(io::ErrorKind::AddrInUse, "another process listens on this socket")),
        Err(_) => std::fs::remove_file(path),
    }
}
