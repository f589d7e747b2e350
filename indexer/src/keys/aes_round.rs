//! One AES encryption round in portable Rust, bit for bit what x86's `AESENC` computes, so that
//! block keys (key recipe 3, [`super::block_hash`]) are the same on a machine without AES
//! instructions as on one with them.
//!
//! The state is four little-endian `u32` columns (byte `r` of column `c` is the state's row `r`):
//! exactly the bytes an `__m128i` loaded from the same memory holds. The round is the classic
//! table formulation (SubBytes, ShiftRows and MixColumns folded into four 1 KiB tables, one per
//! row); the tables are derived from the S-box, and the S-box is computed from its definition
//! (inverse in GF(2^8), then the affine map) at compile time, so no constant is typed in by hand.
//! Timing side channels do not matter here: the keys are not secret.

/// The AES S-box, computed from its definition (FIPS-197, 5.1.1).
const SBOX: [u8; 256] = sbox();

/// `TABLES[r][x]`: the MixColumns column that S-box output `S[x]` in row `r` contributes,
/// little-endian: row 0 gives `(2·S, S, S, 3·S)`, row `r` the same rotated by `r` bytes.
const TABLES: [[u32; 256]; 4] = tables();

const fn sbox() -> [u8; 256] {
    // Walks the multiplicative group of GF(2^8) with generator 3: `p` runs over every non-zero
    // element while `q` stays its inverse (`q` is divided by 3 as `p` is multiplied by 3).
    let mut sbox = [0u8; 256];
    let (mut p, mut q) = (1u8, 1u8);
    loop {
        p = p ^ (p << 1) ^ if p & 0x80 != 0 { 0x1b } else { 0 };
        q ^= q << 1;
        q ^= q << 2;
        q ^= q << 4;
        if q & 0x80 != 0 {
            q ^= 0x09;
        }
        let affine = q ^ q.rotate_left(1) ^ q.rotate_left(2) ^ q.rotate_left(3) ^ q.rotate_left(4);
        sbox[p as usize] = affine ^ 0x63;
        if p == 1 {
            break;
        }
    }
    sbox[0] = 0x63; // 0 has no inverse; the definition maps it to the affine constant.
    sbox
}

const fn xtime(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1b } else { 0 }
}

const fn tables() -> [[u32; 256]; 4] {
    let mut tables = [[0u32; 256]; 4];
    let mut x = 0;
    while x < 256 {
        let s = SBOX[x];
        let s2 = xtime(s);
        let column = u32::from_le_bytes([s2, s, s, s2 ^ s]);
        tables[0][x] = column;
        tables[1][x] = column.rotate_left(8);
        tables[2][x] = column.rotate_left(16);
        tables[3][x] = column.rotate_left(24);
        x += 1;
    }
    tables
}

/// One AES encryption round: `MixColumns(ShiftRows(SubBytes(state))) ⊕ key` (x86 `AESENC`).
#[inline]
pub fn aesenc(state: [u32; 4], key: [u32; 4]) -> [u32; 4] {
    // ShiftRows: row r of column c comes from column c + r.
    let column = |c: usize| {
        TABLES[0][(state[c] & 0xff) as usize]
            ^ TABLES[1][((state[(c + 1) % 4] >> 8) & 0xff) as usize]
            ^ TABLES[2][((state[(c + 2) % 4] >> 16) & 0xff) as usize]
            ^ TABLES[3][(state[(c + 3) % 4] >> 24) as usize]
            ^ key[c]
    };
    [column(0), column(1), column(2), column(3)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(hex: &str) -> [u32; 4] {
        let bytes = hex::decode(hex).unwrap();
        std::array::from_fn(|c| u32::from_le_bytes(bytes[4 * c..4 * c + 4].try_into().unwrap()))
    }

    #[test]
    fn sbox_matches_fips_197() {
        // FIPS-197 figure 7 entries, and its SubBytes example {53} -> {ed}.
        assert_eq!((SBOX[0x00], SBOX[0x01], SBOX[0x53], SBOX[0xff]), (0x63, 0x7c, 0xed, 0x16));
        assert_eq!((SBOX[0x10], SBOX[0x9a], SBOX[0xc9]), (0xca, 0xb8, 0xdd));
        let mut seen = [false; 256];
        for s in SBOX {
            assert!(!seen[s as usize], "the S-box is a permutation");
            seen[s as usize] = true;
        }
    }

    #[test]
    fn a_round_matches_fips_197_appendix_b() {
        // AES-128 example, round 1: start-of-round state and round key -> start of round 2.
        let state = columns("193de3bea0f4e22b9ac68d2ae9f84808");
        let key = columns("a0fafe1788542cb123a339392a6c7605");
        assert_eq!(aesenc(state, key), columns("a49c7ff2689f352b6b5bea43026a5049"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_round_matches_aesenc_on_this_cpu() {
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("aes") {
            return;
        }
        #[target_feature(enable = "aes")]
        fn hardware(state: [u32; 4], key: [u32; 4]) -> [u32; 4] {
            let load = |c: [u32; 4]| _mm_set_epi32(c[3] as i32, c[2] as i32, c[1] as i32, c[0] as i32);
            let x = _mm_aesenc_si128(load(state), load(key));
            let (lo, hi) = (_mm_cvtsi128_si64(x) as u64, _mm_cvtsi128_si64(_mm_unpackhi_epi64(x, x)) as u64);
            [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]
        }
        let mut next = crate::keys::test_rng(1);
        for i in 0..20_000u32 {
            // Every byte value in every position at least once, then random states.
            let state = if i < 256 { [i * 0x0101_0101; 4] } else { std::array::from_fn(|_| next() as u32) };
            let key = std::array::from_fn(|_| next() as u32);
            // SAFETY: AES-NI was detected above (SSE2 is part of x86_64).
            assert_eq!(aesenc(state, key), unsafe { hardware(state, key) }, "state {state:08x?} key {key:08x?}");
        }
    }
}
