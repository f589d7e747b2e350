//! KV-event dumps: what the sources delivered, recorded for debugging and replayed offline.
//!
//! A dump is JSON Lines, one [`DumpRecord`] per message (the frames in hex, as in the vLLM
//! vectors, plus the receive time and where it came from), gzip-compressed. Gzip members
//! concatenate, so a dump is appendable: every recording session adds a member. Plain JSON
//! Lines are read too, so a captured vector file or a hand-made case replays as well.
//!
//! Dumps contain token ids: they are only written when an operator runs `kvindex record`,
//! within the size and age bounds of [`crate::config::retention::Retention`].
//!
//! A dump is also untrusted input (an operator replays what someone hands them): [`Lines`]
//! streams it a bounded line at a time whatever the gzip expands to, a bad line is a
//! [`BadLine`] (number and reason, never contents) and the run goes on, and a stream that
//! ends early (a `record` killed mid-write) is a [`ReadError`] after every whole line before it.

pub mod offline;
pub mod recorder;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One recorded message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpRecord {
    /// Receive time, Unix seconds.
    #[serde(default)]
    pub t: f64,
    /// `live` (the SUB stream), `replay` (a reply on the replay DEALER) or `disconnect` (a
    /// live connection closed: the streams it carried are cleared; no frames).
    #[serde(default)]
    pub kind: Option<String>,
    /// The pod the stream belongs to (per-pod sources and replay replies); central-mode live
    /// messages name their pod in the topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The model of a per-pod source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The endpoint it came from (`central` for the bound SUB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The live connection a `live` message came on, or a `disconnect` closed (the service's
    /// connection id): a new one for a stream is a reconnect, which resyncs it. Dumps written
    /// before connections were recorded have none: they replay as before, without reconnects
    /// or disconnects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn: Option<u64>,
    pub frames_hex: Vec<String>,
}

impl DumpRecord {
    pub fn is_replay(&self) -> bool {
        self.kind.as_deref() == Some("replay")
    }

    pub fn is_disconnect(&self) -> bool {
        self.kind.as_deref() == Some("disconnect")
    }
}

/// A dump that cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Opens a dump, gzip or plain (by its first two bytes), as a byte stream. Nothing is read
/// ahead beyond the decoder's buffer: [`Lines`] takes it a bounded line at a time.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, DumpError> {
    let io = |source| DumpError::Io { path: path.display().to_string(), source };
    let mut file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(io)?;
    let file = File::open(path).map_err(io)?;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file))))
    } else {
        Ok(Box::new(BufReader::new(file)))
    }
}

/// The longest dump line read by default: every message the service accepts at its default
/// `zmq_max_message_bytes` (16 MiB) is 32 MiB in hex, plus the JSON around it.
pub const DEFAULT_MAX_LINE_BYTES: usize = 40 << 20;

/// One line of a dump, as [`Lines`] yields it.
#[derive(Debug, PartialEq)]
pub enum Line<'a> {
    /// A whole line, without its newline.
    Bytes(&'a [u8]),
    /// A line longer than the bound, skipped as it streamed by (never buffered whole); its
    /// length in bytes.
    TooLong(u64),
}

/// Where a dump stops being readable: every line before `line` was read whole.
#[derive(Debug, thiserror::Error)]
#[error("input ends early at line {line} ({reason}: {source})")]
pub struct ReadError {
    /// The line that could not be read whole (dropped, even if partly read).
    pub line: u64,
    /// `truncated` (the gzip stream ends inside a member, as when `kvindex record` is killed
    /// mid-write), `corrupt` (bad compressed data or checksum) or `io`.
    pub reason: &'static str,
    pub source: std::io::Error,
}

/// A dump's lines, each at most `max` bytes, from a byte stream: memory holds one line (at
/// most `max`), whatever the stream expands to. Not an `Iterator`: each line borrows the
/// reader's buffer, so nothing is allocated per line.
pub struct Lines<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
    /// Bytes of the current line past the bound (it is being skipped), if any.
    skipping: Option<u64>,
    number: u64,
    bytes: u64,
    done: bool,
}

impl<R: BufRead> Lines<R> {
    pub fn new(inner: R, max: usize) -> Lines<R> {
        Lines { inner, max, buf: Vec::new(), skipping: None, number: 0, bytes: 0, done: false }
    }

    /// Uncompressed bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The number of the line last returned (1-based).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The next line and its number; `Ok(None)` at the end. After an `Err` the stream is over
    /// (a decoder cannot resynchronize), and the line it interrupted is not returned. A last
    /// line without a newline is a line when the stream ends cleanly.
    pub fn next_line(&mut self) -> Result<Option<(u64, Line<'_>)>, ReadError> {
        if self.done {
            return Ok(None);
        }
        self.buf.clear();
        self.skipping = None;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(chunk) => chunk,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    self.done = true;
                    let reason = match source.kind() {
                        std::io::ErrorKind::UnexpectedEof => "truncated",
                        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => "corrupt",
                        _ => "io",
                    };
                    return Err(ReadError { line: self.number + 1, reason, source });
                }
            };
            if chunk.is_empty() {
                self.done = true;
                if self.buf.is_empty() && self.skipping.is_none() {
                    return Ok(None);
                }
                break;
            }
            let (take, end) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            match &mut self.skipping {
                Some(skipped) => *skipped += take as u64,
                None if self.buf.len() + take > self.max => {
                    self.skipping = Some((self.buf.len() + take) as u64);
                    self.buf.clear();
                    self.buf.shrink_to(1 << 16);
                }
                None => self.buf.extend_from_slice(&chunk[..take]),
            }
            let used = take + usize::from(end);
            self.inner.consume(used);
            self.bytes += used as u64;
            if end {
                break;
            }
        }
        self.number += 1;
        let line = match self.skipping {
            Some(len) => Line::TooLong(len),
            None => Line::Bytes(&self.buf),
        };
        Ok(Some((self.number, line)))
    }
}

/// Why a line was not usable: its number, a stable reason label, and what is wrong with it
/// (never its contents: dumps hold token ids).
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[error("line {line}: {detail}")]
pub struct BadLine {
    pub line: u64,
    /// `too_long`, `not_utf8`, `json` or `frames_hex`.
    pub reason: &'static str,
    pub detail: String,
}

/// Bad lines of a run: all counted (in total and by reason), the first few kept whole, so a
/// dump of nothing but bad lines costs no memory per line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BadLines {
    pub count: u64,
    pub by_reason: std::collections::BTreeMap<&'static str, u64>,
    pub first: Vec<BadLine>,
}

impl BadLines {
    /// How many bad lines are kept whole.
    pub const KEPT: usize = 20;

    pub fn add(&mut self, bad: BadLine) {
        self.count += 1;
        *self.by_reason.entry(bad.reason).or_default() += 1;
        if self.first.len() < Self::KEPT {
            self.first.push(bad);
        }
    }
}

/// A parsed line: the record and its frames, decoded from hex.
pub type ParsedLine = (DumpRecord, Vec<Vec<u8>>);

/// Hex digits to bytes, by table: the frames are most of a dump's bytes, and the `hex` crate's
/// per-character decoding was a third of `kvindex replay`'s CPU time.
fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    const BAD: u8 = 0xff;
    const TABLE: [u8; 256] = {
        let mut t = [BAD; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err(format!("odd number of digits ({})", bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let (hi, lo) = (TABLE[pair[0] as usize], TABLE[pair[1] as usize]);
        if hi == BAD || lo == BAD {
            return Err(format!("invalid hex digit at {}", 2 * i + usize::from(hi != BAD)));
        }
        out.push(hi << 4 | lo);
    }
    Ok(out)
}

/// What is wrong with a line that is not JSON or not a dump record, without its contents:
/// serde's message up to any quoted value, and the column.
fn json_detail(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let message = message.split(" at line ").next().unwrap_or_default();
    let message = if message.starts_with("missing field") {
        message
    } else {
        message.split(['"', '`']).next().unwrap_or_default().trim_end_matches([' ', ':', ','])
    };
    format!("{message} at column {}", e.column())
}

/// Parses one line; `Ok(None)` for blank lines.
pub fn parse_line(line: &[u8], number: u64) -> Result<Option<ParsedLine>, BadLine> {
    let bad = |reason, detail| BadLine { line: number, reason, detail };
    let text =
        std::str::from_utf8(line).map_err(|e| bad("not_utf8", format!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let record: DumpRecord = serde_json::from_str(text).map_err(|e| bad("json", json_detail(&e)))?;
    let frames = record
        .frames_hex
        .iter()
        .enumerate()
        .map(|(i, f)| decode_hex(f).map_err(|e| bad("frames_hex", format!("frames_hex[{i}]: {e}"))))
        .collect::<Result<_, _>>()?;
    Ok(Some((record, frames)))
}

#[cfg(test)]
mod hex_tests {
    use super::decode_hex;

    #[test]
    fn decodes_like_the_hex_crate_and_names_what_is_wrong() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_hex(&hex::encode(&all)).unwrap(), all);
        assert_eq!(decode_hex(&hex::encode_upper(&all)).unwrap(), all);
        assert_eq!(decode_hex("").unwrap(), Vec::<u8>::new());
        assert_eq!(decode_hex("abc"), Err("odd number of digits (3)".into()));
        assert_eq!(decode_hex("0g"), Err("invalid hex digit at 1".into()));
        assert_eq!(decode_hex("zz00"), Err("invalid hex digit at 0".into()));
        assert_eq!(decode_hex("0é0"), Err("invalid hex digit at 1".into()));
    }
}

#[cfg(test)]
mod lines_tests {
    use std::io::Write;

    use super::{parse_line, Line, Lines};

    fn all(input: &[u8], max: usize) -> (Vec<String>, Option<(u64, &'static str)>) {
        let mut lines = Lines::new(input, max);
        let mut out = Vec::new();
        loop {
            match lines.next_line() {
                Ok(Some((n, Line::Bytes(b)))) => out.push(format!("{n}:{}", String::from_utf8_lossy(b))),
                Ok(Some((n, Line::TooLong(len)))) => out.push(format!("{n}:too long {len}")),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some((e.line, e.reason))),
            }
        }
    }

    #[test]
    fn dump_lines_are_bounded_numbered_and_end_cleanly() {
        let (lines, end) = all(b"ab\n\nabcdef\nabcd\nxyz", 4);
        assert_eq!(lines, ["1:ab", "2:", "3:too long 6", "4:abcd", "5:xyz"]);
        assert_eq!(end, None);
        // A long line spanning many reads of a small buffer is still skipped whole.
        let long = [b"a".repeat(100_000), b"\nok\n".to_vec()].concat();
        let (lines, _) = all(&long, 1000);
        assert_eq!(lines, ["1:too long 100000", "2:ok"]);
        let mut reader = Lines::new(std::io::BufReader::with_capacity(7, &long[..]), 1000);
        assert_eq!(reader.next_line().unwrap(), Some((1, Line::TooLong(100_000))));
        assert!(reader.buf.capacity() < 4096, "a skipped line is not buffered: {}", reader.buf.capacity());
        assert_eq!(reader.next_line().unwrap(), Some((2, Line::Bytes(b"ok"))));
        assert_eq!(reader.next_line().unwrap(), None);
    }

    #[test]
    fn dump_truncated_gzip_yields_whole_lines_then_says_where_it_ends() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for i in 0..2000 {
            writeln!(enc, "line {i} {}", "x".repeat(i % 50)).unwrap();
        }
        let gz = enc.finish().unwrap();
        let cut = &gz[..gz.len() / 2];
        let decoder = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(cut));
        let mut reader = Lines::new(decoder, 1 << 20);
        let mut n = 0;
        let err = loop {
            match reader.next_line() {
                Ok(Some((i, Line::Bytes(b)))) => {
                    n += 1;
                    assert_eq!(i, n);
                    assert!(b.starts_with(format!("line {} ", i - 1).as_bytes()), "{i}");
                }
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
        };
        assert!(n > 100, "the whole lines before the cut are read: {n}");
        assert_eq!((err.line, err.reason), (n + 1, "truncated"), "{err}");
        assert_eq!(reader.next_line().unwrap(), None, "nothing after the end");
    }

    #[test]
    fn dump_bad_lines_name_the_reason_never_the_contents() {
        let secret = "123456789";
        let cases: [(&[u8], &str); 5] = [
            (b"{\"frames_hex\": [\"00\"], \"t\": \"123456789\"}", "json"),
            (b"{\"frames_hex\": [\"0g\"]}", "frames_hex"),
            (b"{\"t\": 1}", "json"),
            (b"[123456789", "json"),
            (b"{\"frames_hex\": [\"00\"], \"pod\": \"\xff123456789\"}", "not_utf8"),
        ];
        for (line, reason) in cases {
            let bad = parse_line(line, 7).unwrap_err();
            assert_eq!((bad.line, bad.reason), (7, reason), "{bad}");
            assert!(!bad.detail.contains(secret), "{bad}");
        }
        assert_eq!(parse_line(b"{\"t\": 1}", 1).unwrap_err().detail, "missing field `frames_hex` at column 8");
        assert_eq!(parse_line(b"  ", 1).unwrap(), None);
        assert!(parse_line(b"{\"frames_hex\": [\"00ff\"]}", 1).unwrap().is_some());
    }
}
