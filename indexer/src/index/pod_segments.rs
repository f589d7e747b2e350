//! A pod's reverse index: the tree segments it holds blocks in, so that clearing or indexing a
//! pod walks only its own segments.
//!
//! Why not the bitmap alone: every store adds the segments it touched, and a bitmap insert is
//! a search through the pod's containers, a cache miss or two per store on a large index. A
//! pod's stores mostly continue the chains its last stores grew, in the same segments, so the
//! few numbers inserted last are remembered and inserting one of them again costs nothing.

use roaring::RoaringBitmap;

/// Remembered insertions, by the segment number's low bits.
const RECENT: usize = 8;
/// No segment has this number (a global number has at most 30 bits).
const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct PodSegments {
    all: RoaringBitmap,
    /// Numbers known to be in `all` (a slot is cleared when its number leaves `all`).
    recent: [u32; RECENT],
}

impl Default for PodSegments {
    fn default() -> Self {
        PodSegments { all: RoaringBitmap::new(), recent: [NONE; RECENT] }
    }
}

impl PodSegments {
    #[inline]
    pub fn insert(&mut self, seg: u32) {
        let slot = &mut self.recent[seg as usize % RECENT];
        if *slot != seg {
            self.all.insert(seg);
            *slot = seg;
        }
    }

    pub fn remove(&mut self, seg: u32) {
        self.all.remove(seg);
        let slot = &mut self.recent[seg as usize % RECENT];
        if *slot == seg {
            *slot = NONE;
        }
    }

    pub fn clear(&mut self) {
        self.all.clear();
        self.recent = [NONE; RECENT];
    }

    pub fn iter(&self) -> roaring::bitmap::Iter<'_> {
        self.all.iter()
    }
}

impl<'a> IntoIterator for &'a PodSegments {
    type Item = u32;
    type IntoIter = roaring::bitmap::Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.all.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_numbers_never_hide_a_removal_or_a_clear() {
        let mut s = PodSegments::default();
        for seg in [3, 11, 3, 19, 3] {
            s.insert(seg);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), [3, 11, 19]);
        s.remove(3);
        s.insert(3);
        assert_eq!(s.iter().collect::<Vec<_>>(), [3, 11, 19], "re-inserted after its removal");
        // 3, 11 and 19 share a slot: one displaced from it is still in the set, and removing
        // a number the slot does not hold leaves the slot's own.
        s.remove(19);
        s.insert(11);
        assert_eq!(s.iter().collect::<Vec<_>>(), [3, 11]);
        s.clear();
        s.insert(11);
        assert_eq!((&s).into_iter().collect::<Vec<_>>(), [11], "inserted after a clear");
    }
}
