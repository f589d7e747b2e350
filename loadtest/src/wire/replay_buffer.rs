//! The last `buffer_steps` published batches, kept for the replay ROUTER.
//!
//! vLLM appends every batch it numbered (sent or dropped by the socket) to a
//! `deque(maxlen=buffer_steps)` of `(seq, payload)` and replays from it byte for byte.

use std::collections::VecDeque;

use bytes::Bytes;

#[derive(Debug)]
pub struct ReplayBuffer {
    capacity: usize,
    entries: VecDeque<(u64, Bytes)>,
}

impl ReplayBuffer {
    pub fn new(capacity: usize) -> Self {
        ReplayBuffer { capacity, entries: VecDeque::with_capacity(capacity.min(4096)) }
    }

    pub fn push(&mut self, seq: u64, payload: Bytes) {
        if self.capacity == 0 {
            return;
        }
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((seq, payload));
    }

    /// Every buffered batch with `seq >= start`, oldest first. A start older than the buffer
    /// silently gets what is left, as in vLLM.
    pub fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        self.entries.iter().filter(|(seq, _)| *seq >= start).cloned().collect()
    }

    /// A publisher restart starts a new process: nothing survives.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_window_and_replays_from_a_seq() {
        let mut buffer = ReplayBuffer::new(3);
        for seq in 0..5 {
            buffer.push(seq, Bytes::from(vec![seq as u8]));
        }
        let seqs = |start| buffer.since(start).into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(0), vec![2, 3, 4]);
        assert_eq!(seqs(3), vec![3, 4]);
        assert!(seqs(9).is_empty());
    }
}
