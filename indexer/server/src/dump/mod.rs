//! KV-event dumps: what the sources delivered, recorded for debugging and replayed offline.
//!
//! A dump is JSON Lines, one [`DumpRecord`] per message (the frames in hex, as in the vLLM
//! vectors, plus the receive time and where it came from), gzip-compressed. Gzip members
//! concatenate, so a dump is appendable: every recording session adds a member. Plain JSON
//! Lines are read too, so a captured vector file or a hand-made case replays as well.
//!
//! Dumps contain token ids: they are only written when an operator runs `kvindex record`,
//! within the size and age bounds of [`recorder::Retention`].

pub mod offline;
pub mod recorder;
pub mod serve;

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
    /// `live` (the SUB stream) or `replay` (a reply on the replay DEALER).
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
    pub frames_hex: Vec<String>,
}

impl DumpRecord {
    pub fn is_replay(&self) -> bool {
        self.kind.as_deref() == Some("replay")
    }
}

/// Why a dump line was not usable.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("line {line}: {message}")]
    Line { line: u64, message: String },
}

/// Opens a dump, gzip or plain (by its first two bytes), as lines.
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

/// Parses one line; `Ok(None)` for blank lines.
pub fn parse_line(line: &str, number: u64) -> Result<Option<ParsedLine>, DumpError> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let record: DumpRecord =
        serde_json::from_str(line).map_err(|e| DumpError::Line { line: number, message: e.to_string() })?;
    let frames = record
        .frames_hex
        .iter()
        .map(|f| decode_hex(f).map_err(|e| DumpError::Line { line: number, message: format!("frames_hex: {e}") }))
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
