//! Key recipe 3's block hash: a block's tokens to its 64-bit key with AES rounds, several
//! blocks in flight, the same on every machine.
//!
//! Why: a query from token ids derives one key per block, and with XXH3 that was most of a
//! 512-block query (about 6 ns per 16-token block). A block key needs no chain (the index's
//! tree carries the prefix), so the blocks of a prompt are independent; an AES round is one
//! instruction, pipelined, two per cycle on current x86. A 16-token block costs 8 rounds, and
//! `GROUP` blocks are hashed side by side so the AES units never wait on one block's chain.
//!
//! With `R_k(x) = MixColumns(ShiftRows(SubBytes(x))) ⊕ k` (one x86 `AESENC`) and 128-bit values
//! written as (low, high) 64-bit halves:
//!
//! ```text
//! n tokens as c = ⌈n/4⌉ chunks m_0..m_{c-1} of 16 bytes (4 little-endian u32 tokens; the last
//! one zero-padded)
//! a = R_S2(R_S1((seed, n) ⊕ C0))       lane 0 starts from the seed and the token count
//! b = C1                               lane 1
//! for each chunk k: a = R_A(a ⊕ m_k) if k is even, b = R_B(b ⊕ m_k) if k is odd
//! x = R_F3(R_F2(R_F1(R_b(a))))         lane 1 is the round key that joins the lanes
//! key = low(x) ⊕ high(x)
//! ```
//!
//! The constants are the fractional hex digits of π in order (C0, C1, S1, S2, A, B, F1, F2, F3),
//! so none is chosen. Why this is an adequate key is in the [`super`] module's documentation.
//!
//! On x86_64 with AES-NI (detected at run time) the rounds are `AESENC`; elsewhere
//! `aes_round.rs` computes the same round in portable Rust (slower, same keys). Both run
//! the one generic body below, `hash_into`, over a `State` implementation.

use super::aes_round;

/// A 128-bit constant as (low, high) 64-bit halves.
type Pair = (u64, u64);

const C0: Pair = (0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344);
const C1: Pair = (0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89);
const S1: Pair = (0x4528_21e6_38d0_1377, 0xbe54_66cf_34e9_0c6c);
const S2: Pair = (0xc0ac_29b7_c97c_50dd, 0x3f84_d5b5_b547_0917);
const A: Pair = (0x9216_d5d9_8979_fb1b, 0xd131_0ba6_98df_b5ac);
const B: Pair = (0x2ffd_72db_d01a_dfb7, 0xb8e1_afed_6a26_7e96);
const F1: Pair = (0xba7c_9045_f12c_7f99, 0x24a1_9947_b391_6cf7);
const F2: Pair = (0x0801_f2e2_858e_fc16, 0x6369_20d8_7157_4e69);
const F3: Pair = (0xa458_fea3_f493_3d7e, 0x0d95_748f_728e_b658);

/// Blocks hashed side by side with AES instructions: enough independent rounds to fill the AES
/// pipelines. The portable round hashes one block at a time (its table lookups keep the CPU
/// busy already, and four blocks' state would not fit in registers).
const GROUP: usize = 4;

/// Key of one block of any length (0 included) under `seed`.
pub fn hash_block(tokens: &[u32], seed: u64) -> u64 {
    let mut key = [0];
    hash_blocks(tokens, tokens.len(), seed, &mut key);
    key[0]
}

/// Keys of the first `out.len()` consecutive blocks of `block_size` tokens of `tokens`, all
/// under `seed`. Panics if `tokens` holds fewer than `out.len() * block_size` tokens.
pub fn hash_blocks(tokens: &[u32], block_size: usize, seed: u64, out: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        // SAFETY: the CPU has AES-NI: just detected (std caches the answer).
        return unsafe { ni::hash_blocks(tokens, block_size, seed, out) };
    }
    hash_blocks_portable(tokens, block_size, seed, out)
}

/// [`hash_blocks`] without CPU instructions for AES: what a machine without them computes.
pub fn hash_blocks_portable(tokens: &[u32], block_size: usize, seed: u64, out: &mut [u64]) {
    hash_into::<Portable, 1>(tokens, block_size, seed, out)
}

/// Whether [`hash_blocks`] runs on AES instructions here (else on the portable round).
pub fn accelerated() -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        return true;
    }
    false
}

/// One 128-bit AES state and the operations the recipe needs, in one implementation.
trait State: Copy {
    fn new(v: Pair) -> Self;
    /// Four tokens, little-endian, as the state's 16 bytes.
    fn load(chunk: &[u32; 4]) -> Self;
    fn xor(self, other: Self) -> Self;
    /// One AES encryption round with `key` as its round key (x86 `AESENC`).
    fn round(self, key: Self) -> Self;
    /// Low half ⊕ high half.
    fn fold(self) -> u64;
}

/// The recipe's round keys in one implementation's representation.
#[derive(Clone, Copy)]
struct Keys<S> {
    lane1: S,
    a: S,
    b: S,
    f1: S,
    f2: S,
    f3: S,
}

#[inline(always)]
fn hash_into<S: State, const GROUP: usize>(tokens: &[u32], bs: usize, seed: u64, out: &mut [u64]) {
    let keys = Keys { lane1: S::new(C1), a: S::new(A), b: S::new(B), f1: S::new(F1), f2: S::new(F2), f3: S::new(F3) };
    // Lane 0's start depends only on the seed and the length: once per call, not per block.
    let start = S::new((seed ^ C0.0, bs as u64 ^ C0.1)).round(S::new(S1)).round(S::new(S2));
    let block = |i: usize| &tokens[i * bs..(i + 1) * bs];
    let mut groups = out.chunks_exact_mut(GROUP);
    let mut i = 0;
    for keys_out in &mut groups {
        keys_out.copy_from_slice(&hash_group::<S, GROUP>(std::array::from_fn(|j| block(i + j)), start, &keys));
        i += GROUP;
    }
    for key in groups.into_remainder() {
        *key = hash_group::<S, 1>([block(i)], start, &keys)[0];
        i += 1;
    }
}

/// Keys of `N` blocks of one length: their rounds are independent, so they overlap.
#[inline(always)]
fn hash_group<S: State, const N: usize>(blocks: [&[u32]; N], start: S, keys: &Keys<S>) -> [u64; N] {
    let n = blocks[0].len();
    let chunks: [&[[u32; 4]]; N] = blocks.map(|b| b.as_chunks::<4>().0);
    let full = n / 4;
    let mut a = [start; N];
    let mut b = [keys.lane1; N];
    let mut k = 0;
    while k + 2 <= full {
        for j in 0..N {
            a[j] = a[j].xor(S::load(&chunks[j][k])).round(keys.a);
            b[j] = b[j].xor(S::load(&chunks[j][k + 1])).round(keys.b);
        }
        k += 2;
    }
    if k < full {
        for j in 0..N {
            a[j] = a[j].xor(S::load(&chunks[j][k])).round(keys.a);
        }
    }
    if !n.is_multiple_of(4) {
        // The last, partial chunk, zero-padded (the length in lane 0 tells the padding apart),
        // goes to the lane whose turn it is.
        for j in 0..N {
            let mut tail = [0u32; 4];
            let rest = blocks[j].as_chunks::<4>().1;
            tail[..rest.len()].copy_from_slice(rest);
            let m = S::load(&tail);
            if full.is_multiple_of(2) {
                a[j] = a[j].xor(m).round(keys.a);
            } else {
                b[j] = b[j].xor(m).round(keys.b);
            }
        }
    }
    std::array::from_fn(|j| a[j].round(b[j]).round(keys.f1).round(keys.f2).round(keys.f3).fold())
}

/// The portable state: four little-endian `u32` columns, the round from [`aes_round`].
#[derive(Clone, Copy)]
struct Portable([u32; 4]);

impl State for Portable {
    #[inline(always)]
    fn new((lo, hi): Pair) -> Self {
        Portable([lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32])
    }
    #[inline(always)]
    fn load(chunk: &[u32; 4]) -> Self {
        Portable(*chunk)
    }
    #[inline(always)]
    fn xor(self, other: Self) -> Self {
        Portable(std::array::from_fn(|c| self.0[c] ^ other.0[c]))
    }
    #[inline(always)]
    fn round(self, key: Self) -> Self {
        Portable(aes_round::aesenc(self.0, key.0))
    }
    #[inline(always)]
    fn fold(self) -> u64 {
        let [c0, c1, c2, c3] = self.0.map(u64::from);
        (c0 | (c1 << 32)) ^ (c2 | (c3 << 32))
    }
}

#[cfg(target_arch = "x86_64")]
mod ni {
    use super::{hash_into, Pair, State, GROUP};
    use std::arch::x86_64::*;

    /// A state in an XMM register. Private to this module, whose only use of it is
    /// [`hash_blocks`], compiled for and only called on CPUs with AES-NI.
    #[derive(Clone, Copy)]
    struct Ni(__m128i);

    impl State for Ni {
        #[inline(always)]
        fn new((lo, hi): Pair) -> Self {
            // SAFETY: SSE2, which every x86_64 CPU has.
            Ni(unsafe { _mm_set_epi64x(hi as i64, lo as i64) })
        }
        #[inline(always)]
        fn load(chunk: &[u32; 4]) -> Self {
            // SAFETY: `chunk` is 16 readable bytes and `loadu` needs no alignment. x86 is
            // little-endian, so the bytes are the tokens' little-endian bytes, as in `Portable`.
            Ni(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) })
        }
        #[inline(always)]
        fn xor(self, other: Self) -> Self {
            // SAFETY: SSE2, which every x86_64 CPU has.
            Ni(unsafe { _mm_xor_si128(self.0, other.0) })
        }
        #[inline(always)]
        fn round(self, key: Self) -> Self {
            // SAFETY: an `Ni` exists only inside `hash_blocks` below, which runs only where
            // AES-NI was detected.
            Ni(unsafe { _mm_aesenc_si128(self.0, key.0) })
        }
        #[inline(always)]
        fn fold(self) -> u64 {
            // SAFETY: SSE2, which every x86_64 CPU has.
            let high = unsafe { _mm_unpackhi_epi64(self.0, self.0) };
            // SAFETY: SSE2, as above.
            let (lo, hi) = unsafe { (_mm_cvtsi128_si64(self.0), _mm_cvtsi128_si64(high)) };
            (lo ^ hi) as u64
        }
    }

    #[target_feature(enable = "aes")]
    pub(super) fn hash_blocks(tokens: &[u32], block_size: usize, seed: u64, out: &mut [u64]) {
        hash_into::<Ni, GROUP>(tokens, block_size, seed, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::test_rng;

    #[test]
    fn accelerated_and_portable_agree_on_every_length_and_seed() {
        if !accelerated() {
            eprintln!("no AES instructions here: the portable path is the only one (pinned by recipe_is_stable)");
            return;
        }
        let mut next = test_rng(3);
        let mut lengths: Vec<usize> = (0..=64).collect();
        lengths.extend([65, 67, 96, 100, 127, 128, 129, 256, 1000]);
        for &bs in &lengths {
            for round in 0..40 {
                // Tokens: vocabulary-sized, then any u32 (bits the vocabulary never sets).
                let mask = if round % 2 == 0 { 0x3_ffff } else { u32::MAX };
                let blocks = 1 + (next() % 9) as usize;
                let tokens: Vec<u32> = (0..blocks * bs).map(|_| next() as u32 & mask).collect();
                let seed = if round % 3 == 0 { crate::keys::plain_seed() } else { next() };
                let (mut fast, mut slow) = (vec![0; blocks], vec![0; blocks]);
                hash_blocks(&tokens, bs, seed, &mut fast);
                hash_blocks_portable(&tokens, bs, seed, &mut slow);
                assert_eq!(fast, slow, "block size {bs}, seed {seed:#x}");
                if bs > 0 {
                    assert_eq!(fast[0], hash_block(&tokens[..bs], seed));
                }
            }
        }
    }

    #[test]
    fn a_batch_keys_each_block_as_alone() {
        let mut next = test_rng(4);
        for bs in [1, 3, 4, 16, 17, 64] {
            let tokens: Vec<u32> = (0..11 * bs).map(|_| next() as u32).collect();
            let mut batch = vec![0; 11];
            hash_blocks(&tokens, bs, 7, &mut batch);
            let alone: Vec<u64> = tokens.chunks_exact(bs).map(|b| hash_block(b, 7)).collect();
            assert_eq!(batch, alone, "block size {bs}");
            let mut portable = vec![0; 11];
            hash_blocks_portable(&tokens, bs, 7, &mut portable);
            assert_eq!(portable, alone, "block size {bs}");
        }
    }
}
