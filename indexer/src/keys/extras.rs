//! Extras: the per-block identifiers (cache salt, multimodal items, lookahead tokens) folded
//! into a block's key, in one canonical byte encoding shared by the event and query paths,
//! so that a salted or multimodal block never shares a key with a plain one.

/// Canonical byte encoding of a block's extras, shared by the event and query paths.
///
/// Items are appended in order; each is a type byte, then its payload, so that no two
/// different item lists encode to the same bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Extras(Vec<u8>);

impl Extras {
    pub fn new() -> Self {
        Self(Vec::new())
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn push_str(&mut self, s: &str) {
        self.0.push(b's');
        self.push_len_prefixed(s.as_bytes());
    }

    pub fn push_bytes(&mut self, b: &[u8]) {
        self.0.push(b'b');
        self.push_len_prefixed(b);
    }

    pub fn push_int(&mut self, v: i128) {
        self.0.push(b'i');
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub fn push_tokens(&mut self, tokens: &[u32]) {
        self.0.push(b't');
        self.0.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            self.0.extend_from_slice(&t.to_le_bytes());
        }
    }

    /// Opens a nested list of `len` items (a multimodal `(identifier, offset)` pair, say).
    pub fn push_list(&mut self, len: usize) {
        self.0.push(b'l');
        self.0.extend_from_slice(&(len as u64).to_le_bytes());
    }

    /// Marks a value kvindex cannot name (a float, a map): still distinct from a plain block.
    pub fn push_opaque(&mut self, tag: u8) {
        self.0.push(b'?');
        self.0.push(tag);
    }

    fn push_len_prefixed(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extras_encoding_is_unambiguous() {
        let mut a = Extras::new();
        a.push_str("ab");
        a.push_str("c");
        let mut b = Extras::new();
        b.push_str("a");
        b.push_str("bc");
        assert_ne!(a, b);
        let mut c = Extras::new();
        c.push_bytes(b"ab");
        let mut d = Extras::new();
        d.push_str("ab");
        assert_ne!(c, d);
    }
}
