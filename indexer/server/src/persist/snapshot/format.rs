//! The snapshot's records, as stored: versioned, checksummed, logical and columnar.
//!
//! Every value is `KVS` + format version (u8) + XXH3-64 of the body (little-endian) + body, the
//! body being MessagePack of a record below. A stream record holds where its stream stood (the
//! last applied seq) and what its pod held there (`kvindex::PodExport`: engine blocks as block
//! keys, scoped engine hashes, parent links and tier masks; the pod's KV-cache groups), never
//! the in-memory layout and never token ids. The engine blocks are stored as columns
//! (`kvindex::Columns`), each one MessagePack byte string of little-endian integers, so decoding
//! copies each column once and then checks every length, count and parent link
//! (`EngineBlocks::from_columns`), instead of allocating per block. Keys are only valid under
//! the key recipe they were made with, so the header records `kvindex::keys::RECIPE_VERSION`
//! and the block size, and a snapshot made under another is not loaded.

use std::borrow::Cow;

use serde::{Deserialize, Serialize, Serializer};
use xxhash_rust::xxh3::xxh3_64;

use kvindex::{Columns, EngineBlocks, GroupExport, PodExport, UnitExport};

/// Bumped on any change to the records below or their framing.
/// Version 2: engine blocks carry block keys of key recipe 2 and where their chain continues
/// (the chain tree), instead of version 1's chained prefix keys.
/// Version 3: stream records end with the pod's KV-cache groups (hybrid engines).
/// Version 4: engine blocks as columns; one key per stream (`stream/<rank>/<pod>`), so a
/// snapshot rewrites only the records of streams that moved, and a header that lists every
/// record with its checksum. Older versions are refused (a clean start): a snapshot made by a
/// build of key recipe 2 could not be loaded under recipe 3 anyway.
/// Version 5: stream records end with the pod's engine units (per KV-cache group and tier: the
/// block sizes its events stored since it was last cleared), so a restored pod is never
/// credited at a smaller unit. Version 4 is still read: its pods' units come from their engine
/// blocks' spans (`kvindex::KvIndex::import_pod`).
/// Version 6: records are unchanged; the store keeps each one under the generation of the
/// snapshot that wrote it ([`record_key`]), so a snapshot streams its records into the store
/// as they are exported and only its header commits them, and the header names each record's
/// generation. Version 5 stores (records under their stream keys) still load.
pub const FORMAT_VERSION: u8 = 6;
/// The oldest version this build still reads.
const OLDEST_READ: u8 = 4;
const MAGIC: &[u8; 3] = b"KVS";
const HEADER: usize = 3 + 1 + 8;

/// The snapshot as a whole: what it was made under, and which records it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub recipe_version: u32,
    pub block_size: u64,
    pub created_unix_ms: u64,
    pub residencies: u64,
    /// Every stream record of this snapshot, by key, with its value's checksum: a load that
    /// finds another set (a record lost, damaged, or left from another snapshot) is refused.
    pub streams: Vec<(String, u64)>,
    /// The snapshot's generation: every record it wrote is stored under it (0: a version-5
    /// store, or an export for a sibling, which is not stored).
    #[serde(default)]
    pub generation: u64,
    /// Per entry of `streams`: the generation its record is stored under ([`record_key`]).
    /// Empty: every record is stored under its stream key (version 5).
    #[serde(default)]
    pub generations: Vec<u64>,
}

impl Header {
    /// The store key of each listed record, with its stream key and checksum.
    pub fn record_keys(&self) -> impl Iterator<Item = (String, &str, u64)> + '_ {
        self.streams.iter().enumerate().map(|(i, (key, sum))| {
            let stored = match self.generations.get(i) {
                Some(&generation) => record_key(generation, key),
                None => key.clone(),
            };
            (stored, key.as_str(), *sum)
        })
    }
}

/// The store key of a stream's record written by snapshot `generation`: a snapshot never
/// overwrites a record the stored header lists, so records can go to the store as they are
/// exported and a crash before the header leaves the previous snapshot whole.
pub fn record_key(generation: u64, stream_key: &str) -> String {
    format!("{RECORD_PREFIX}{generation:016x}/{stream_key}")
}

/// The prefix of every [`record_key`].
pub const RECORD_PREFIX: &str = "rec/";

/// The generation a [`record_key`] was written under (None: not a record key).
pub fn record_generation(key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(RECORD_PREFIX.as_bytes())?;
    let hex = std::str::from_utf8(rest.get(..16)?).ok()?;
    (rest.get(16) == Some(&b'/')).then_some(())?;
    u64::from_str_radix(hex, 16).ok()
}

/// One stream's pod: where its sequence stood, and what the pod held at that seq.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    /// The stream: its rank-0 pod id and DP rank.
    pub base: String,
    pub rank: u32,
    /// The last seq applied to the residencies below.
    pub cursor: u64,
    /// The DP-resolved pod's residencies at `cursor`.
    pub export: PodExport,
}

/// The store key of a stream's record: the rank first, so no pod name can be read as another.
pub fn stream_key(base: &str, rank: u32) -> String {
    format!("stream/{rank}/{base}")
}

impl StreamRecord {
    pub fn new(base: &str, rank: u32, cursor: u64, export: PodExport) -> Self {
        StreamRecord { base: base.to_string(), rank, cursor, export }
    }

    pub fn key(&self) -> String {
        stream_key(&self.base, self.rank)
    }

    /// The DP-resolved pod the residencies belong to.
    pub fn pod(&self) -> &str {
        &self.export.pod
    }

    pub fn model(&self) -> &str {
        &self.export.model
    }

    /// The residencies as the index imports them.
    pub fn into_export(self) -> PodExport {
        self.export
    }

    pub fn residencies(&self) -> u64 {
        self.export.residencies()
    }
}

/// A stream record as MessagePack sees it: the columns are byte strings.
#[derive(Serialize, Deserialize)]
struct WireRecord<'a> {
    base: String,
    rank: u32,
    pod: String,
    model: String,
    cursor: u64,
    tiers: Vec<String>,
    /// The engine's KV-cache groups by index (None = never seen): kind, window, block tokens.
    groups: Vec<Option<(String, u32, u32)>>,
    #[serde(borrow)]
    blocks: WireColumns<'a>,
    /// The pod's engine units: (group, tier name, unit in canonical blocks). Absent before
    /// version 5.
    #[serde(default)]
    units: Vec<(u32, String, u32)>,
}

/// `kvindex::Columns`, each column little-endian (u64, u32 or u8 per entry).
#[derive(Serialize, Deserialize)]
struct WireColumns<'a> {
    #[serde(serialize_with = "bin")]
    engines: &'a [u8],
    #[serde(serialize_with = "bin")]
    parents: &'a [u8],
    #[serde(serialize_with = "bin")]
    roots: &'a [u8],
    #[serde(serialize_with = "bin")]
    counts: &'a [u8],
    #[serde(serialize_with = "bin")]
    keys: &'a [u8],
    #[serde(serialize_with = "bin")]
    tiers: &'a [u8],
    #[serde(serialize_with = "bin")]
    path_blocks: &'a [u8],
    #[serde(serialize_with = "bin")]
    path_lens: &'a [u8],
    #[serde(serialize_with = "bin")]
    path_keys: &'a [u8],
}

/// A byte string, not an array of numbers (serde writes `&[u8]` as a sequence by default).
fn bin<S: Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

fn le64(v: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 8);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn le32(v: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn read64(bytes: &[u8], column: &str) -> Result<Vec<u64>, FormatError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(FormatError::Decode(format!("column {column}: {} bytes, not whole u64s", bytes.len())));
    }
    Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

fn read32(bytes: &[u8], column: &str) -> Result<Vec<u32>, FormatError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(FormatError::Decode(format!("column {column}: {} bytes, not whole u32s", bytes.len())));
    }
    Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// Why a stored value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("value shorter than its header ({0} bytes)")]
    Truncated(usize),
    #[error("not a kvindex snapshot value (bad magic)")]
    BadMagic,
    #[error("snapshot format version {found}, this build reads {OLDEST_READ} to {FORMAT_VERSION}")]
    Version { found: u8 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("undecodable record: {0}")]
    Decode(String),
    #[error("inconsistent engine blocks: {0}")]
    Columns(#[from] kvindex::ColumnError),
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
            FormatError::Columns(_) => "columns",
        }
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&xxh3_64(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of a framed value, once its magic, version and checksum are right.
fn unframe(value: &[u8]) -> Result<&[u8], FormatError> {
    if value.len() < HEADER {
        return Err(FormatError::Truncated(value.len()));
    }
    if &value[..3] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    if !(OLDEST_READ..=FORMAT_VERSION).contains(&value[3]) {
        return Err(FormatError::Version { found: value[3] });
    }
    let body = &value[HEADER..];
    if Some(xxh3_64(body)) != checksum_of(value) {
        return Err(FormatError::Checksum);
    }
    Ok(body)
}

/// The checksum a framed value carries (not verified; see [`decode`]).
pub fn checksum_of(value: &[u8]) -> Option<u64> {
    value.get(4..HEADER).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

/// A header (or any other small record), framed.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    frame(&rmp_serde::to_vec(record).expect("snapshot records always serialize"))
}

pub fn decode<T: for<'de> Deserialize<'de>>(value: &[u8]) -> Result<T, FormatError> {
    rmp_serde::from_slice(unframe(value)?).map_err(|e| FormatError::Decode(e.to_string()))
}

/// A stream record, framed, its engine blocks as columns. Written straight into the value
/// the store takes: each column is viewed as its little-endian bytes where the machine is
/// little-endian (not copied), and the body is serialized after a header whose checksum is
/// filled in last (not framed by a second copy). At ten million residencies a snapshot
/// encodes a quarter of a gigabyte, and each copy of it costs.
pub fn encode_record(record: &StreamRecord) -> Vec<u8> {
    let e = &record.export;
    let c = e.blocks.columns();
    let (engines, parents, roots, counts) =
        (le_bytes(&c.engines), le_bytes(&c.parents), le_bytes(&c.roots), le_bytes(&c.counts));
    let (keys, path_blocks, path_lens, path_keys) =
        (le_bytes(&c.keys), le_bytes(&c.path_blocks), le_bytes(&c.path_lens), le_bytes(&c.path_keys));
    let wire = WireRecord {
        base: record.base.clone(),
        rank: record.rank,
        pod: e.pod.clone(),
        model: e.model.clone(),
        cursor: record.cursor,
        tiers: e.tiers.clone(),
        groups: e.groups.iter().map(|g| g.as_ref().map(|g| (g.kind.clone(), g.window, g.block_tokens))).collect(),
        blocks: WireColumns {
            engines: &engines,
            parents: &parents,
            roots: &roots,
            counts: &counts,
            keys: &keys,
            tiers: &c.tiers,
            path_blocks: &path_blocks,
            path_lens: &path_lens,
            path_keys: &path_keys,
        },
        units: e.units.iter().map(|u| (u.group, u.tier.clone(), u.blocks)).collect(),
    };
    // The columns and, generously, everything else: grown once at most.
    let columns = [&engines, &parents, &roots, &counts, &keys, &path_blocks, &path_lens, &path_keys]
        .iter()
        .map(|b| b.len())
        .sum::<usize>()
        + c.tiers.len();
    let mut out = Vec::with_capacity(HEADER + columns + 4096);
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&[0; 8]);
    rmp_serde::encode::write(&mut out, &wire).expect("snapshot records always serialize");
    let sum = xxh3_64(&out[HEADER..]);
    out[4..HEADER].copy_from_slice(&sum.to_le_bytes());
    out
}

/// A column's entries as little-endian bytes: the column itself on a little-endian machine.
fn le_bytes<T: bytemuck::Pod + LeBytes>(v: &[T]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        Cow::Owned(T::le(v))
    }
}

/// Little-endian bytes of a column of integers, copied (a big-endian machine).
trait LeBytes: Sized {
    fn le(v: &[Self]) -> Vec<u8>;
}

impl LeBytes for u64 {
    fn le(v: &[u64]) -> Vec<u8> {
        le64(v)
    }
}

impl LeBytes for u32 {
    fn le(v: &[u32]) -> Vec<u8> {
        le32(v)
    }
}

/// A stream record, verified (framing, checksum) and checked (every column against the others).
pub fn decode_record(value: &[u8]) -> Result<StreamRecord, FormatError> {
    let wire: WireRecord<'_> =
        rmp_serde::from_slice(unframe(value)?).map_err(|e| FormatError::Decode(e.to_string()))?;
    let w = &wire.blocks;
    let columns = Columns {
        engines: read64(w.engines, "engines")?,
        parents: read32(w.parents, "parents")?,
        roots: read64(w.roots, "roots")?,
        counts: read32(w.counts, "counts")?,
        keys: read64(w.keys, "keys")?,
        tiers: w.tiers.to_vec(),
        path_blocks: read32(w.path_blocks, "path_blocks")?,
        path_lens: read32(w.path_lens, "path_lens")?,
        path_keys: read64(w.path_keys, "path_keys")?,
    };
    let export = PodExport {
        pod: wire.pod,
        model: wire.model,
        tiers: wire.tiers,
        blocks: EngineBlocks::from_columns(columns)?,
        groups: wire
            .groups
            .into_iter()
            .map(|g| g.map(|(kind, window, block_tokens)| GroupExport { kind, window, block_tokens }))
            .collect(),
        units: wire.units.into_iter().map(|(group, tier, blocks)| UnitExport { group, tier, blocks }).collect(),
    };
    Ok(StreamRecord { base: wire.base, rank: wire.rank, cursor: wire.cursor, export })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvindex::ChainParent;

    fn record() -> StreamRecord {
        let mut blocks = EngineBlocks::default();
        blocks.push(9, ChainParent::Root(4), &[], &[1, 2], &[1, 1]).unwrap();
        blocks.push(10, ChainParent::Block(0), &[3], &[5], &[3]).unwrap();
        let export = PodExport {
            pod: "p".into(),
            model: "m".into(),
            tiers: vec!["GPU".into(), "CPU".into()],
            blocks,
            groups: vec![None, Some(GroupExport { kind: "sliding_window".into(), window: 64, block_tokens: 32 })],
            units: vec![
                UnitExport { group: 0, tier: "GPU".into(), blocks: 2 },
                UnitExport { group: 1, tier: "GPU".into(), blocks: 4 },
            ],
        };
        StreamRecord::new("p", 0, 7, export)
    }

    /// A record's columns copied out as little-endian bytes (how records were encoded before
    /// they were written in place).
    struct CopiedColumns([Vec<u8>; 8]);

    impl CopiedColumns {
        fn of(c: &Columns) -> Self {
            CopiedColumns([
                le64(&c.engines),
                le32(&c.parents),
                le64(&c.roots),
                le32(&c.counts),
                le64(&c.keys),
                le32(&c.path_blocks),
                le32(&c.path_lens),
                le64(&c.path_keys),
            ])
        }

        fn wire<'a>(&'a self, tiers: &'a [u8]) -> WireColumns<'a> {
            let [engines, parents, roots, counts, keys, path_blocks, path_lens, path_keys] = &self.0;
            WireColumns { engines, parents, roots, counts, keys, tiers, path_blocks, path_lens, path_keys }
        }
    }

    /// The record written in place is byte for byte the one framed from a serialized copy
    /// with every column copied out as little-endian bytes (what records were written as
    /// before): the format did not change, so every stored snapshot still loads.
    #[test]
    fn a_record_encodes_byte_for_byte_as_a_framed_copy() {
        let r = record();
        let e = &r.export;
        let c = e.blocks.columns();
        let copied_columns = CopiedColumns::of(c);
        let copied = WireRecord {
            base: r.base.clone(),
            rank: r.rank,
            pod: e.pod.clone(),
            model: e.model.clone(),
            cursor: r.cursor,
            tiers: e.tiers.clone(),
            groups: e.groups.iter().map(|g| g.as_ref().map(|g| (g.kind.clone(), g.window, g.block_tokens))).collect(),
            blocks: copied_columns.wire(&c.tiers),
            units: e.units.iter().map(|u| (u.group, u.tier.clone(), u.blocks)).collect(),
        };
        assert_eq!(encode_record(&r), encode(&copied));
        assert!(!c.path_keys.is_empty() && !c.roots.is_empty(), "every kind of column is in the record");
    }

    /// A record as version 4 wrote it (no units) still loads: its pod's units come from its
    /// blocks' spans when it is imported.
    #[test]
    fn a_version_4_record_loads_without_units() {
        #[derive(Serialize)]
        struct V4<'a> {
            base: String,
            rank: u32,
            pod: String,
            model: String,
            cursor: u64,
            tiers: Vec<String>,
            groups: Vec<Option<(String, u32, u32)>>,
            blocks: WireColumns<'a>,
        }
        let r = record();
        let c = r.export.blocks.columns();
        let copied_columns = CopiedColumns::of(c);
        let v4 = V4 {
            base: "p".into(),
            rank: 0,
            pod: "p".into(),
            model: "m".into(),
            cursor: 7,
            tiers: r.export.tiers.clone(),
            groups: vec![None, Some(("sliding_window".into(), 64, 32))],
            blocks: copied_columns.wire(&c.tiers),
        };
        let mut bytes = frame(&rmp_serde::to_vec(&v4).unwrap());
        bytes[3] = 4;
        let decoded = decode_record(&bytes).unwrap();
        assert!(decoded.export.units.is_empty());
        assert_eq!(decoded.export, PodExport { units: Vec::new(), ..r.export });
    }

    #[test]
    fn round_trips_and_refuses_every_damaged_form() {
        let bytes = encode_record(&record());
        assert_eq!(decode_record(&bytes).unwrap(), record());
        assert_eq!(decode_record(&bytes[..5]), Err(FormatError::Truncated(5)));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_record(&flipped), Err(FormatError::Checksum));
        let mut version = bytes.clone();
        version[3] = 99;
        assert_eq!(decode_record(&version), Err(FormatError::Version { found: 99 }));
        assert_eq!(decode_record(b"XYZ\x01\0\0\0\0\0\0\0\0"), Err(FormatError::BadMagic));
        let cut = &bytes[..bytes.len() - 3];
        assert_eq!(decode_record(cut), Err(FormatError::Checksum));
        let mut next = bytes.clone();
        next[3] = FORMAT_VERSION + 1;
        assert_eq!(decode_record(&next), Err(FormatError::Version { found: FORMAT_VERSION + 1 }));
        for old in [1, 2, 3] {
            let mut v = bytes.clone();
            v[3] = old;
            assert_eq!(decode_record(&v), Err(FormatError::Version { found: old }), "format {old} is refused");
        }
    }

    /// A record whose checksum is right but whose columns lie (a bug, or a hostile writer):
    /// refused, never imported.
    #[test]
    fn a_well_framed_record_with_inconsistent_columns_is_refused() {
        let r = record();
        let c = r.export.blocks.columns();
        let (engines, roots, keys, path_keys) = (le64(&c.engines), le64(&c.roots), le64(&c.keys), le64(&c.path_keys));
        let wire = |parents: &[u32], counts: &[u32], ragged: bool| {
            let (parents, counts, pb, pl) = (le32(parents), le32(counts), le32(&c.path_blocks), le32(&c.path_lens));
            let engines = if ragged { &engines[..engines.len() - 1] } else { &engines[..] };
            encode(&WireRecord {
                base: "p".into(),
                rank: 0,
                pod: "p".into(),
                model: "m".into(),
                cursor: 7,
                tiers: vec![],
                groups: vec![],
                units: vec![],
                blocks: WireColumns {
                    engines,
                    parents: &parents,
                    roots: &roots,
                    counts: &counts,
                    keys: &keys,
                    tiers: &c.tiers,
                    path_blocks: &pb,
                    path_lens: &pl,
                    path_keys: &path_keys,
                },
            })
        };
        assert!(decode_record(&wire(&c.parents, &c.counts, false)).is_ok());
        let refused = |v: Vec<u8>| decode_record(&v).map_err(|e| e.label());
        assert_eq!(refused(wire(&[0, 2], &c.counts, false)), Err("columns"), "a parent after the block");
        assert_eq!(refused(wire(&[0, 0], &c.counts, false)), Err("columns"), "a root the roots lack");
        assert_eq!(refused(wire(&c.parents, &[2, 2], false)), Err("columns"), "more keys than stored");
        assert_eq!(refused(wire(&c.parents, &[u32::MAX, 1], false)), Err("columns"));
        assert_eq!(refused(wire(&c.parents, &c.counts, true)), Err("decode"), "a ragged column");
        // A column of another type where bytes belong.
        let body = rmp_serde::to_vec(&("p", 0, "p", "m", 7, Vec::<String>::new(), (), [1u8, 2, 3])).unwrap();
        assert_eq!(decode_record(&frame(&body)).map_err(|e| e.label()), Err("decode"));
    }

    #[test]
    fn headers_round_trip() {
        let h = Header {
            recipe_version: 2,
            block_size: 16,
            created_unix_ms: 1,
            residencies: 3,
            streams: vec![(stream_key("p", 0), 5)],
            generation: 9,
            generations: vec![7],
        };
        assert_eq!(decode::<Header>(&encode(&h)).unwrap(), h);
        assert_eq!(stream_key("a/b", 1), "stream/1/a/b");
        let keys: Vec<_> = h.record_keys().collect();
        assert_eq!(keys, vec![(record_key(7, "stream/0/p"), "stream/0/p", 5)]);
        assert_eq!(record_generation(record_key(7, "stream/0/p").as_bytes()), Some(7));
        assert_eq!(record_generation(b"stream/0/p"), None);
        assert_eq!(record_generation(b"rec/12/stream/0/p"), None);
        // A version-5 header (no generations) still decodes: its records under stream keys.
        #[derive(Serialize)]
        struct V5 {
            recipe_version: u32,
            block_size: u64,
            created_unix_ms: u64,
            residencies: u64,
            streams: Vec<(String, u64)>,
        }
        let v5 =
            V5 { recipe_version: 2, block_size: 16, created_unix_ms: 1, residencies: 3, streams: h.streams.clone() };
        let mut bytes = encode(&v5);
        bytes[3] = 5;
        let old: Header = decode(&bytes).unwrap();
        assert_eq!((old.generation, old.generations.len()), (0, 0));
        assert_eq!(old.record_keys().next().unwrap().0, "stream/0/p");
    }
}
