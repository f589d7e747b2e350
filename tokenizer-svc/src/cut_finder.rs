//! Every occurrence of a model's cut tokens in a text: the candidate cut points incremental
//! tokenization hashes and looks up (see [`crate::incremental`]). A chat's next turn re-sends
//! its whole history, so this scan runs over the whole prompt on every request, hit or miss.
//!
//! Stepping an overlapping Aho-Corasick automaton through every byte of a 30 kB prompt costs
//! more than half of a cache hit's own work (DeepSeek has ~1,300 cut tokens). But cut tokens
//! usually begin with one of a few bytes (DeepSeek's all begin with `<`), and no cut token
//! occurs inside another (a rule of cut tokens), so none is a prefix of another either: at any
//! position at most one cut token starts. The occurrences are then exactly the anchored
//! matches at the positions of those first bytes, which `memchr` finds with SIMD; the automaton
//! is stepped here from its anchored start (a search call per position costs over 10× more). On the
//! router bench's 30 kB DeepSeek chat: ~10× fewer instructions than the overlapping scan. With
//! more than three distinct first bytes, the overlapping scan is used as before.

use aho_corasick::automaton::Automaton;
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Anchored, Input};

/// Finds the occurrences of a set of patterns none of which occurs inside another.
pub(crate) struct CutFinder {
    automaton: NFA,
    /// The patterns' distinct first bytes, when there are at most three (repeated to three).
    first_bytes: Option<[u8; 3]>,
}

impl CutFinder {
    /// A finder for `patterns` (non-empty strings, none occurring inside another).
    pub(crate) fn new<P: AsRef<[u8]>>(patterns: &[P]) -> Result<Self, aho_corasick::BuildError> {
        let automaton = NFA::new(patterns)?;
        let mut firsts: Vec<u8> = patterns.iter().filter_map(|p| p.as_ref().first().copied()).collect();
        firsts.sort_unstable();
        firsts.dedup();
        let first_bytes = match firsts[..] {
            [a] => Some([a, a, a]),
            [a, b] => Some([a, b, b]),
            [a, b, c] => Some([a, b, c]),
            _ => None,
        };
        Ok(Self { automaton, first_bytes })
    }

    /// `(start, end)` of every occurrence in `text`, ordered by start, at most `limit` of them.
    pub(crate) fn occurrences(&self, text: &str, limit: usize) -> Vec<(usize, usize)> {
        let bytes = text.as_bytes();
        match self.first_bytes {
            Some([a, b, c]) => memchr::memchr3_iter(a, b, c, bytes)
                .filter_map(|at| Some((at, self.end_of_match_at(bytes, at)?)))
                .take(limit)
                .collect(),
            None => self.all_overlapping(text, limit),
        }
    }

    /// The end of the pattern that starts at `at`, if one does: the automaton stepped from its
    /// anchored start (no failure transitions) until it dies. A few instructions per byte,
    /// where a search call costs a few hundred before its first byte.
    fn end_of_match_at(&self, bytes: &[u8], at: usize) -> Option<usize> {
        let nfa = &self.automaton;
        let mut state = nfa.start_state(Anchored::Yes).ok()?;
        for (read, &byte) in bytes[at..].iter().enumerate() {
            state = nfa.next_state(Anchored::Yes, state, byte);
            if !nfa.is_special(state) {
                continue;
            }
            if nfa.is_dead(state) {
                return None;
            }
            // A match state may also hold patterns that end here but start later.
            let len = read + 1;
            if nfa.is_match(state)
                && (0..nfa.match_len(state)).any(|k| nfa.pattern_len(nfa.match_pattern(state, k)) == len)
            {
                return Some(at + len);
            }
        }
        None
    }

    /// The same by stepping the automaton through every byte (ordered by end).
    fn all_overlapping(&self, text: &str, limit: usize) -> Vec<(usize, usize)> {
        // An NFA with standard match semantics (the default) supports overlapping searches.
        let Ok(found) = self.automaton.try_find_overlapping_iter(Input::new(text)) else { return Vec::new() };
        found.take(limit).map(|m| (m.start(), m.end())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Patterns shaped like chat-template tokens, none inside another.
    const PATTERNS: [&str; 6] = ["<｜User｜>", "<｜Assistant｜>", "<|im_start|>", "<|im_end|>", "</think>", "<think>"];

    fn sorted(mut v: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
        v.sort_unstable();
        v
    }

    proptest! {
        #[test]
        fn anchored_matches_at_first_bytes_are_the_overlapping_matches(
            pieces in proptest::collection::vec(
                prop_oneof![
                    (0..PATTERNS.len()).prop_map(|i| PATTERNS[i].to_string()),
                    // Fragments of patterns, so that partial and overlapping matches occur.
                    (0..PATTERNS.len(), 0..12usize).prop_map(|(i, n)| PATTERNS[i].chars().take(n).collect()),
                    "[a-z<|/｜>]{0,6}",
                    "\\PC{0,4}",
                ],
                0..40,
            ),
            set in 1..=PATTERNS.len(),
        ) {
            let text: String = pieces.concat();
            let finder = CutFinder::new(&PATTERNS[..set]).unwrap();
            prop_assert!(finder.first_bytes.is_some());
            prop_assert_eq!(sorted(finder.occurrences(&text, usize::MAX)), sorted(finder.all_overlapping(&text, usize::MAX)));
        }
    }

    #[test]
    fn more_than_three_first_bytes_scan_every_byte() {
        let finder = CutFinder::new(&["<a>", "[b]", "{c}", "(d)"]).unwrap();
        assert!(finder.first_bytes.is_none());
        assert_eq!(finder.occurrences("x(d)<a>[b]", 10), [(1, 4), (4, 7), (7, 10)]);
        assert_eq!(finder.occurrences("x(d)<a>[b]", 2).len(), 2);
    }
}
