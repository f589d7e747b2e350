//! Block keys: our own block identity, computed from token ids.
//!
//! The index never uses the engine's block hash for matching. Both the event path (from the
//! `token_ids` a `BlockStored` carries) and the query path (from the prompt) compute the same
//! keys, so vLLM's hash algorithm, seed and release do not matter. A block's key covers only
//! its own tokens (and extras); the prefix before it is carried by the index's tree, which
//! keys a chain by its namespace root and then block by block. So the query path hashes its
//! blocks independently (no serial chain: several at once, see [`block_hash`]), and only as far
//! as the walk gets:
//!
//! ```text
//! root(ns, group) = XXH3-64(utf8(ns), seed = RECIPE_SEED ^ group)     ns = model, or LoRA name
//! seed_i          = BLOCK_SEED, or XXH3-64(canonical(extras_i), seed = BLOCK_SEED) with extras
//! key_i           = AesLanes(tokens_i, len(tokens_i), seed_i)          (block_hash.rs)
//! prefix identity = (root, key_0, key_1, …, key_i): a path in the tree
//! ```
//!
//! Extras are the per-block identifiers vLLM folds into its own hash: the `cache_salt` on block
//! 0, multimodal identifiers on the blocks they cover, lookahead tokens. A block with extras
//! can never share a key with a plain block of the same tokens, so a text-only query is never
//! credited with a multimodal or salted block.
//!
//! **Why a 64-bit AES-round hash is an adequate key.** It is not cryptographic, and need not be:
//! the threat model is XXH3's, which it replaces, and XXH3 with its public seed can be collided
//! by anyone too (as can any 64-bit key, by brute force at about 2^32 tries). What a key must do
//! is never let two different blocks that real prompts produce share a key by accident, and
//! make a collision harmless when it does occur:
//! - *Structure cannot collide before the last step.* Every step of [`block_hash`] is a
//!   bijection of its lane for fixed other inputs, so two blocks of the same length and seed
//!   that differ in one 16-byte chunk (one token, one bit, a token moved within four) reach
//!   different 128-bit states, and so do blocks that differ only in seed or in length with
//!   the same chunk count; only the fold to 64 bits can meet, about 2^-64 per pair.
//! - *Every input bit goes through at least four AES rounds before the output* (one round
//!   reaches four bytes, two reach all sixteen), and the seed and length through two more
//!   before any token is mixed in. The quality tests (`quality_tests.rs`) check it: no
//!   collisions among about a million blocks differing in one token, one bit, their order or
//!   only their length; every output bit flips with probability ½ ± 0.1 for every input bit.
//! - *A collision stays inside one branch.* A key is only matched as the child of the same
//!   path (namespace root and every earlier key), so a collision needs the same prefix, and
//!   then credits a pod with a block it does not hold only for the colliding prompt: a cost to
//!   whoever crafted it (their request lands on a pod without its cache), never another
//!   tenant's data (the engine serves only what its own hash, SHA-256 in vLLM, finds). An
//!   engine can only publish its own pod's blocks, which it could claim without collisions.
//!
//! The recipe is persisted by snapshots: any change to it must bump [`RECIPE_VERSION`].
//! Version 1 chained each key on its parent's (`seed = key_{i-1}`); version 2 keyed blocks
//! alone with XXH3-64 and let the tree carry the prefix; version 3 keys them with AES rounds,
//! several blocks in flight (same structure; the key derivation of a 512-block query about 2.5×
//! faster, BENCHMARKS.md).

mod aes_round;
pub mod block_hash;
pub mod extra_keys;
pub mod extras;
pub mod namespace;
#[cfg(test)]
mod quality_tests;

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use extras::Extras;
pub use namespace::namespace_of;

/// Version of the key recipe; part of every snapshot's header.
pub const RECIPE_VERSION: u32 = 3;

/// Distinguishes kvindex's namespace roots from any other use of XXH3 with small seeds.
const RECIPE_SEED: u64 = 0x6b76_696e_6465_7801; // "kvindex" + version byte

/// Seed of every plain block key, and of the XXH3 that turns a block's extras into its seed.
const BLOCK_SEED: u64 = 0x6b76_626c_6f63_6b03; // "kvblock" + recipe version

/// Key of one canonical block (its own tokens and extras only).
pub type BlockKey = u64;

/// The key every chain in namespace `ns` (model or LoRA name) and KV-cache group starts from.
pub fn namespace_root(ns: &str, group: u32) -> u64 {
    xxh3_64_with_seed(ns.as_bytes(), RECIPE_SEED ^ u64::from(group))
}

/// The seed of a block whose canonical extras encode to `extras` (empty: a plain block).
fn extras_seed(extras: &[u8]) -> u64 {
    if extras.is_empty() {
        BLOCK_SEED
    } else {
        xxh3_64_with_seed(extras, BLOCK_SEED)
    }
}

/// The seed of a plain block (no extras).
#[cfg(test)]
pub(crate) fn plain_seed() -> u64 {
    BLOCK_SEED
}

/// Key of one canonical block of `tokens` whose canonical extras encode to `extras` (empty for
/// a plain block).
#[inline]
pub fn block_key(tokens: &[u32], extras: &[u8]) -> BlockKey {
    block_hash::hash_block(tokens, extras_seed(extras))
}

/// Keys of every full `block_size`-token block of `tokens`, all plain (no extras), appended to
/// `out` (a partial trailing block gets none). Several blocks are hashed at once: callers with
/// many blocks should key them here rather than one [`block_key`] at a time.
pub fn block_keys(tokens: &[u32], block_size: usize, out: &mut Vec<BlockKey>) {
    let Some(blocks) = tokens.len().checked_div(block_size) else { return };
    let from = out.len();
    out.resize(from + blocks, 0);
    block_hash::hash_blocks(tokens, block_size, BLOCK_SEED, &mut out[from..]);
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

/// Keys computed per batch: enough blocks that the call's fixed cost is small beside them
/// (16 costs about 0.5 ns a block more than one call for a whole 512-block prompt, 32 about
/// 0.25), few enough that a walk stopping early wastes little (at most 31 blocks, ~70 ns).
const BATCH: usize = 32;

/// Keys reserved up front: a whole ordinary prompt's (no regrowth while the walk goes on), a
/// bounded share of a huge one's.
const MAX_RESERVED: usize = 4096;

impl<'a> PromptKeys<'a> {
    pub fn new(tokens: &'a [u32], block_size: usize, cache_salt: Option<&str>) -> Self {
        let mut salt = Extras::new();
        if let Some(s) = cache_salt.filter(|s| !s.is_empty()) {
            salt.push_str(s);
        }
        let blocks = tokens.len().checked_div(block_size).unwrap_or(0);
        PromptKeys { tokens, block_size, blocks, salt, keys: Vec::with_capacity(blocks.min(MAX_RESERVED)) }
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
        let mut from = self.keys.len();
        let to = (from + BATCH).min(self.blocks);
        let bs = self.block_size;
        if from == 0 && !self.salt.is_empty() {
            self.keys.push(block_key(&self.tokens[..bs], self.salt.as_bytes()));
            from = 1;
        }
        self.keys.resize(to, 0);
        block_hash::hash_blocks(&self.tokens[from * bs..], bs, BLOCK_SEED, &mut self.keys[from..]);
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

/// A deterministic generator for tests (SplitMix64): the same inputs on every run.
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
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
        let tokens: Vec<u32> = (0..16 * 100).collect();
        let mut lazy = PromptKeys::new(&tokens, 16, None);
        assert_eq!(lazy.blocks(), 100);
        assert_eq!(lazy.key(3), block_key(&tokens[48..64], &[]));
        assert!(lazy.keys.len() < 100, "only a batch was hashed");
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
        // They hold on every machine (the portable round computes what AES-NI does).
        assert_eq!(RECIPE_VERSION, 3);
        let tokens: Vec<u32> = (1..=16).collect();
        let pinned = [
            (keys(&tokens, 16, None)[0], 0x00be_4658_fc51_9a2b),
            (keys(&tokens, 16, Some("salt"))[0], 0x65d1_c5f4_a4c9_efed),
            (block_key(&tokens[..5], &[]), 0x964c_916b_45c7_fc15),
            (block_key(&[151_643], &[]), 0xf246_ed20_9945_8a52),
            (block_key(&(0..128).collect::<Vec<u32>>(), &[]), 0xade6_54f8_fbd2_6f24),
        ];
        for (i, (key, expected)) in pinned.into_iter().enumerate() {
            assert_eq!(key, expected, "pinned key {i}: {key:#018x}");
        }
        let mut portable = [0];
        block_hash::hash_blocks_portable(&tokens, 16, BLOCK_SEED, &mut portable);
        assert_eq!(portable[0], pinned[0].1);
        assert_eq!(namespace_root("Qwen/Qwen3-0.6B", 0), xxh3_64_with_seed(b"Qwen/Qwen3-0.6B", RECIPE_SEED));
    }

    #[test]
    fn block_keys_are_block_key_of_each_block() {
        let tokens: Vec<u32> = (0..16 * 9 + 5).map(|t| t * 7919).collect();
        let mut out = vec![42];
        block_keys(&tokens, 16, &mut out);
        let alone: Vec<BlockKey> = tokens.chunks_exact(16).map(|b| block_key(b, &[])).collect();
        assert_eq!(out[0], 42, "appended");
        assert_eq!(out[1..], alone[..]);
        block_keys(&tokens, 0, &mut out);
        assert_eq!(out.len(), 10, "block size 0 keys nothing");
    }
}
