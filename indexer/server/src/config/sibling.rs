//! The sibling replicas' settings: the one to bootstrap from and compare digests with
//! (`bootstrap_from`, `bootstrap_tls_*`), its TLS files read and checked now, and the bounds of
//! serving `ExportIndex` to the others (`sibling_export_*`).

use std::time::Duration;

/// A sibling replica: its gRPC address (`host:port`, a Service's name in Kubernetes) and how
/// to talk TLS to it.
#[derive(Debug, Clone)]
pub struct Sibling {
    pub addr: String,
    pub tls: Option<SiblingTls>,
}

/// TLS to a sibling: the CA that signed its certificate, our identity if it asks for one,
/// and the name its certificate carries (default: the address's host).
#[derive(Clone, Default)]
pub struct SiblingTls {
    pub ca_pem: Vec<u8>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    pub domain: Option<String>,
}

impl std::fmt::Debug for SiblingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("SiblingTls").field("mutual", &self.identity.is_some()).field("domain", &self.domain).finish()
    }
}

impl SiblingTls {
    /// Reads the PEM files: `ca` to trust, and `cert` with `key` as our identity.
    pub fn read(
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
        domain: Option<String>,
    ) -> Result<SiblingTls, String> {
        let read = |p: &std::path::Path| {
            let pem = std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
                return Err(format!("{} is not PEM", p.display()));
            }
            Ok(pem)
        };
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(SiblingTls { ca_pem: read(ca)?, identity, domain })
    }
}

/// The bounds of `ExportIndex`.
#[derive(Debug, Clone, Copy)]
pub struct ExportLimits {
    pub max_bytes: u64,
    pub timeout: Duration,
    pub max_concurrent: usize,
}
