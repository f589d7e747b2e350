//! Block keys: our own block identity, computed from token ids.
//!
//! The index never uses the engine's block hash for matching. Both the event path (from the
//! `token_ids` a `BlockStored` carries) and the query path (from the prompt) compute the same
//! keys, so vLLM's hash algorithm, seed and release do not matter. A block's key covers only
//! its own tokens (and extras); the prefix before it is carried by the index's tree, which
//! keys a chain by its namespace root and then block by block. So the query path hashes its
//! blocks independently (no serial chain: the CPU overlaps them), and only as far as the walk
//! gets:
//!
//! ```text
//! root(ns, group) = XXH3-64(utf8(ns), seed = RECIPE_SEED ^ group)     ns = model, or LoRA name
//! key_i           = XXH3-64(le_u32(tokens_i), seed = BLOCK_SEED)
//!                   (with extras: seed = XXH3-64(canonical(extras_i), seed = BLOCK_SEED))
//! prefix identity = (root, key_0, key_1, …, key_i): a path in the tree
//! ```
//!
//! Extras are the per-block identifiers vLLM folds into its own hash: the `cache_salt` on block
//! 0, multimodal identifiers on the blocks they cover, lookahead tokens. A block with extras
//! can never share a key with a plain block of the same tokens, so a text-only query is never
//! credited with a multimodal or salted block.
//!
//! The recipe is persisted by snapshots: any change to it must bump [`RECIPE_VERSION`].
//! Version 1 chained each key on its parent's (`seed = key_{i-1}`); version 2 keys blocks
//! alone and lets the tree carry the prefix.

pub mod extra_keys;
pub mod extras;
pub mod namespace;

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use extras::Extras;
pub use namespace::namespace_of;

/// Version of the key recipe; part of every snapshot's header.
pub const RECIPE_VERSION: u32 = 2;

/// Distinguishes kvindex's namespace roots from any other use of XXH3 with small seeds.
const RECIPE_SEED: u64 = 0x6b76_696e_6465_7801; // "kvindex" + version byte

/// Seed of every block key, so a key is never an XXH3 of the same bytes used elsewhere.
const BLOCK_SEED: u64 = 0x6b76_626c_6f63_6b02; // "kvblock" + recipe version

/// Key of one canonical block (its own tokens and extras only).
pub type BlockKey = u64;

/// The key every chain in namespace `ns` (model or LoRA name) and KV-cache group starts from.
pub fn namespace_root(ns: &str, group: u32) -> u64 {
    xxh3_64_with_seed(ns.as_bytes(), RECIPE_SEED ^ u64::from(group))
}

/// Key of a block of `tokens` whose canonical extras encode to `extras` (empty for a plain
/// block).
#[inline]
pub fn block_key(tokens: &[u32], extras: &[u8]) -> BlockKey {
    let seed = if extras.is_empty() { BLOCK_SEED } else { xxh3_64_with_seed(extras, BLOCK_SEED) };
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

/// Keys of a prompt's full canonical blocks (a partial trailing block gets none), computed on
/// demand in small batches: a walk that stops early never pays for the rest of the prompt.
///
/// `cache_salt`, when given, is folded into block 0 exactly as a `BlockStored` whose first
/// block carries the salt as its only extra key.
pub struct PromptKeys<'a> {
    tokens: &'a [u32],
    block_size: usize,
    blocks: usize,
    salt: Extras,
    keys: Vec<BlockKey>,
}

/// Keys computed per batch: enough independent hashes to keep the CPU's pipelines full.
const BATCH: usize = 16;

impl<'a> PromptKeys<'a> {
    pub fn new(tokens: &'a [u32], block_size: usize, cache_salt: Option<&str>) -> Self {
        let mut salt = Extras::new();
        if let Some(s) = cache_salt.filter(|s| !s.is_empty()) {
            salt.push_str(s);
        }
        let blocks = tokens.len().checked_div(block_size).unwrap_or(0);
        PromptKeys { tokens, block_size, blocks, salt, keys: Vec::with_capacity(blocks.min(256)) }
    }

    /// Full canonical blocks of the prompt.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The key of block `i` (< `blocks()`).
    #[inline]
    pub fn key(&mut self, i: usize) -> BlockKey {
        while self.keys.len() <= i {
            self.fill();
        }
        self.keys[i]
    }

    #[cold]
    fn fill(&mut self) {
        let from = self.keys.len();
        let to = (from + BATCH).min(self.blocks);
        let bs = self.block_size;
        for i in from..to {
            let block = &self.tokens[i * bs..(i + 1) * bs];
            let extras = if i == 0 { self.salt.as_bytes() } else { &[] };
            self.keys.push(block_key(block, extras));
        }
    }

    /// Every key (hashing the whole prompt).
    pub fn all(mut self) -> Vec<BlockKey> {
        if self.blocks > 0 {
            self.key(self.blocks - 1);
        }
        self.keys
    }
}

/// A prefix's identity as one number: its namespace root and every block key up to it.
pub type PrefixKey = u64;

/// Prefix identities of every full canonical block of a prompt (a partial trailing block gets
/// none), for callers that want one stable number per prefix (the router's rendezvous tie
/// key) rather than a tree walk. `prefix_i = XXH3-64(le_u64(prefix_{i-1}) ‖ le_u64(key_i))`
/// from `prefix_{-1} = root`; the index itself never stores these.
pub fn prompt_keys(root: u64, tokens: &[u32], block_size: usize, cache_salt: Option<&str>) -> Vec<PrefixKey> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = root;
    PromptKeys::new(tokens, block_size, cache_salt)
        .all()
        .into_iter()
        .map(|key| {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.to_le_bytes());
            bytes[8..].copy_from_slice(&key.to_le_bytes());
            parent = xxh3_64_with_seed(&bytes, BLOCK_SEED);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(tokens: &[u32], bs: usize, salt: Option<&str>) -> Vec<BlockKey> {
        PromptKeys::new(tokens, bs, salt).all()
    }

    #[test]
    fn a_key_depends_on_its_own_block_only() {
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[3] = 999;
        let (ka, kb) = (keys(&a, 16, None), keys(&b, 16, None));
        assert_eq!(ka.len(), 2);
        assert_ne!(ka[0], kb[0]);
        assert_eq!(ka[1], kb[1], "the prefix is the tree's business, not the key's");
    }

    #[test]
    fn partial_trailing_block_gets_no_key_and_keys_come_lazily() {
        let tokens: Vec<u32> = (0..47).collect();
        assert_eq!(keys(&tokens, 16, None).len(), 2);
        assert!(keys(&tokens, 0, None).is_empty());
        let tokens: Vec<u32> = (0..16 * 40).collect();
        let mut lazy = PromptKeys::new(&tokens, 16, None);
        assert_eq!(lazy.blocks(), 40);
        assert_eq!(lazy.key(3), block_key(&tokens[48..64], &[]));
        assert!(lazy.keys.len() < 40, "only a batch was hashed");
        assert_eq!(lazy.all(), keys(&tokens, 16, None));
    }

    #[test]
    fn salt_and_extras_separate_keys_and_namespaces_separate_roots() {
        let tokens: Vec<u32> = (0..16).collect();
        let plain = keys(&tokens, 16, None)[0];
        assert_ne!(plain, keys(&tokens, 16, Some("s"))[0]);
        assert_eq!(plain, keys(&tokens, 16, Some(""))[0]);
        let mut mm = Extras::new();
        mm.push_str("img");
        assert_ne!(plain, block_key(&tokens, mm.as_bytes()));
        assert_ne!(namespace_root("m", 0), namespace_root("lora-a", 0));
        assert_ne!(namespace_root("m", 0), namespace_root("m", 1));
    }

    #[test]
    fn prefix_identity_depends_on_root_and_every_earlier_block() {
        let root = namespace_root("m", 0);
        let a: Vec<u32> = (0..47).collect();
        let mut b = a.clone();
        b[3] = 999;
        let (ka, kb) = (prompt_keys(root, &a, 16, None), prompt_keys(root, &b, 16, None));
        assert_eq!(ka.len(), 2, "a partial trailing block gets no key");
        assert_ne!(ka[1], kb[1], "block 1 differs because block 0 does");
        assert_ne!(ka[0], prompt_keys(namespace_root("n", 0), &a, 16, None)[0]);
        assert_ne!(ka[0], prompt_keys(root, &a, 16, Some("s"))[0]);
        assert!(prompt_keys(root, &a, 0, None).is_empty());
    }

    #[test]
    fn recipe_is_stable() {
        // Snapshots persist keys: these values may only change together with RECIPE_VERSION.
        let tokens: Vec<u32> = (1..=16).collect();
        assert_eq!(RECIPE_VERSION, 2);
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(keys(&tokens, 16, None)[0], xxh3_64_with_seed(&bytes, BLOCK_SEED));
        assert_eq!(namespace_root("Qwen/Qwen3-0.6B", 0), xxh3_64_with_seed(b"Qwen/Qwen3-0.6B", RECIPE_SEED));
    }
}
