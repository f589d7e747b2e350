//! ZMTP 3 frame headers: one flags byte (MORE, LONG, COMMAND; the other bits must be zero),
//! then the body size in 1 byte (short) or 8 bytes big-endian (long). Writing frames lives
//! here; reading them is the [`crate::decoder`]'s job.

/// Another frame of the same message follows.
pub const MORE: u8 = 0x01;
/// The size is 8 bytes, not 1.
pub const LONG: u8 = 0x02;
/// The frame is a command, not message data.
pub const COMMAND: u8 = 0x04;
/// Bits no ZMTP 3 peer may set.
pub const RESERVED: u8 = !(MORE | LONG | COMMAND);

/// Appends one frame: the shortest header for `body`, then `body`.
pub fn encode(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// Every frame of a message, MORE set on all but the last.
pub fn encode_message<B: AsRef<[u8]>>(frames: &[B]) -> Vec<u8> {
    let size: usize = frames.iter().map(|f| f.as_ref().len() + 9).sum();
    let mut out = Vec::with_capacity(size);
    for (i, f) in frames.iter().enumerate() {
        let flags = if i + 1 < frames.len() { MORE } else { 0 };
        encode(&mut out, flags, f.as_ref());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_headers() {
        let out = encode_message(&[&b"ab"[..], &[7u8; 300][..]]);
        assert_eq!(&out[..4], &[MORE, 2, b'a', b'b']);
        assert_eq!(out[4], LONG);
        assert_eq!(&out[5..13], &300u64.to_be_bytes());
        assert_eq!(out.len(), 4 + 9 + 300);
    }
}
