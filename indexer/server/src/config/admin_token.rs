//! The operator's bearer token for the control plane (`admin_token_file`), checked whole and
//! never printed. Part of the configuration, which reads the file; the control plane's gate
//! that checks a call shares the type and nothing else.

use std::fmt;

/// The operator's bearer token for the control plane. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Fewest bytes a token may have (a guessable token is no lock).
    pub const MIN_LEN: usize = 16;

    /// How the deploy manifests' token begins (deploy/kustomize/admin-token): a Secret the
    /// operator must replace. Everyone can read it in the repository, so it is no lock either.
    pub const PLACEHOLDER_PREFIX: &'static str = "REPLACE-ME";

    /// The token in `text` (a file's content; surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<AdminToken, String> {
        let token = text.trim();
        if token.len() < Self::MIN_LEN {
            return Err(format!("the token must have at least {} characters", Self::MIN_LEN));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        if token.starts_with(Self::PLACEHOLDER_PREFIX) {
            return Err(format!(
                "the token is still the deploy manifests' placeholder (it starts with {}): put a random token in the \
                 Secret kvindex-admin-token (deploy/README.md, \"The admin token\")",
                Self::PLACEHOLDER_PREFIX
            ));
        }
        Ok(AdminToken(token.to_string()))
    }

    /// The `authorization` value that presents this token to a sibling replica (which takes
    /// the same token).
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_whole_and_never_printed() {
        assert!(AdminToken::parse("short").is_err());
        assert!(AdminToken::parse("has a space inside it").is_err());
        let t = AdminToken::parse("  0123456789abcdef\n").unwrap();
        assert!(t.matches("0123456789abcdef"));
        assert!(!t.matches("0123456789abcdeF"));
        assert!(!t.matches("0123456789abcdef0"));
        assert!(!t.matches(""));
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn the_manifests_placeholder_is_refused_by_name() {
        let e = AdminToken::parse("REPLACE-ME-with-a-random-token\n").unwrap_err();
        assert!(e.contains("placeholder") && e.contains("kvindex-admin-token"), "{e}");
        assert!(AdminToken::parse("a-token-without-REPLACE-ME-first").is_ok());
    }
}
