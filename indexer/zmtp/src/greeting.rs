//! The 64-byte ZMTP greeting: the first bytes each side sends, naming the protocol version and
//! the security mechanism. It decides how we talk to the peer afterwards (3.0 or 3.1 rules).
//!
//! Layout (RFC 23 and 37): signature `ff` + 8 padding bytes + `7f`, version major, minor,
//! a 20-byte NUL-padded mechanism name, an as-server byte, 31 filler bytes.

use crate::error::ProtocolError;

pub(crate) const GREETING_LEN: usize = 64;

/// The version we announce: 3.1. A 3.0 peer talks 3.0 with us (the lower version wins).
const OUR_MAJOR: u8 = 3;
const OUR_MINOR: u8 = 1;

/// What the peer's greeting said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub major: u8,
    pub minor: u8,
    mechanism: [u8; 20],
}

impl Greeting {
    /// Our greeting: ZMTP 3.1, NULL mechanism, client role.
    pub(crate) fn ours() -> [u8; GREETING_LEN] {
        let mut g = [0u8; GREETING_LEN];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = OUR_MAJOR;
        g[11] = OUR_MINOR;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    /// Checks the bytes received so far (`prefix`, possibly the whole greeting) and fails as
    /// soon as one of them rules the peer out, so a stranger is not waited on for 64 bytes.
    pub(crate) fn check_prefix(prefix: &[u8]) -> Result<(), ProtocolError> {
        if prefix.first().is_some_and(|&b| b != 0xff) || prefix.get(9).is_some_and(|&b| b & 0x01 == 0) {
            return Err(ProtocolError::BadSignature);
        }
        if let Some(&major) = prefix.get(10) {
            if major < 3 {
                return Err(ProtocolError::UnsupportedVersion { major, minor: prefix.get(11).copied().unwrap_or(0) });
            }
        }
        Ok(())
    }

    pub(crate) fn parse(bytes: &[u8; GREETING_LEN]) -> Result<Greeting, ProtocolError> {
        Greeting::check_prefix(bytes)?;
        let mut mechanism = [0u8; 20];
        mechanism.copy_from_slice(&bytes[12..32]);
        Ok(Greeting { major: bytes[10], minor: bytes[11], mechanism })
    }

    /// The mechanism name, up to its first NUL.
    pub fn mechanism(&self) -> &[u8] {
        let end = self.mechanism.iter().position(|&b| b == 0).unwrap_or(self.mechanism.len());
        &self.mechanism[..end]
    }

    /// Refuses every mechanism but NULL (vLLM does not use CURVE or PLAIN).
    pub(crate) fn require_null(&self) -> Result<(), ProtocolError> {
        if self.mechanism() == b"NULL" {
            Ok(())
        } else {
            Err(ProtocolError::UnsupportedMechanism(String::from_utf8_lossy(self.mechanism()).into_owned()))
        }
    }

    /// Whether the conversation follows ZMTP 3.1 (SUBSCRIBE/CANCEL commands, PING/PONG):
    /// both sides announce at least 3.1.
    pub fn speaks_31(&self) -> bool {
        (self.major, self.minor) >= (OUR_MAJOR, OUR_MINOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_parses_as_31_null() {
        let g = Greeting::parse(&Greeting::ours()).unwrap();
        assert_eq!((g.major, g.minor), (3, 1));
        assert_eq!(g.mechanism(), b"NULL");
        assert!(g.speaks_31());
        g.require_null().unwrap();
    }

    #[test]
    fn refusals_are_early_and_named() {
        assert_eq!(Greeting::check_prefix(b"G"), Err(ProtocolError::BadSignature));
        assert_eq!(Greeting::check_prefix(&[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0]), Err(ProtocolError::BadSignature));
        let mut old = Greeting::ours();
        old[10] = 2;
        assert!(matches!(Greeting::parse(&old), Err(ProtocolError::UnsupportedVersion { major: 2, .. })));
        let mut curve = Greeting::ours();
        curve[12..17].copy_from_slice(b"CURVE");
        let g = Greeting::parse(&curve).unwrap();
        assert_eq!(g.require_null(), Err(ProtocolError::UnsupportedMechanism("CURVE".into())));
        let mut v30 = Greeting::ours();
        v30[11] = 0;
        assert!(!Greeting::parse(&v30).unwrap().speaks_31());
    }
}
