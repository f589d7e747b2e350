//! The body of the `decoder` fuzz target, shared by cargo-fuzz (nightly,
//! `fuzz_targets/decoder.rs`) and the stable, bounded run in the test suite
//! (`indexer/zmtp/tests/it/fuzz_corpus.rs`): arbitrary bytes, fed in chunks whose sizes the input's
//! first bytes choose, with small limits so that every bound is within reach. The decoder must
//! not panic, must hold no more than its bounds allow, and must yield only messages that keep
//! them.

use kvindex_zmtp::decoder::{Decoder, Item, MAX_COMMAND_SIZE};
use kvindex_zmtp::Limits;

pub fn run(data: &[u8]) {
    let limits = Limits { max_frame_size: 1024, max_message_size: 2048, max_parts: 4, ..Limits::default() };
    let (cuts, mut rest) = data.split_at(data.len().min(4));
    let mut decoder = Decoder::new(&limits);
    let mut cut = cuts.iter().cycle();
    while !rest.is_empty() {
        let n = (usize::from(*cut.next().unwrap_or(&255)) + 1).min(rest.len());
        let (mut chunk, tail) = rest.split_at(n);
        rest = tail;
        loop {
            match decoder.decode(&mut chunk) {
                Ok(Some(Item::Message(frames))) => {
                    assert!(frames.len() <= limits.max_parts);
                    assert!(frames.iter().map(|f| f.len()).sum::<usize>() <= limits.max_message_size);
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
            assert!(decoder.held_bytes() <= limits.max_message_size + MAX_COMMAND_SIZE);
        }
    }
}
