//! The free-block queue: evictable blocks in LRU order, as vLLM's `FreeKVCacheBlockQueue`.
//!
//! A doubly linked list threaded through arrays indexed by block id, so that a cache hit on
//! an evictable block can take it out of the middle in O(1) and allocation pops the oldest
//! block from the front in O(1).

use super::block_id::BlockId;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    queued: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// An empty queue able to hold block ids `0..capacity`.
    pub fn with_capacity(capacity: usize) -> Self {
        FreeQueue {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            queued: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, block: BlockId) -> bool {
        self.queued.get(block as usize).copied().unwrap_or(false)
    }

    /// Appends as the most recently freed block (evicted last).
    pub fn push_back(&mut self, block: BlockId) {
        if self.contains(block) || block as usize >= self.queued.len() {
            return;
        }
        let slot = block as usize;
        self.prev[slot] = self.tail;
        self.next[slot] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.queued[slot] = true;
        self.len += 1;
    }

    /// Takes the least recently freed block (the next one to evict).
    pub fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let block = self.head;
        self.remove(block);
        Some(block)
    }

    /// Takes a block out of the queue wherever it is (a cache hit on an evictable block).
    pub fn remove(&mut self, block: BlockId) {
        if !self.contains(block) {
            return;
        }
        let slot = block as usize;
        let (prev, next) = (self.prev[slot], self.next[slot]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[slot] = NIL;
        self.next[slot] = NIL;
        self.queued[slot] = false;
        self.len -= 1;
    }

    /// Front (next evicted) to back.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cursor = self.head;
        std::iter::from_fn(move || {
            if cursor == NIL {
                return None;
            }
            let block = cursor;
            cursor = self.next[block as usize];
            Some(block)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_lru_order_and_removes_from_the_middle() {
        let mut queue = FreeQueue::with_capacity(5);
        for block in [3, 1, 4, 0, 2] {
            queue.push_back(block);
        }
        queue.remove(4);
        queue.remove(3);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![1, 0, 2]);
        assert_eq!(queue.pop_front(), Some(1));
        queue.push_back(1);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![0, 2, 1]);
        assert_eq!(queue.len(), 3);
        queue.push_back(1); // already queued: no-op
        queue.push_back(99); // out of range: ignored
        assert_eq!(queue.len(), 3);
    }
}
