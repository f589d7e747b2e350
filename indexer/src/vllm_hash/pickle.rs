//! Byte-exact CPython 3.11 `pickle.dumps(obj, protocol=5)` (the C `_pickle` pickler) for the
//! value shapes vLLM's `sha256` / `xxhash` block hashes serialize: the 3-tuple
//! `(parent, tuple(tokens), extra_keys)` and the NONE_HASH seed string.
//!
//! Hand-written because no Rust pickle crate promises CPython's exact opcode choices, and the hash
//! depends on every byte. The rules mirrored here (from `Modules/_pickle.c`):
//! * `PROTO 5`, then framing: a frame opens lazily at the first write after PROTO, is checked at
//!   the start of every `save()` and committed once it holds >= 64 KiB, and at the end. A frame
//!   shorter than 4 bytes gets no `FRAME` header. Byte/str payloads >= 64 KiB bypass framing.
//! * ints: `BININT1`/`BININT2`/`BININT` when they fit a signed 32-bit int (negatives always use
//!   `BININT`), otherwise `LONG1`: little-endian two's complement of `bit_length/8 + 1` bytes, one
//!   byte shorter when that top byte is a redundant `0xff` sign byte.
//! * `str`/`bytes`: short/long opcodes by UTF-8 / byte length, then `MEMOIZE`.
//! * tuples: `EMPTY_TUPLE` (never memoized), `TUPLE1..3` for up to 3 items, else `MARK … TUPLE`;
//!   non-empty tuples are memoized after their items.
//! * the memo is keyed by object identity: a second occurrence of the same object is a
//!   `BINGET`/`LONG_BINGET`. Identity does not survive into `PyValue`, so equal `str`/`bytes`
//!   values are treated as one object. That is what CPython does for the realistic repeat (the
//!   same literal, e.g. `"mm"` in two `("mm", id, offset)` keys of one block, is one constant
//!   object). Tuples are rebuilt per call in vLLM, so equal tuples are never shared.

use smallvec::SmallVec;

use super::internal::InternalHash;
use super::py_value::PyValue;

const PROTO: u8 = 0x80;
const PROTOCOL_VERSION: u8 = 5;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NONE: u8 = b'N';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

const FRAME_HEADER_SIZE: usize = 9;
const FRAME_SIZE_MIN: usize = 4;
const FRAME_SIZE_TARGET: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum MemoKind {
    Str,
    Bytes,
}

struct Pickler<'out, 'val> {
    out: &'out mut Vec<u8>,
    framing: bool,
    frame_start: Option<usize>,
    memo_len: u32,
    /// Memoized str/bytes payloads, searched linearly: a block holds a handful at most.
    memoized: SmallVec<[(MemoKind, &'val [u8], u32); 8]>,
}

impl<'out, 'val> Pickler<'out, 'val> {
    fn start(out: &'out mut Vec<u8>) -> Self {
        // PROTO goes out before framing is switched on, exactly as `dump()` does.
        out.extend_from_slice(&[PROTO, PROTOCOL_VERSION]);
        Pickler { out, framing: true, frame_start: None, memo_len: 0, memoized: SmallVec::new() }
    }

    fn finish(mut self) {
        self.write(&[STOP]);
        self.commit_frame();
    }

    #[inline]
    fn write(&mut self, data: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(data);
    }

    fn commit_frame(&mut self) {
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let frame_len = self.out.len() - start - FRAME_HEADER_SIZE;
        if frame_len >= FRAME_SIZE_MIN {
            self.out[start] = FRAME;
            self.out[start + 1..start + FRAME_HEADER_SIZE].copy_from_slice(&(frame_len as u64).to_le_bytes());
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// `_Pickler_OpcodeBoundary`, run at the start of every `save()`.
    #[inline]
    fn opcode_boundary(&mut self) {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET {
                self.commit_frame();
            }
        }
    }

    /// `_Pickler_write_bytes`: large payloads are written outside any frame.
    fn write_payload(&mut self, header: &[u8], payload: &[u8]) {
        let bypass_framing = payload.len() >= FRAME_SIZE_TARGET;
        let framing = self.framing;
        if bypass_framing {
            self.commit_frame();
            self.framing = false;
        }
        self.write(header);
        self.write(payload);
        self.framing = framing;
    }

    fn memoize(&mut self) -> u32 {
        self.write(&[MEMOIZE]);
        let index = self.memo_len;
        self.memo_len += 1;
        index
    }

    /// Emits a memo reference when this payload was already pickled; true if it did.
    fn save_memo_ref(&mut self, kind: MemoKind, payload: &[u8]) -> bool {
        let Some(&(_, _, index)) = self.memoized.iter().find(|(k, p, _)| *k == kind && *p == payload) else {
            return false;
        };
        match u8::try_from(index) {
            Ok(short) => self.write(&[BINGET, short]),
            Err(_) => {
                let mut op = [LONG_BINGET, 0, 0, 0, 0];
                op[1..].copy_from_slice(&index.to_le_bytes());
                self.write(&op);
            }
        }
        true
    }

    fn save_none(&mut self) {
        self.opcode_boundary();
        self.write(&[NONE]);
    }

    fn save_int(&mut self, value: i128) {
        self.opcode_boundary();
        if let Ok(small) = i32::try_from(value) {
            match u32::try_from(small) {
                Ok(nonnegative) => self.save_small_nonnegative(nonnegative),
                Err(_) => {
                    let le = small.to_le_bytes();
                    self.write(&[BININT, le[0], le[1], le[2], le[3]]);
                }
            }
            return;
        }
        let bit_length = 128 - value.unsigned_abs().leading_zeros() as usize;
        // Sign-extended to 17 bytes so that `bit_length/8 + 1` (<= 17) bytes can always be taken.
        let mut le = [if value < 0 { 0xff } else { 0 }; 17];
        le[..16].copy_from_slice(&value.to_le_bytes());
        self.write_long(&le, bit_length, value < 0);
    }

    /// A non-negative big-endian integer (the <= 0.10.1 `sha256` 256-bit hash int).
    fn save_unsigned_be(&mut self, be: &[u8; 32]) {
        self.opcode_boundary();
        let leading_zero_bits: usize = match be.iter().position(|&b| b != 0) {
            Some(first) => first * 8 + be[first].leading_zeros() as usize,
            None => 256,
        };
        if leading_zero_bits >= 256 - 31 {
            let mut low = [0u8; 4];
            low.copy_from_slice(&be[28..]);
            let small = u32::from_be_bytes(low);
            self.save_small_nonnegative(small);
            return;
        }
        let mut le = [0u8; 33];
        for (dst, src) in le.iter_mut().zip(be.iter().rev()) {
            *dst = *src;
        }
        self.write_long(&le, 256 - leading_zero_bits, false);
    }

    fn save_small_nonnegative(&mut self, value: u32) {
        match value {
            0..=0xff => self.write(&[BININT1, value as u8]),
            0x100..=0xffff => {
                let le = (value as u16).to_le_bytes();
                self.write(&[BININT2, le[0], le[1]]);
            }
            _ => {
                let le = value.to_le_bytes();
                self.write(&[BININT, le[0], le[1], le[2], le[3]]);
            }
        }
    }

    /// `save_long`'s LONG1/LONG4 path, given the sign-extended little-endian bytes.
    fn write_long(&mut self, sign_extended_le: &[u8], bit_length: usize, negative: bool) {
        let mut n_bytes = bit_length / 8 + 1;
        if negative && n_bytes > 1 && sign_extended_le[n_bytes - 1] == 0xff && sign_extended_le[n_bytes - 2] & 0x80 != 0
        {
            n_bytes -= 1;
        }
        let data = &sign_extended_le[..n_bytes];
        match u8::try_from(n_bytes) {
            Ok(short) => self.write(&[LONG1, short]),
            Err(_) => {
                let mut op = [LONG4, 0, 0, 0, 0];
                op[1..].copy_from_slice(&(n_bytes as u32).to_le_bytes());
                self.write(&op);
            }
        }
        self.write(data);
    }

    fn save_bytes(&mut self, bytes: &'val [u8]) {
        self.opcode_boundary();
        if self.save_memo_ref(MemoKind::Bytes, bytes) {
            return;
        }
        let len = bytes.len();
        if let Ok(short) = u8::try_from(len) {
            self.write_payload(&[SHORT_BINBYTES, short], bytes);
        } else if let Ok(medium) = u32::try_from(len) {
            let le = medium.to_le_bytes();
            self.write_payload(&[BINBYTES, le[0], le[1], le[2], le[3]], bytes);
        } else {
            let mut op = [0u8; 9];
            op[0] = BINBYTES8;
            op[1..].copy_from_slice(&(len as u64).to_le_bytes());
            self.write_payload(&op, bytes);
        }
        let index = self.memoize();
        self.memoized.push((MemoKind::Bytes, bytes, index));
    }

    fn save_str(&mut self, text: &'val str) {
        self.opcode_boundary();
        let utf8 = text.as_bytes();
        if self.save_memo_ref(MemoKind::Str, utf8) {
            return;
        }
        let len = utf8.len();
        if let Ok(short) = u8::try_from(len) {
            self.write_payload(&[SHORT_BINUNICODE, short], utf8);
        } else if let Ok(medium) = u32::try_from(len) {
            let le = medium.to_le_bytes();
            self.write_payload(&[BINUNICODE, le[0], le[1], le[2], le[3]], utf8);
        } else {
            let mut op = [0u8; 9];
            op[0] = BINUNICODE8;
            op[1..].copy_from_slice(&(len as u64).to_le_bytes());
            self.write_payload(&op, utf8);
        }
        let index = self.memoize();
        self.memoized.push((MemoKind::Str, utf8, index));
    }

    /// `save_tuple` for `len` items; `save_items` pickles the items in order.
    fn save_tuple(&mut self, len: usize, save_items: impl FnOnce(&mut Self)) {
        self.opcode_boundary();
        if len == 0 {
            self.write(&[EMPTY_TUPLE]);
            return;
        }
        if len <= 3 {
            save_items(self);
            self.write(&[[TUPLE1, TUPLE2, TUPLE3][len - 1]]);
        } else {
            self.write(&[MARK]);
            save_items(self);
            self.write(&[TUPLE]);
        }
        self.memoize();
    }

    fn save_value(&mut self, value: &'val PyValue) {
        match value {
            PyValue::None => self.save_none(),
            PyValue::Int(int) => self.save_int(*int),
            PyValue::Str(text) => self.save_str(text),
            PyValue::Bytes(bytes) => self.save_bytes(bytes),
            PyValue::Tuple(items) => self.save_tuple(items.len(), |pickler| {
                for item in items {
                    pickler.save_value(item);
                }
            }),
        }
    }

    fn save_internal_hash(&mut self, hash: &'val InternalHash) {
        match hash {
            InternalHash::Digest(digest) => self.save_bytes(digest.as_bytes()),
            InternalHash::Int256(be) => self.save_unsigned_be(be),
            InternalHash::U64(int) => self.save_int(i128::from(*int)),
        }
    }
}

/// Appends `pickle.dumps((parent, tuple(tokens), extra), protocol=5)` to `out`.
pub(super) fn write_block_input<'val>(
    out: &mut Vec<u8>,
    parent: &'val InternalHash,
    tokens: &[u32],
    extra_keys: Option<&'val PyValue>,
) {
    let mut pickler = Pickler::start(out);
    pickler.save_tuple(3, |pickler| {
        pickler.save_internal_hash(parent);
        pickler.save_tuple(tokens.len(), |pickler| {
            for &token in tokens {
                pickler.save_int(i128::from(token));
            }
        });
        match extra_keys {
            None => pickler.save_none(),
            Some(value) => pickler.save_value(value),
        }
    });
    pickler.finish();
}

/// Appends `pickle.dumps(text, protocol=5)` to `out` (the NONE_HASH seed).
pub(super) fn write_text(out: &mut Vec<u8>, text: &str) {
    let mut pickler = Pickler::start(out);
    pickler.save_str(text);
    pickler.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pickled(value: &PyValue) -> String {
        let mut out = Vec::new();
        let mut pickler = Pickler::start(&mut out);
        pickler.save_value(value);
        pickler.finish();
        hex::encode(out)
    }

    /// The opcodes between the PROTO/FRAME header and STOP.
    fn body(value: &PyValue) -> String {
        let full = pickled(value);
        let without_proto = &full[4..];
        let framed = without_proto.starts_with("95");
        let start = if framed { 18 } else { 0 };
        without_proto[start..without_proto.len() - 2].to_string()
    }

    #[test]
    fn seed_string_matches_cpython() {
        let mut out = Vec::new();
        write_text(&mut out, "0");
        assert_eq!(hex::encode(out), "80059505000000000000008c0130942e");
    }

    #[test]
    fn frames_shorter_than_four_bytes_have_no_header() {
        assert_eq!(pickled(&PyValue::Int(7)), "80054b072e");
        assert_eq!(pickled(&PyValue::Int(256)), "80059504000000000000004d00012e");
    }

    #[test]
    fn int_opcodes_match_cpython() {
        assert_eq!(body(&PyValue::Int(0)), "4b00");
        assert_eq!(body(&PyValue::Int(255)), "4bff");
        assert_eq!(body(&PyValue::Int(65535)), "4dffff");
        assert_eq!(body(&PyValue::Int(65536)), "4a00000100");
        assert_eq!(body(&PyValue::Int(-1)), "4affffffff");
        assert_eq!(body(&PyValue::Int(-27)), "4ae5ffffff");
        assert_eq!(body(&PyValue::Int(2_147_483_647)), "4affffff7f");
        assert_eq!(body(&PyValue::Int(-2_147_483_648)), "4a00000080");
    }

    #[test]
    fn long1_uses_minimal_twos_complement() {
        assert_eq!(body(&PyValue::Int(2_147_483_648)), "8a050000008000");
        assert_eq!(body(&PyValue::Int(4_294_967_295)), "8a05ffffffff00");
        assert_eq!(body(&PyValue::Int(-2_147_483_649)), "8a05ffffff7fff");
        assert_eq!(body(&PyValue::Int(-(1 << 32))), "8a0500000000ff");
        assert_eq!(body(&PyValue::Int(-(1 << 39))), "8a050000000080");
        assert_eq!(body(&PyValue::Int(i128::from(u64::MAX))), "8a09ffffffffffffffff00");
        assert_eq!(body(&PyValue::Int(i128::from(i64::MIN))), "8a080000000000000080");
    }

    #[test]
    fn repeated_string_becomes_binget() {
        let value = PyValue::Tuple(vec![
            PyValue::Tuple(vec![PyValue::Str("mm".into()), PyValue::Int(1)]),
            PyValue::Tuple(vec![PyValue::Str("mm".into()), PyValue::Int(2)]),
        ]);
        // "mm" is memo 0, the first inner tuple memo 1, then BINGET 0 for the second "mm".
        assert_eq!(body(&value), "8c026d6d944b01869468004b0286948694");
    }

    #[test]
    fn large_payload_commits_frames_around_it() {
        let big = "x".repeat(FRAME_SIZE_TARGET);
        let value = PyValue::Tuple(vec![PyValue::Int(1), PyValue::Str(big)]);
        let full = pickled(&value);
        // Frame 1 holds BININT1 1 only (< 4 bytes, no header); the str goes unframed, then a
        // new 4-byte frame holds MEMOIZE TUPLE2 MEMOIZE STOP.
        let mut expected = String::from("80054b01");
        expected.push_str("58");
        expected.push_str(&hex::encode((FRAME_SIZE_TARGET as u32).to_le_bytes()));
        expected.push_str(&hex::encode("x".repeat(FRAME_SIZE_TARGET)));
        expected.push_str("9504000000000000009486942e");
        assert_eq!(full, expected);
    }
}
