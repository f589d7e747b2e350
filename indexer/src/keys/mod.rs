//! Prefix keys: our own chained block identity, computed from token ids.
//!
//! The index never uses the engine's block hash for matching. Both the event path (from the
//! `token_ids` a `BlockStored` carries) and the query path (from the prompt) compute the same
//! key, so vLLM's hash algorithm, seed and release do not matter. The recipe is chosen for
//! speed because it sits on every query's critical path and the chain is serial:
//!
//! ```text
//! root(ns, group) = XXH3-64(utf8(ns), seed = RECIPE_SEED ^ group)     ns = model, or LoRA name
//! key_i           = XXH3-64(le_u32(tokens_i), seed = key_{i-1})       key_{-1} = root
//!                   (with extras: seed = XXH3-64(canonical(extras_i), seed = key_{i-1}))
//! ```
//!
//! Extras are the per-block identifiers vLLM folds into its own hash: the `cache_salt` on block
//! 0, multimodal identifiers on the blocks they cover, lookahead tokens. A block with extras
//! can never share a key with a plain block of the same tokens, so a text-only query is never
//! credited with a multimodal or salted block.
//!
//! The recipe is persisted by snapshots: any change to it must bump [`RECIPE_VERSION`].

pub mod extra_keys;
pub mod extras;
pub mod namespace;

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use extras::Extras;
pub use namespace::namespace_of;

/// Version of the key recipe; part of every snapshot's header.
pub const RECIPE_VERSION: u32 = 1;

/// Distinguishes kvindex's namespace roots from any other use of XXH3 with small seeds.
const RECIPE_SEED: u64 = 0x6b76_696e_6465_7801; // "kvindex" + version byte

/// Prefix key of one canonical block.
pub type PrefixKey = u64;

/// The key every chain in namespace `ns` (model or LoRA name) and KV-cache group starts from.
pub fn namespace_root(ns: &str, group: u32) -> PrefixKey {
    xxh3_64_with_seed(ns.as_bytes(), RECIPE_SEED ^ u64::from(group))
}

/// Key of a block whose parent key is `parent` and whose canonical extras encode to `extras`
/// (empty for a plain block).
#[inline]
pub fn block_key(parent: PrefixKey, tokens: &[u32], extras: &[u8]) -> PrefixKey {
    let seed = if extras.is_empty() { parent } else { xxh3_64_with_seed(extras, parent) };
    xxh3_64_with_seed(token_bytes(tokens), seed)
}

/// Token ids as little-endian bytes, without copying on little-endian machines.
#[cfg(target_endian = "little")]
#[inline]
fn token_bytes(tokens: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding and every byte pattern is a valid u8; the length is exact and
    // the alignment of u8 is 1. On little-endian targets this is the documented byte order.
    unsafe { std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens)) }
}

#[cfg(not(target_endian = "little"))]
fn token_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>().into()
}

/// Keys of every full canonical block of a prompt; a partial trailing block gets none.
///
/// `cache_salt`, when given, is folded into block 0 exactly as a `BlockStored` whose first
/// block carries the salt as its only extra key.
pub fn prompt_keys(root: PrefixKey, tokens: &[u32], block_size: usize, cache_salt: Option<&str>) -> Vec<PrefixKey> {
    let mut keys = Vec::with_capacity(tokens.len() / block_size.max(1));
    if block_size == 0 {
        return keys;
    }
    let mut salt = Extras::new();
    if let Some(s) = cache_salt.filter(|s| !s.is_empty()) {
        salt.push_str(s);
    }
    let mut parent = root;
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        let extras = if i == 0 { salt.as_bytes() } else { &[] };
        parent = block_key(parent, block, extras);
        keys.push(parent);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_every_earlier_block() {
        let root = namespace_root("m", 0);
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[3] = 999;
        let ka = prompt_keys(root, &a, 16, None);
        let kb = prompt_keys(root, &b, 16, None);
        assert_eq!(ka.len(), 2);
        assert_ne!(ka[0], kb[0]);
        assert_ne!(ka[1], kb[1], "block 1 differs because its parent does");
    }

    #[test]
    fn partial_trailing_block_gets_no_key() {
        let root = namespace_root("m", 0);
        let tokens: Vec<u32> = (0..47).collect();
        assert_eq!(prompt_keys(root, &tokens, 16, None).len(), 2);
        assert!(prompt_keys(root, &tokens, 0, None).is_empty());
    }

    #[test]
    fn namespaces_salt_and_groups_separate_keys() {
        let tokens: Vec<u32> = (0..16).collect();
        let plain = prompt_keys(namespace_root("m", 0), &tokens, 16, None)[0];
        assert_ne!(plain, prompt_keys(namespace_root("lora-a", 0), &tokens, 16, None)[0]);
        assert_ne!(plain, prompt_keys(namespace_root("m", 1), &tokens, 16, None)[0]);
        assert_ne!(plain, prompt_keys(namespace_root("m", 0), &tokens, 16, Some("s"))[0]);
        assert_eq!(plain, prompt_keys(namespace_root("m", 0), &tokens, 16, Some(""))[0]);
    }

    #[test]
    fn recipe_is_stable() {
        // Snapshots persist keys: this value may only change together with RECIPE_VERSION.
        let tokens: Vec<u32> = (1..=16).collect();
        let key = prompt_keys(namespace_root("Qwen/Qwen3-0.6B", 0), &tokens, 16, None)[0];
        assert_eq!(RECIPE_VERSION, 1);
        assert_eq!(key, block_key(namespace_root("Qwen/Qwen3-0.6B", 0), &tokens, &[]));
        let expected = xxh3_64_with_seed(
            &tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>(),
            xxh3_64_with_seed(b"Qwen/Qwen3-0.6B", RECIPE_SEED),
        );
        assert_eq!(key, expected);
    }
}
