//! Whether key recipe 3's block keys ([`super::block_hash`]) are good enough keys: no collisions
//! among blocks built to be alike (one token or one bit apart, reordered, differing only in
//! length or seed), and full avalanche (every output bit flips with probability ½ for every
//! input bit). The avalanche check is also run on a weak hash, to show it can fail.

use super::block_hash::hash_block;
use super::{block_key, plain_seed, test_rng, Extras};

/// Vocabulary of Qwen3 (151,936 tokens): token ids as real prompts have them.
const VOCAB: u64 = 151_936;

/// Keys the `inputs` blocks `make` builds (block `i` into the buffer; it returns the seed) and
/// asserts that no two of them share a key. Inputs must all differ (checked on a collision).
fn assert_no_collisions(what: &str, inputs: usize, make: impl Fn(usize, &mut Vec<u32>) -> u64) {
    assert_no_collisions_of(hash_block, what, inputs, make)
}

fn assert_no_collisions_of(
    hash: impl Fn(&[u32], u64) -> u64,
    what: &str,
    inputs: usize,
    make: impl Fn(usize, &mut Vec<u32>) -> u64,
) {
    let mut block = Vec::new();
    let mut key = |i: usize| {
        block.clear();
        let seed = make(i, &mut block);
        hash(&block, seed)
    };
    let mut keys: Vec<u64> = (0..inputs).map(&mut key).collect();
    keys.sort_unstable();
    let Some(shared) = keys.windows(2).find(|pair| pair[0] == pair[1]).map(|pair| pair[0]) else { return };
    let inputs: Vec<usize> = (0..inputs).filter(|&i| key(i) == shared).take(2).collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (seed_a, seed_b) = (make(inputs[0], &mut a), make(inputs[1], &mut b));
    assert!(a != b || seed_a != seed_b, "{what}: inputs {inputs:?} are one input (test bug)");
    panic!("{what}: key {shared:#x} shared by {a:?} (seed {seed_a:#x}) and {b:?} (seed {seed_b:#x})");
}

fn random_block(next: &mut impl FnMut() -> u64, len: usize) -> Vec<u32> {
    (0..len).map(|_| (next() % VOCAB) as u32).collect()
}

#[test]
fn no_collisions_among_blocks_one_token_apart() {
    let mut next = test_rng(11);
    let base = random_block(&mut next, 16);
    // Every position of a 16-token block takes 65,536 values: 1,048,576 blocks.
    assert_no_collisions("16 tokens, one differs", 16 << 16, |i, block| {
        block.extend_from_slice(&base);
        let (pos, value) = (i >> 16, (i & 0xffff) as u32);
        block[pos] = if value == base[pos] { 0x10_0000 } else { value };
        plain_seed()
    });
    // Other block sizes, tails of 1..3 tokens included: 2,048 values at every position.
    let sizes = [1usize, 2, 3, 5, 7, 8, 13, 32, 64];
    let bases: Vec<Vec<u32>> = sizes.iter().map(|&n| random_block(&mut next, n)).collect();
    let offsets: Vec<usize> = sizes.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n * 2048))).collect();
    let total = sizes.iter().sum::<usize>() * 2048;
    assert_no_collisions("sizes 1..64, one token differs", total, |i, block| {
        let s = offsets.iter().rposition(|&o| o <= i).unwrap();
        let j = i - offsets[s];
        block.extend_from_slice(&bases[s]);
        let (pos, value) = (j / 2048, (j % 2048) as u32);
        block[pos] = if value == bases[s][pos] { 0x10_0000 } else { value };
        plain_seed()
    });
}

#[test]
fn no_collisions_among_blocks_one_bit_apart() {
    // Every block size 1..=64, eight bases each (four of vocabulary tokens, four of any u32),
    // every single bit flipped: 532,480 blocks, and the bases.
    let mut next = test_rng(12);
    let mut bases = Vec::new();
    for len in 1..=64usize {
        for b in 0..8 {
            let base = if b < 4 { random_block(&mut next, len) } else { (0..len).map(|_| next() as u32).collect() };
            bases.push(base);
        }
    }
    let mut inputs = Vec::new(); // (base, bit or none)
    for (b, base) in bases.iter().enumerate() {
        inputs.push((b, None));
        inputs.extend((0..base.len() * 32).map(|bit| (b, Some(bit))));
    }
    assert_no_collisions("one bit flipped", inputs.len(), |i, block| {
        let (b, bit) = inputs[i];
        block.extend_from_slice(&bases[b]);
        if let Some(bit) = bit {
            block[bit / 32] ^= 1 << (bit % 32);
        }
        plain_seed()
    });
}

/// The `i`-th permutation of `0..n` (factorial number system).
fn permutation(mut i: usize, n: usize) -> Vec<usize> {
    let mut left: Vec<usize> = (0..n).collect();
    let mut out = Vec::with_capacity(n);
    for k in (1..=n).rev() {
        let fact: usize = (1..k).product();
        out.push(left.remove(i / fact));
        i %= fact;
    }
    out
}

#[test]
fn no_collisions_among_reorderings() {
    let mut next = test_rng(13);
    // Every order of 9 distinct tokens (two full chunks and a partial one): 362,880 blocks.
    let nine: Vec<u32> = (0..9).map(|t| t * 15_001 + 7).collect();
    assert_no_collisions("orders of 9 tokens", 362_880, |i, block| {
        block.extend(permutation(i, 9).into_iter().map(|p| nine[p]));
        plain_seed()
    });
    // Every order of the eight 4-token chunks of a 32-token block (lanes swapped whole): 40,320.
    let chunks = random_block(&mut next, 32);
    assert_no_collisions("orders of 8 chunks", 40_320, |i, block| {
        for p in permutation(i, 8) {
            block.extend_from_slice(&chunks[p * 4..p * 4 + 4]);
        }
        plain_seed()
    });
    // Every swap of two tokens of 64-token blocks of distinct tokens: 100 bases x 2,016 swaps.
    let pairs: Vec<(usize, usize)> = (0..64).flat_map(|a| (a + 1..64).map(move |b| (a, b))).collect();
    assert_no_collisions("two tokens swapped", 100 * (pairs.len() + 1), |i, block| {
        let (base, swap) = (i / (pairs.len() + 1), i % (pairs.len() + 1));
        block.extend((0..64u32).map(|t| t * 1000 + base as u32));
        if let Some(&(a, b)) = pairs.get(swap) {
            block.swap(a, b);
        }
        plain_seed()
    });
}

#[test]
fn no_collisions_among_blocks_differing_only_in_length() {
    let mut next = test_rng(14);
    let long = random_block(&mut next, 2048);
    // All-zero blocks and prefixes of one sequence, every length 1..=2048.
    assert_no_collisions("zeros and prefixes", 2 * 2048, |i, block| {
        let len = i % 2048 + 1;
        if i < 2048 {
            block.resize(len, 0);
        } else {
            block.extend_from_slice(&long[..len]);
        }
        plain_seed()
    });
    // 500 bases of non-zero tokens (each its own first token) cut to every length 1..=64, then
    // 0..=15 zero tokens added (what zero-padding the last chunk must not confuse): 512,000.
    let bases: Vec<Vec<u32>> = (0..500u32)
        .map(|b| {
            let mut base: Vec<u32> = random_block(&mut next, 64).into_iter().map(|t| t.max(1)).collect();
            base[0] = b + 1;
            base
        })
        .collect();
    assert_no_collisions("cut and zero-padded", 500 * 64 * 16, |i, block| {
        let (base, cut, zeros) = (i / 1024, (i / 16) % 64 + 1, i % 16);
        block.extend_from_slice(&bases[base][..cut]);
        block.resize(cut + zeros, 0);
        plain_seed()
    });
}

#[test]
fn no_collisions_among_seeds_and_extras() {
    let mut next = test_rng(15);
    let tokens = random_block(&mut next, 16);
    let seeds: Vec<u64> = (0..200_000).map(|_| next()).chain([plain_seed()]).collect();
    assert_no_collisions("one block, 200,001 seeds", seeds.len(), |i, block| {
        block.extend_from_slice(&tokens);
        seeds[i]
    });
    // Extras as the event and query paths encode them: salts, multimodal identifiers.
    let mut keys: Vec<u64> = (0..10_000)
        .flat_map(|i| {
            let (mut salt, mut mm) = (Extras::new(), Extras::new());
            salt.push_str(&format!("tenant-{i}"));
            mm.push_list(2);
            mm.push_str(&format!("{i:064x}"));
            mm.push_int(0);
            [block_key(&tokens, salt.as_bytes()), block_key(&tokens, mm.as_bytes())]
        })
        .chain([block_key(&tokens, &[])])
        .collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 20_001, "every salt and multimodal item keys the block apart");
}

#[test]
#[should_panic(expected = "shared by")]
fn the_collision_check_catches_an_order_blind_hash() {
    // A sum of tokens keys every order of a block alike.
    let sum = |tokens: &[u32], seed: u64| tokens.iter().fold(seed, |h, &t| h.wrapping_add(u64::from(t)));
    assert_no_collisions_of(sum, "orders of 4 tokens", 24, |i, block| {
        block.extend(permutation(i, 4).into_iter().map(|p| p as u32 * 7 + 1));
        plain_seed()
    });
}

/// Over `samples` random blocks of `len` tokens and random seeds: for every input bit (each
/// token bit, then each seed bit) and every output bit, how often the output bit flips when the
/// input bit does. Returns the largest distance from ½.
fn worst_avalanche_bias(len: usize, samples: u32, hash: impl Fn(&[u32], u64) -> u64) -> f64 {
    let mut next = test_rng(16 + len as u64);
    let inputs = len * 32 + 64;
    let mut flips = vec![[0u32; 64]; inputs];
    let mut block = vec![0u32; len];
    for _ in 0..samples {
        block.iter_mut().for_each(|t| *t = next() as u32);
        let seed = next();
        let key = hash(&block, seed);
        for (bit, counts) in flips.iter_mut().enumerate() {
            let flipped = if bit < len * 32 {
                block[bit / 32] ^= 1 << (bit % 32);
                let k = hash(&block, seed);
                block[bit / 32] ^= 1 << (bit % 32);
                k
            } else {
                hash(&block, seed ^ (1 << (bit - len * 32)))
            };
            let diff = key ^ flipped;
            for (out, count) in counts.iter_mut().enumerate() {
                *count += (diff >> out) as u32 & 1;
            }
        }
    }
    let half = f64::from(samples) / 2.0;
    flips.iter().flatten().map(|&c| (f64::from(c) - half).abs() / f64::from(samples)).fold(0.0, f64::max)
}

/// 1,000 samples: one (input bit, output bit) cell has σ = 0.016, so 0.1 is over six σ; a hash
/// whose bits do not all mix misses it by far.
const AVALANCHE_TOLERANCE: f64 = 0.1;

#[test]
fn every_output_bit_flips_half_the_time_for_every_input_bit() {
    // One chunk, a partial one (lane 1), two and a partial one (lane 0), four.
    for len in [1, 5, 9, 16] {
        let bias = worst_avalanche_bias(len, 1000, hash_block);
        assert!(bias < AVALANCHE_TOLERANCE, "{len} tokens: worst bias {bias:.3}");
    }
}

#[test]
fn the_avalanche_check_rejects_a_weak_hash() {
    // Multiply-and-xor (FxHash's step): a high input bit never reaches the low output bits.
    let weak = |tokens: &[u32], seed: u64| {
        tokens.iter().fold(seed, |h, &t| (h.rotate_left(5) ^ u64::from(t)).wrapping_mul(0x517c_c1b7_2722_0a95))
    };
    let bias = worst_avalanche_bias(16, 1000, weak);
    assert!(bias > AVALANCHE_TOLERANCE, "worst bias {bias:.3}");
}
