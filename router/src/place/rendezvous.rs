//! Rendezvous (highest-random-weight) hashing: the tie-break every router replica computes the
//! same way without talking. A prompt's key is the indexer's own key of its first block, so
//! every turn of a conversation (and every prompt sharing that first block) ranks the pods in
//! the same order, and removing a pod moves only the prompts that preferred it.

use kvindex::keys::{namespace_root, prompt_keys};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The prompt's tie key: the prefix key of its first full block (as the indexer derives it,
/// model or LoRA namespace and `cache_salt` included), or for a prompt shorter than one block,
/// a hash of all its tokens under the same root.
pub fn prompt_key(namespace: &str, tokens: &[u32], block_size: usize, cache_salt: Option<&str>) -> u64 {
    let root = namespace_root(namespace, 0);
    if block_size > 0 && tokens.len() >= block_size {
        if let Some(first) = prompt_keys(root, &tokens[..block_size], block_size, cache_salt).first() {
            return *first;
        }
    }
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, root ^ xxh3_64_with_seed(cache_salt.unwrap_or("").as_bytes(), 0))
}

/// A key for a prompt the router could not tokenize: its first bytes of text.
pub fn text_key(namespace: &str, text: &str) -> u64 {
    let head = &text.as_bytes()[..text.len().min(256)];
    xxh3_64_with_seed(head, namespace_root(namespace, 0))
}

/// The weight of `pod` for `key`; the highest weight wins a tie.
pub fn weight(key: u64, pod: &str) -> u64 {
    xxh3_64_with_seed(pod.as_bytes(), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_turns_keep_the_first_blocks_key() {
        let turn1: Vec<u32> = (0..40).collect();
        let mut turn2 = turn1.clone();
        turn2.extend(100..180);
        assert_eq!(prompt_key("m", &turn1, 16, None), prompt_key("m", &turn2, 16, None));
        assert_ne!(prompt_key("m", &turn1, 16, None), prompt_key("other", &turn1, 16, None));
        assert_ne!(prompt_key("m", &turn1, 16, None), prompt_key("m", &turn1, 16, Some("salt")));
    }

    #[test]
    fn removing_a_pod_moves_only_the_keys_that_preferred_it() {
        let pods = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"];
        fn best<'a>(key: u64, pods: &[&'a str]) -> &'a str {
            pods.iter().copied().max_by_key(|p| weight(key, p)).unwrap()
        }
        let mut per_pod = [0usize; 4];
        for k in 0..4000u64 {
            let key = prompt_key("m", &[k as u32; 16], 16, None);
            let before = best(key, &pods);
            per_pod[pods.iter().position(|p| *p == before).unwrap()] += 1;
            let after = best(key, &pods[..3]);
            if before != pods[3] {
                assert_eq!(before, after, "a key that did not prefer the removed pod moved");
            }
        }
        assert!(per_pod.iter().all(|&n| n > 800), "spread evenly: {per_pod:?}");
    }
}
