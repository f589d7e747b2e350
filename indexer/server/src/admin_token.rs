//! The control plane's bearer token (`admin_token_file`): its rule (16+ printable ASCII
//! characters) and a comparison in constant time. Plain data, apart from the control plane that
//! checks calls with it, so that the configuration can read and check the file (a bad token
//! is a config error naming the key) without importing the control plane.

use std::fmt;

/// The operator's bearer token for the control plane. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Fewest bytes a token may have (a guessable token is no lock).
    pub const MIN_LEN: usize = 16;

    /// The token in `text` (a file's content; surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<AdminToken, String> {
        let token = text.trim();
        if token.len() < Self::MIN_LEN {
            return Err(format!("the token must have at least {} characters", Self::MIN_LEN));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(AdminToken(token.to_string()))
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}
