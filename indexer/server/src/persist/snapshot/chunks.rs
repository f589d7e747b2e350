//! An index export on the wire (`kvindex.v1.Replica/ExportIndex`): a sequence of values (a
//! header, then stream records, each framed and checksummed as the snapshot store keeps them),
//! each cut into chunks small enough for any gRPC message limit. The receiver puts values
//! back together within a byte bound, so a sibling cannot make it hold more than it agreed to.

use kvindex_proto::kvindex::v1::ExportIndexChunk;

/// The most bytes of a value in one chunk.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The chunks of one value, in order; the last one says it ends the value.
pub fn chunks(value: &[u8]) -> impl Iterator<Item = ExportIndexChunk> + '_ {
    let n = value.len().div_ceil(CHUNK_BYTES).max(1);
    (0..n).map(move |i| {
        let piece = &value[(i * CHUNK_BYTES).min(value.len())..((i + 1) * CHUNK_BYTES).min(value.len())];
        ExportIndexChunk { data: piece.to_vec(), end: i + 1 == n }
    })
}

/// More bytes than the receiver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    pub limit: u64,
}

/// Values put back together from their chunks, at most `limit` bytes in all.
#[derive(Debug)]
pub struct Reassembly {
    current: Vec<u8>,
    received: u64,
    limit: u64,
}

impl Reassembly {
    pub fn new(limit: u64) -> Self {
        Reassembly { current: Vec::new(), received: 0, limit }
    }

    /// Takes a chunk in: the value it ends, if it ends one.
    pub fn push(&mut self, chunk: ExportIndexChunk) -> Result<Option<Vec<u8>>, TooLarge> {
        self.received += chunk.data.len() as u64;
        if self.received > self.limit {
            return Err(TooLarge { limit: self.limit });
        }
        if self.current.is_empty() {
            self.current = chunk.data;
        } else {
            self.current.extend_from_slice(&chunk.data);
        }
        Ok(chunk.end.then(|| std::mem::take(&mut self.current)))
    }

    /// Whether a value was begun and not ended.
    pub fn partial(&self) -> bool {
        !self.current.is_empty()
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_whole_and_a_receiver_bounds_them() {
        let big: Vec<u8> = (0..CHUNK_BYTES * 2 + 5).map(|i| i as u8).collect();
        let small = vec![7u8; 3];
        let empty: Vec<u8> = Vec::new();
        let mut r = Reassembly::new(u64::MAX);
        let mut out = Vec::new();
        for value in [&big, &small, &empty] {
            let parts: Vec<_> = chunks(value).collect();
            assert_eq!(parts.len(), value.len().div_ceil(CHUNK_BYTES).max(1));
            for c in parts {
                out.extend(r.push(c).unwrap());
            }
        }
        assert_eq!(out, vec![big.clone(), small, empty]);
        assert!(!r.partial());
        let mut bounded = Reassembly::new(CHUNK_BYTES as u64 + 1);
        let mut parts = chunks(&big);
        assert_eq!(bounded.push(parts.next().unwrap()), Ok(None));
        assert!(bounded.partial());
        assert_eq!(bounded.push(parts.next().unwrap()), Err(TooLarge { limit: CHUNK_BYTES as u64 + 1 }));
    }
}
