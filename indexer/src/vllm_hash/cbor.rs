//! Canonical CBOR exactly as `cbor2.dumps(obj, canonical=True)` writes it, for the only value
//! shapes vLLM ever feeds its `*_cbor` block hashes: the 3-tuple `(parent, tuple(tokens), extra_keys)`
//! and the NONE_HASH seed string.
//!
//! Why hand-written instead of a CBOR crate: the input is a fixed, tiny grammar (unsigned/negative
//! ints, byte strings, text strings, definite arrays, `null`), and the hash is only right if every
//! byte matches cbor2. For these types canonical CBOR has exactly one encoding (shortest-form
//! heads, definite lengths, no floats or maps), so ~60 lines are easy to audit against RFC 8949
//! §4.2.1, while a general crate would add serde plumbing and its own choices (e.g. for big ints)
//! to audit. It also writes straight into a caller-owned buffer, so hashing a block allocates nothing.

use super::internal::InternalHash;
use super::py_value::PyValue;

const MAJOR_UNSIGNED: u8 = 0;
const MAJOR_NEGATIVE: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const MAJOR_TAG: u8 = 6;
const NULL: u8 = 0xf6;
/// cbor2 encodes ints outside the 64-bit head range as tag 2 / tag 3 bignums.
const TAG_POSITIVE_BIGNUM: u64 = 2;
const TAG_NEGATIVE_BIGNUM: u64 = 3;

/// Shortest-form head: canonical CBOR forbids a wider argument than needed.
#[inline]
fn write_head(out: &mut Vec<u8>, major: u8, argument: u64) {
    let major = major << 5;
    if argument < 24 {
        out.push(major | argument as u8);
    } else if argument <= u64::from(u8::MAX) {
        out.extend_from_slice(&[major | 24, argument as u8]);
    } else if argument <= u64::from(u16::MAX) {
        out.push(major | 25);
        out.extend_from_slice(&(argument as u16).to_be_bytes());
    } else if argument <= u64::from(u32::MAX) {
        out.push(major | 26);
        out.extend_from_slice(&(argument as u32).to_be_bytes());
    } else {
        out.push(major | 27);
        out.extend_from_slice(&argument.to_be_bytes());
    }
}

fn write_byte_string(out: &mut Vec<u8>, bytes: &[u8]) {
    write_head(out, MAJOR_BYTES, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(super) fn write_text(out: &mut Vec<u8>, text: &str) {
    write_head(out, MAJOR_TEXT, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

/// Big-endian magnitude bytes without leading zeros, as cbor2's `int.to_bytes(bit_length)` gives.
fn write_bignum(out: &mut Vec<u8>, tag: u64, magnitude_be: &[u8]) {
    let first_nonzero = magnitude_be.iter().position(|&b| b != 0).unwrap_or(magnitude_be.len());
    write_head(out, MAJOR_TAG, tag);
    write_byte_string(out, &magnitude_be[first_nonzero..]);
}

fn write_int(out: &mut Vec<u8>, value: i128) {
    if value >= 0 {
        match u64::try_from(value) {
            Ok(small) => write_head(out, MAJOR_UNSIGNED, small),
            Err(_) => write_bignum(out, TAG_POSITIVE_BIGNUM, &value.to_be_bytes()),
        }
    } else {
        // CBOR stores a negative n as -1 - n, which never overflows for i128.
        let encoded = -1 - value;
        match u64::try_from(encoded) {
            Ok(small) => write_head(out, MAJOR_NEGATIVE, small),
            Err(_) => write_bignum(out, TAG_NEGATIVE_BIGNUM, &encoded.to_be_bytes()),
        }
    }
}

fn write_value(out: &mut Vec<u8>, value: &PyValue) {
    match value {
        PyValue::None => out.push(NULL),
        PyValue::Int(int) => write_int(out, *int),
        PyValue::Str(text) => write_text(out, text),
        PyValue::Bytes(bytes) => write_byte_string(out, bytes),
        PyValue::Tuple(items) => {
            write_head(out, MAJOR_ARRAY, items.len() as u64);
            for item in items {
                write_value(out, item);
            }
        }
    }
}

fn write_internal_hash(out: &mut Vec<u8>, hash: &InternalHash) {
    match hash {
        InternalHash::Digest(digest) => write_byte_string(out, digest.as_bytes()),
        InternalHash::U64(int) => write_head(out, MAJOR_UNSIGNED, *int),
        // Never produced by a CBOR algo (the 256-bit int parent belongs to pickle `sha256`),
        // but encoded the way cbor2 would so the function is total.
        InternalHash::Int256(be) => match be[..24].iter().all(|&b| b == 0) {
            true => {
                let mut low = [0u8; 8];
                low.copy_from_slice(&be[24..]);
                write_head(out, MAJOR_UNSIGNED, u64::from_be_bytes(low));
            }
            false => write_bignum(out, TAG_POSITIVE_BIGNUM, be),
        },
    }
}

/// Appends `cbor2.dumps((parent, tuple(tokens), extra), canonical=True)` to `out`.
pub(super) fn write_block_input(
    out: &mut Vec<u8>,
    parent: &InternalHash,
    tokens: &[u32],
    extra_keys: Option<&PyValue>,
) {
    write_head(out, MAJOR_ARRAY, 3);
    write_internal_hash(out, parent);
    write_head(out, MAJOR_ARRAY, tokens.len() as u64);
    for &token in tokens {
        write_head(out, MAJOR_UNSIGNED, u64::from(token));
    }
    match extra_keys {
        None => out.push(NULL),
        Some(value) => write_value(out, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: &PyValue) -> String {
        let mut out = Vec::new();
        write_value(&mut out, value);
        hex::encode(out)
    }

    #[test]
    fn ints_use_shortest_heads_and_bignum_tags() {
        assert_eq!(encoded(&PyValue::Int(0)), "00");
        assert_eq!(encoded(&PyValue::Int(23)), "17");
        assert_eq!(encoded(&PyValue::Int(24)), "1818");
        assert_eq!(encoded(&PyValue::Int(256)), "190100");
        assert_eq!(encoded(&PyValue::Int(65536)), "1a00010000");
        assert_eq!(encoded(&PyValue::Int(1 << 32)), "1b0000000100000000");
        assert_eq!(encoded(&PyValue::Int(-1)), "20");
        assert_eq!(encoded(&PyValue::Int(-11)), "2a");
        assert_eq!(encoded(&PyValue::Int(-25)), "3818");
        assert_eq!(encoded(&PyValue::Int(1 << 64)), "c249010000000000000000");
        assert_eq!(encoded(&PyValue::Int(-(1 << 64) - 1)), "c349010000000000000000");
    }

    #[test]
    fn text_bytes_tuples_and_none() {
        assert_eq!(encoded(&PyValue::Str("0".into())), "6130");
        assert_eq!(encoded(&PyValue::Bytes(vec![0xab])), "41ab");
        assert_eq!(encoded(&PyValue::Tuple(vec![])), "80");
        assert_eq!(encoded(&PyValue::Tuple(vec![PyValue::None, PyValue::Int(93)])), "82f6185d");
    }
}
