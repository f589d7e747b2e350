//! Runs a fuzz target's body on stable Rust, bounded and deterministic, so that CI exercises
//! the same code cargo-fuzz does: every seed of the target's committed corpus
//! (`indexer/zmtp/fuzz/seeds/<target>/`), then inputs from a fixed-seed generator: fresh random
//! bytes, and seeds with bits flipped, bytes overwritten, inserted or removed, truncated, and
//! spliced with each other. The input that panics is printed in hex, to add to the corpus.

use std::path::Path;

/// xorshift64*: enough to spread inputs, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The committed seeds of a target, sorted by name.
pub fn seeds(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if seeds.is_empty() || rng.below(8) == 0 {
        let len = rng.below(4096);
        return (0..len).map(|_| rng.next() as u8).collect();
    }
    let mut input = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = [0, 0xff, 0x7f, 0x80, 0xc1, 0xdc, 0xdd][rng.below(7)];
            }
            2 => {
                let i = rng.below(input.len() + 1);
                input.insert(i, rng.next() as u8);
            }
            3 if !input.is_empty() => {
                input.remove(rng.below(input.len()));
            }
            4 => input.truncate(rng.below(input.len() + 1)),
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(other.len() + 1);
                let at = rng.below(input.len() + 1);
                input.truncate(at);
                input.extend_from_slice(&other[cut..]);
            }
        }
    }
    input
}

/// Runs `body` on every seed in `dir`, then on `cases` generated inputs (`KVINDEX_FUZZ_CASES`
/// overrides the count, for a longer run). Returns how many inputs ran.
pub fn exercise(dir: &Path, cases: usize, body: fn(&[u8])) -> usize {
    let cases = std::env::var("KVINDEX_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    let seeds = seeds(dir);
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    let mut rng = Rng(0x6b76_696e_6465_7821);
    let inputs = seeds.iter().cloned().chain((0..cases).map(|_| mutate(&mut rng, &seeds)));
    let mut ran = 0;
    for input in inputs {
        if std::panic::catch_unwind(|| body(&input)).is_err() {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            panic!("fuzz body panicked on input #{ran} ({} bytes): {hex}", input.len());
        }
        ran += 1;
    }
    ran
}
