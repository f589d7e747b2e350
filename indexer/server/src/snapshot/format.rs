//! The snapshot's records, as stored: versioned, checksummed, and logical.
//!
//! Every value is `KVS` + format version (u8) + XXH3-64 of the body (little-endian) + body, the
//! body being MessagePack of a record below. A record holds what the events established (a
//! pod's engine blocks as prefix keys, scoped engine hashes and tier names; see
//! `kvindex::index::export`) and where its stream stood (the last applied seq), never the
//! in-memory layout and never token ids. Keys are only valid under the key recipe they were
//! made with, so the header records `kvindex::keys::RECIPE_VERSION` and the block size, and a
//! snapshot made under another is not loaded.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use kvindex::{BlockExport, ChainParent, GroupExport, PodExport};

/// Bumped on any change to the records below or their framing.
/// Version 2: engine blocks carry block keys of key recipe 2 and where their chain continues
/// (the chain tree of issue 13), instead of version 1's chained prefix keys.
/// Version 3: stream records end with the pod's KV-cache groups (hybrid engines). A version 2
/// record reads as one without groups: a plain engine, the only kind version 2 recorded.
pub const FORMAT_VERSION: u8 = 3;
/// Older versions this build still reads.
const READS_ALSO: &[u8] = &[2];
const MAGIC: &[u8; 3] = b"KVS";
const HEADER: usize = 3 + 1 + 8;

/// The snapshot as a whole: what it was made under, and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub recipe_version: u32,
    pub block_size: u64,
    pub created_unix_ms: u64,
    /// Stream records written with this header (a load that finds fewer is truncated).
    pub streams: u64,
    pub residencies: u64,
}

/// One stream's pod: where its sequence stood, and what the pod held at that seq.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamRecord {
    /// The stream: its rank-0 pod id and DP rank.
    pub base: String,
    pub rank: u32,
    /// The DP-resolved pod the residencies belong to.
    pub pod: String,
    pub model: String,
    /// The last seq applied to the residencies below.
    pub cursor: u64,
    pub tiers: Vec<String>,
    /// Engine blocks, each after the one it continues.
    pub blocks: Vec<BlockRecord>,
    /// The engine's KV-cache groups by index (None = never seen); empty in version 2.
    #[serde(default)]
    pub groups: Vec<Option<GroupRecord>>,
}

/// One KV-cache group (see `kvindex::index::export::GroupExport`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    pub kind: String,
    pub window: u32,
    pub block_tokens: u32,
}

/// One engine block (see `kvindex::index::export::BlockExport`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// Scoped engine hash.
    pub engine: u64,
    /// The namespace root the chain hangs off, or the index of the earlier block it continues.
    pub root: Option<u64>,
    pub parent: Option<u32>,
    /// Block keys of the path between the parent and this block that the pod does not hold.
    pub path: Vec<u64>,
    /// (block key, tier mask) in chain order.
    pub keys: Vec<(u64, u8)>,
}

impl StreamRecord {
    pub fn new(base: &str, rank: u32, cursor: u64, export: PodExport) -> Self {
        StreamRecord {
            base: base.to_string(),
            rank,
            pod: export.pod,
            model: export.model,
            cursor,
            tiers: export.tiers,
            blocks: export
                .blocks
                .into_iter()
                .map(|b| {
                    let (root, parent) = match b.parent {
                        ChainParent::Root(r) => (Some(r), None),
                        ChainParent::Block(i) => (None, Some(i)),
                    };
                    BlockRecord { engine: b.engine, root, parent, path: b.path, keys: b.keys }
                })
                .collect(),
            groups: export
                .groups
                .into_iter()
                .map(|g| g.map(|g| GroupRecord { kind: g.kind, window: g.window, block_tokens: g.block_tokens }))
                .collect(),
        }
    }

    pub fn export(&self) -> PodExport {
        self.clone().into_export()
    }

    /// The residencies as the index imports them, without copying the blocks.
    pub fn into_export(self) -> PodExport {
        PodExport {
            pod: self.pod,
            model: self.model,
            tiers: self.tiers,
            blocks: self
                .blocks
                .into_iter()
                .map(|b| BlockExport {
                    engine: b.engine,
                    parent: match (b.root, b.parent) {
                        (Some(r), _) => ChainParent::Root(r),
                        (None, p) => ChainParent::Block(p.unwrap_or(u32::MAX)),
                    },
                    path: b.path,
                    keys: b.keys,
                })
                .collect(),
            groups: self
                .groups
                .into_iter()
                .map(|g| g.map(|g| GroupExport { kind: g.kind, window: g.window, block_tokens: g.block_tokens }))
                .collect(),
        }
    }

    pub fn residencies(&self) -> u64 {
        self.blocks.iter().flat_map(|b| &b.keys).map(|(_, t)| u64::from(t.count_ones())).sum()
    }
}

/// Why a stored value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("value shorter than its header ({0} bytes)")]
    Truncated(usize),
    #[error("not a kvindex snapshot value (bad magic)")]
    BadMagic,
    #[error("snapshot format version {found}, this build reads {FORMAT_VERSION}")]
    Version { found: u8 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("undecodable record: {0}")]
    Decode(String),
}

impl FormatError {
    /// Stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FormatError::Truncated(_) => "truncated",
            FormatError::BadMagic => "bad_magic",
            FormatError::Version { .. } => "version",
            FormatError::Checksum => "checksum",
            FormatError::Decode(_) => "decode",
        }
    }
}

pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let body = rmp_serde::to_vec(record).expect("snapshot records always serialize");
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

pub fn decode<T: for<'de> Deserialize<'de>>(value: &[u8]) -> Result<T, FormatError> {
    if value.len() < HEADER {
        return Err(FormatError::Truncated(value.len()));
    }
    if &value[..3] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    if value[3] != FORMAT_VERSION && !READS_ALSO.contains(&value[3]) {
        return Err(FormatError::Version { found: value[3] });
    }
    let sum = u64::from_le_bytes(value[4..HEADER].try_into().expect("8 bytes"));
    let body = &value[HEADER..];
    if xxh3_64(body) != sum {
        return Err(FormatError::Checksum);
    }
    rmp_serde::from_slice(body).map_err(|e| FormatError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> StreamRecord {
        StreamRecord {
            base: "p".into(),
            rank: 0,
            pod: "p".into(),
            model: "m".into(),
            cursor: 7,
            tiers: vec!["GPU".into()],
            blocks: vec![BlockRecord {
                engine: 9,
                root: None,
                parent: Some(0),
                path: vec![3],
                keys: vec![(1, 1), (2, 1)],
            }],
            groups: vec![None, Some(GroupRecord { kind: "sliding_window".into(), window: 64, block_tokens: 32 })],
        }
    }

    #[test]
    fn round_trips_and_refuses_every_damaged_form() {
        let bytes = encode(&record());
        assert_eq!(decode::<StreamRecord>(&bytes).unwrap(), record());
        assert_eq!(decode::<StreamRecord>(&bytes[..5]), Err(FormatError::Truncated(5)));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode::<StreamRecord>(&flipped), Err(FormatError::Checksum));
        let mut version = bytes.clone();
        version[3] = 99;
        assert_eq!(decode::<StreamRecord>(&version), Err(FormatError::Version { found: 99 }));
        assert_eq!(decode::<StreamRecord>(b"XYZ\x01\0\0\0\0\0\0\0\0"), Err(FormatError::BadMagic));
        let cut = &bytes[..bytes.len() - 3];
        assert_eq!(decode::<StreamRecord>(cut), Err(FormatError::Checksum));
    }

    #[test]
    fn a_version_2_record_reads_as_a_plain_engine() {
        // Version 2's stream record: the same fields, without the groups.
        #[derive(Serialize)]
        struct V2 {
            base: String,
            rank: u32,
            pod: String,
            model: String,
            cursor: u64,
            tiers: Vec<String>,
            blocks: Vec<BlockRecord>,
        }
        let r = record();
        let v2 = V2 {
            base: r.base.clone(),
            rank: r.rank,
            pod: r.pod.clone(),
            model: r.model.clone(),
            cursor: r.cursor,
            tiers: r.tiers.clone(),
            blocks: r.blocks.clone(),
        };
        let mut bytes = encode(&v2);
        bytes[3] = 2;
        let read: StreamRecord = decode(&bytes).unwrap();
        assert_eq!(read, StreamRecord { groups: vec![], ..r });
        bytes[3] = 1;
        assert_eq!(decode::<StreamRecord>(&bytes), Err(FormatError::Version { found: 1 }));
    }
}
