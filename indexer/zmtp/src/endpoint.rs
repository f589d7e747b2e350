//! ZeroMQ endpoint strings as vLLM writes them: `tcp://host:port` (host `*` = every IPv4
//! interface, as libzmq binds it; `[v6]` for IPv6 literals; a name is resolved when dialling)
//! and `ipc://path` (a Unix socket). Parsed once, so a typo is a config error, not a retry loop.

use std::fmt;
use std::path::PathBuf;

use crate::error::Error;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Ipc(PathBuf),
}

fn invalid(endpoint: &str, why: &'static str) -> Error {
    Error::Endpoint { endpoint: endpoint.to_string(), why }
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Endpoint, Error> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            let (host, port) = rest.rsplit_once(':').ok_or_else(|| invalid(s, "expected tcp://host:port"))?;
            if host.is_empty() {
                return Err(invalid(s, "empty host (use * for every interface)"));
            }
            let port = match port {
                "*" => 0,
                p => p.parse().map_err(|_| invalid(s, "port is not a number from 0 to 65535"))?,
            };
            Ok(Endpoint::Tcp { host: host.to_string(), port })
        } else if let Some(path) = s.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err(invalid(s, "empty ipc path"));
            }
            if path.starts_with('@') || path == "*" {
                return Err(invalid(s, "abstract and wildcard ipc names are not supported; give a path"));
            }
            Ok(Endpoint::Ipc(PathBuf::from(path)))
        } else {
            Err(invalid(s, "only tcp:// and ipc:// are supported"))
        }
    }

    /// `host:port` for binding (`*` → `0.0.0.0`) or dialling (`*` is refused by the caller).
    pub(crate) fn socket_addr(&self) -> Option<String> {
        match self {
            Endpoint::Tcp { host, port } if host == "*" => Some(format!("0.0.0.0:{port}")),
            Endpoint::Tcp { host, port } => Some(format!("{host}:{port}")),
            Endpoint::Ipc(_) => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Ipc(path) => write!(f, "ipc://{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_vllm_uses() {
        assert_eq!(Endpoint::parse("tcp://*:5557").unwrap().socket_addr().unwrap(), "0.0.0.0:5557");
        assert_eq!(Endpoint::parse("tcp://[::1]:0").unwrap().socket_addr().unwrap(), "[::1]:0");
        assert_eq!(
            Endpoint::parse("tcp://indexer.ns.svc:5557").unwrap(),
            Endpoint::Tcp { host: "indexer.ns.svc".into(), port: 5557 }
        );
        assert_eq!(Endpoint::parse("ipc:///tmp/kv.sock").unwrap(), Endpoint::Ipc("/tmp/kv.sock".into()));
        assert_eq!(Endpoint::parse("ipc:///tmp/kv.sock").unwrap().to_string(), "ipc:///tmp/kv.sock");
        for bad in ["tcp://:5", "tcp://host", "tcp://h:99999", "inproc://x", "ipc://", "ipc://@abstract", "udp://h:1"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
