//! A pod's exported engine blocks, as columns.
//!
//! Why columns: a snapshot of ten million residencies is about ten million engine blocks, and
//! one record per block (with its own key and path vectors) costs allocations per block to
//! build, encode, decode and import. Here a pod's blocks are a handful of flat vectors, so a
//! snapshot stores each as bytes and decoding is a bounds-checked copy. A value of this type is
//! always well formed: every count, length and parent link is checked when it is built (by
//! [`EngineBlocks::push`] or [`EngineBlocks::from_columns`]), so a damaged or hostile record is
//! refused whole when it is decoded, and import walks the columns without re-checking them.

use crate::keys::BlockKey;

/// The columns of a pod's engine blocks (`n` blocks, `k` canonical blocks in all).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Columns {
    /// Per engine block (`n`): its scoped engine hash.
    pub engines: Vec<u64>,
    /// Per engine block (`n`): 0 = its chain hangs off the next namespace root of `roots`;
    /// `d` > 0 = it continues block `i - d` (always an earlier block).
    pub parents: Vec<u32>,
    /// The namespace roots of the blocks whose parent is 0, in block order.
    pub roots: Vec<u64>,
    /// Per engine block (`n`): how many canonical blocks it spans (at least one).
    pub counts: Vec<u32>,
    /// Per canonical block (`k`), engine block after engine block, in chain order: its key.
    pub keys: Vec<BlockKey>,
    /// Per canonical block (`k`): the tiers the pod holds it in (bit positions of the export's
    /// tier names).
    pub tiers: Vec<u8>,
    /// Engine blocks (increasing) whose chain continues its parent through a path the pod
    /// does not hold as an engine block of its own (an eviction out of chain order).
    pub path_blocks: Vec<u32>,
    /// Per entry of `path_blocks`: the path's length in canonical blocks (at least one).
    pub path_lens: Vec<u32>,
    /// The paths' block keys, path after path, in chain order.
    pub path_keys: Vec<BlockKey>,
}

/// Why columns do not describe engine blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnError {
    #[error("columns of different lengths: {0}")]
    Lengths(&'static str),
    #[error("engine block {0} continues a block that is not before it")]
    Parent(usize),
    #[error("engine block {0} spans no canonical block")]
    Empty(usize),
    #[error("{0} entries, more than a record may hold")]
    TooMany(usize),
    #[error("path entry {0} is out of order, out of range or empty")]
    Path(usize),
}

/// A pod's engine blocks, every one after the block its chain continues.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineBlocks(Columns);

/// Where an engine block's chain continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainParent {
    /// A namespace root (`keys::namespace_root` of the model or LoRA, group 0).
    Root(u64),
    /// The last block of an earlier engine block of the same export, by index.
    Block(u32),
}

/// One engine block, as [`EngineBlocks::iter`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef<'a> {
    pub engine: u64,
    pub parent: ChainParent,
    /// Block keys of the path between the parent and this block that the pod does not hold.
    pub path: &'a [BlockKey],
    /// Its canonical blocks' keys in chain order, and the pod's tiers of each.
    pub keys: &'a [BlockKey],
    pub tiers: &'a [u8],
}

impl EngineBlocks {
    /// Checks that `c` describes engine blocks: lengths agree, counts add up, every parent is
    /// an earlier block, the roots are one per root-parented block, paths are in order.
    pub fn from_columns(c: Columns) -> Result<Self, ColumnError> {
        let n = c.engines.len();
        if n > u32::MAX as usize || c.keys.len() > u32::MAX as usize || c.path_keys.len() > u32::MAX as usize {
            return Err(ColumnError::TooMany(n.max(c.keys.len()).max(c.path_keys.len())));
        }
        if c.parents.len() != n || c.counts.len() != n {
            return Err(ColumnError::Lengths("engines, parents and counts"));
        }
        if c.tiers.len() != c.keys.len() {
            return Err(ColumnError::Lengths("keys and tiers"));
        }
        if c.path_lens.len() != c.path_blocks.len() {
            return Err(ColumnError::Lengths("path blocks and path lengths"));
        }
        let mut roots = 0usize;
        for (i, &d) in c.parents.iter().enumerate() {
            if d == 0 {
                roots += 1;
            } else if d as usize > i {
                return Err(ColumnError::Parent(i));
            }
        }
        if roots != c.roots.len() {
            return Err(ColumnError::Lengths("roots and root-parented blocks"));
        }
        let mut keys = 0u64;
        for (i, &count) in c.counts.iter().enumerate() {
            if count == 0 {
                return Err(ColumnError::Empty(i));
            }
            keys += u64::from(count);
        }
        if keys != c.keys.len() as u64 {
            return Err(ColumnError::Lengths("counts and keys"));
        }
        let mut path_keys = 0u64;
        let mut after = None;
        for (j, (&b, &len)) in c.path_blocks.iter().zip(&c.path_lens).enumerate() {
            if b as usize >= n || after.is_some_and(|a| b <= a) || len == 0 {
                return Err(ColumnError::Path(j));
            }
            after = Some(b);
            path_keys += u64::from(len);
        }
        if path_keys != c.path_keys.len() as u64 {
            return Err(ColumnError::Lengths("path lengths and path keys"));
        }
        Ok(EngineBlocks(c))
    }

    /// Empty, with room for `blocks` engine blocks of `keys` canonical blocks in all (an
    /// export knows both before it fills the columns, so they grow without copying).
    pub fn with_capacity(blocks: usize, keys: usize) -> Self {
        EngineBlocks(Columns {
            engines: Vec::with_capacity(blocks),
            parents: Vec::with_capacity(blocks),
            counts: Vec::with_capacity(blocks),
            keys: Vec::with_capacity(keys),
            tiers: Vec::with_capacity(keys),
            ..Columns::default()
        })
    }

    pub fn columns(&self) -> &Columns {
        &self.0
    }

    pub fn into_columns(self) -> Columns {
        self.0
    }

    /// Engine blocks.
    pub fn len(&self) -> usize {
        self.0.engines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends an engine block. Refused (nothing appended) unless it spans at least one block,
    /// its keys and tiers agree, and its parent is an earlier block.
    pub fn push(
        &mut self,
        engine: u64,
        parent: ChainParent,
        path: &[BlockKey],
        keys: &[BlockKey],
        tiers: &[u8],
    ) -> Result<(), ColumnError> {
        let c = &mut self.0;
        let i = c.engines.len();
        if keys.is_empty() {
            return Err(ColumnError::Empty(i));
        }
        if keys.len() != tiers.len() {
            return Err(ColumnError::Lengths("keys and tiers"));
        }
        let too_many = |len: usize, add: usize| len + add > u32::MAX as usize;
        if too_many(i, 1) || too_many(c.keys.len(), keys.len()) || too_many(c.path_keys.len(), path.len()) {
            return Err(ColumnError::TooMany(i));
        }
        let d = match parent {
            ChainParent::Root(root) => {
                c.roots.push(root);
                0
            }
            ChainParent::Block(p) if (p as usize) < i => (i - p as usize) as u32,
            ChainParent::Block(_) => return Err(ColumnError::Parent(i)),
        };
        c.engines.push(engine);
        c.parents.push(d);
        c.counts.push(keys.len() as u32);
        if let ([key], [tier]) = (keys, tiers) {
            // The usual engine block (one canonical block): a copy of unknown length is a
            // library call per column, which showed in a large export's profile.
            c.keys.push(*key);
            c.tiers.push(*tier);
        } else {
            c.keys.extend_from_slice(keys);
            c.tiers.extend_from_slice(tiers);
        }
        if !path.is_empty() {
            c.path_blocks.push(i as u32);
            c.path_lens.push(path.len() as u32);
            c.path_keys.extend_from_slice(path);
        }
        Ok(())
    }

    /// Appends the usual engine block of an export in chain order: one canonical block, held
    /// in `tier`, continuing the block appended just before it (what [`EngineBlocks::push`]
    /// appends for `ChainParent::Block(len - 1)` and no path, without its general checks).
    /// Refused (nothing appended) when there is no block before it.
    pub fn push_continuing(&mut self, engine: u64, key: BlockKey, tier: u8) -> Result<(), ColumnError> {
        let c = &mut self.0;
        let i = c.engines.len();
        if i == 0 {
            return Err(ColumnError::Parent(i));
        }
        if i >= u32::MAX as usize || c.keys.len() >= u32::MAX as usize {
            return Err(ColumnError::TooMany(i));
        }
        c.engines.push(engine);
        c.parents.push(1);
        c.counts.push(1);
        c.keys.push(key);
        c.tiers.push(tier);
        Ok(())
    }

    /// The engine blocks in order.
    pub fn iter(&self) -> Blocks<'_> {
        Blocks { c: &self.0, i: 0, key: 0, root: 0, path: 0, path_key: 0 }
    }

    /// Canonical (block, tier) residencies, counted once per key and tier bit.
    pub fn residencies(&self) -> u64 {
        self.0.tiers.iter().map(|t| u64::from(t.count_ones())).sum()
    }
}

impl<'a> IntoIterator for &'a EngineBlocks {
    type Item = BlockRef<'a>;
    type IntoIter = Blocks<'a>;
    fn into_iter(self) -> Blocks<'a> {
        self.iter()
    }
}

/// The engine blocks of an [`EngineBlocks`], in order.
pub struct Blocks<'a> {
    c: &'a Columns,
    i: usize,
    key: usize,
    root: usize,
    path: usize,
    path_key: usize,
}

impl<'a> Iterator for Blocks<'a> {
    type Item = BlockRef<'a>;

    fn next(&mut self) -> Option<BlockRef<'a>> {
        let c = self.c;
        let i = self.i;
        let engine = *c.engines.get(i)?;
        // Well formed (checked when built), so these index within bounds.
        let parent = match c.parents[i] {
            0 => {
                self.root += 1;
                ChainParent::Root(c.roots[self.root - 1])
            }
            d => ChainParent::Block((i - d as usize) as u32),
        };
        let count = c.counts[i] as usize;
        let (keys, tiers) = (&c.keys[self.key..self.key + count], &c.tiers[self.key..self.key + count]);
        self.key += count;
        let path = if c.path_blocks.get(self.path) == Some(&(i as u32)) {
            let len = c.path_lens[self.path] as usize;
            self.path += 1;
            self.path_key += len;
            &c.path_keys[self.path_key - len..self.path_key]
        } else {
            &[]
        };
        self.i += 1;
        Some(BlockRef { engine, parent, path, keys, tiers })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.c.engines.len() - self.i;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Blocks<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EngineBlocks {
        let mut b = EngineBlocks::default();
        b.push(11, ChainParent::Root(7), &[], &[1, 2], &[1, 1]).unwrap();
        b.push(12, ChainParent::Block(0), &[3], &[4], &[3]).unwrap();
        b.push(13, ChainParent::Root(8), &[], &[5], &[1]).unwrap();
        b
    }

    #[test]
    fn blocks_come_back_as_pushed() {
        let b = sample();
        let got: Vec<BlockRef<'_>> = b.iter().collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            BlockRef { engine: 11, parent: ChainParent::Root(7), path: &[], keys: &[1, 2], tiers: &[1, 1] }
        );
        assert_eq!(got[1], BlockRef { engine: 12, parent: ChainParent::Block(0), path: &[3], keys: &[4], tiers: &[3] });
        assert_eq!(got[2].parent, ChainParent::Root(8));
        assert_eq!(b.residencies(), 5);
        assert_eq!(EngineBlocks::from_columns(b.columns().clone()), Ok(b));
    }

    #[test]
    fn push_refuses_what_is_not_an_engine_block() {
        let mut b = sample();
        assert_eq!(b.push(1, ChainParent::Block(3), &[], &[1], &[1]), Err(ColumnError::Parent(3)));
        assert_eq!(b.push(1, ChainParent::Root(0), &[], &[], &[]), Err(ColumnError::Empty(3)));
        assert!(b.push(1, ChainParent::Root(0), &[], &[1], &[]).is_err());
        assert_eq!(b, sample(), "a refused push appends nothing");
    }

    #[test]
    fn every_inconsistent_column_is_refused() {
        let good = sample().into_columns();
        let refused = |f: &dyn Fn(&mut Columns)| {
            let mut c = good.clone();
            f(&mut c);
            EngineBlocks::from_columns(c).is_err()
        };
        assert!(refused(&|c| c.engines.push(1)));
        assert!(refused(&|c| c.parents[0] = 1), "the first block cannot continue an earlier one");
        assert!(refused(&|c| c.parents[1] = 2));
        assert!(refused(&|c| c.parents[1] = 0), "one root short");
        assert!(refused(&|c| c.roots.push(9)));
        assert!(refused(&|c| c.counts[0] = 0));
        assert!(refused(&|c| c.counts[0] = 3));
        assert!(refused(&|c| c.counts[0] = u32::MAX));
        assert!(refused(&|c| {
            c.tiers.pop();
        }));
        assert!(refused(&|c| c.path_blocks[0] = 3), "past the last block");
        assert!(refused(&|c| c.path_lens[0] = 0));
        assert!(refused(&|c| c.path_lens[0] = 2));
        assert!(refused(&|c| {
            c.path_blocks.push(1);
            c.path_lens.push(1);
            c.path_keys.push(1);
        }));
        assert!(!refused(&|_| ()));
    }
}
