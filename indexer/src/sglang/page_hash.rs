//! SGLang's position-aware page hash (0.5.6+): a chain of SHA-256 digests, one per page,
//! `d_i = SHA256(d_{i-1} || page)`, where a page is its token ids as little-endian u32s (EAGLE
//! bigram pages: both ids of each `(t_j, t_{j+1})` pair), or, from 0.5.23, when any id of the
//! page exceeds u32, the byte `0xff` then the ids as little-endian u64s. The event id of a page
//! is the digest's first 8 bytes read big-endian as a signed int64.

use sha2::{Digest, Sha256};

/// One page digest.
pub type PageDigest = [u8; 32];

/// A page chain's tokens: plain ids, or an EAGLE bigram key (`logical_len + 1` raw ids, the
/// page covering positions `j..j+n` hashing pairs `(t_j, t_{j+1})`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainTokens<'a> {
    Plain(&'a [u64]),
    Bigram(&'a [u64]),
}

impl ChainTokens<'_> {
    /// Positions the chain covers.
    pub fn logical_len(&self) -> usize {
        match self {
            ChainTokens::Plain(t) => t.len(),
            ChainTokens::Bigram(t) => t.len().saturating_sub(1),
        }
    }
}

/// Why a release's own hash would refuse these tokens (it raises; the engine publishes no
/// event for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PageHashError {
    #[error("token id {0} does not fit in uint32 (this release hashes u32 pages only)")]
    WideToken(u64),
    #[error("token id {0} exceeds int64")]
    TokenPastInt64(u64),
    #[error("page size must be positive")]
    ZeroPageSize,
}

/// The digests of the pages of `tokens` (the last one partial when the length is not a
/// multiple of `page_size`), chained from `prior` (a parent node's last digest or a seed).
/// `wide_pages`: whether ids past u32 are hashed as wide pages (0.5.23+) or refused.
pub fn page_digests(
    prior: Option<&PageDigest>,
    tokens: ChainTokens<'_>,
    page_size: usize,
    wide_pages: bool,
) -> Result<Vec<PageDigest>, PageHashError> {
    if page_size == 0 {
        return Err(PageHashError::ZeroPageSize);
    }
    let len = tokens.logical_len();
    let mut out = Vec::with_capacity(len.div_ceil(page_size));
    let mut prior = prior.copied();
    let mut bytes = Vec::with_capacity(page_size * 16 + 1);
    for start in (0..len).step_by(page_size) {
        let end = (start + page_size).min(len);
        // The raw ids this page reads: a bigram page reads one past its end.
        let raw = match tokens {
            ChainTokens::Plain(t) => &t[start..end],
            ChainTokens::Bigram(t) => &t[start..=end],
        };
        let widest = raw.iter().copied().max().unwrap_or(0);
        if widest > i64::MAX as u64 {
            return Err(PageHashError::TokenPastInt64(widest));
        }
        let wide = widest > u64::from(u32::MAX);
        if wide && !wide_pages {
            return Err(PageHashError::WideToken(widest));
        }
        bytes.clear();
        if wide {
            // An odd byte count keeps wide pages apart from u32 pages.
            bytes.push(0xff);
        }
        let mut word = |t: u64| {
            if wide {
                bytes.extend_from_slice(&t.to_le_bytes());
            } else {
                bytes.extend_from_slice(&(t as u32).to_le_bytes());
            }
        };
        match tokens {
            ChainTokens::Plain(_) => raw.iter().for_each(|&t| word(t)),
            ChainTokens::Bigram(_) => raw.windows(2).for_each(|pair| {
                word(pair[0]);
                word(pair[1]);
            }),
        }
        let mut hasher = Sha256::new();
        if let Some(p) = &prior {
            hasher.update(p);
        }
        hasher.update(&bytes);
        let digest: PageDigest = hasher.finalize().into();
        out.push(digest);
        prior = Some(digest);
    }
    Ok(out)
}

/// The id SGLang publishes for a digest: its first 8 bytes, big-endian, signed.
pub fn event_id(digest: &[u8; 32]) -> i64 {
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex32(s: &str) -> PageDigest {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    // hashes-sglang.jsonl, case widths-p16-1page / widths-p16-partial (every release).
    const WIDTHS: [u64; 23] = [
        0, 1, 255, 256, 65535, 65536, 16777216, 2147483647, 4294967295, 16777215, 2147483648, 4294967294, 151643, 100,
        23, 24, 4294967295, 0, 2147483647, 7, 65536, 16777216, 1,
    ];

    #[test]
    fn chain_and_partial_last_page_match_sglang() {
        let d = page_digests(None, ChainTokens::Plain(&WIDTHS), 16, false).unwrap();
        assert_eq!(d[0], hex32("654861d54fb3c2047631d0da29d83a9e21a6761a6827c401b7dbe9d3ea997d13"));
        assert_eq!(d[1], hex32("802943964ea88ceb1c6605d75085eba49d9e8bd0338bee5a58ceb70eddfac07f"));
        assert_eq!(event_id(&d[0]), 7298190764946997764);
        assert_eq!(event_id(&d[1]), -9211757249965814549);
    }

    #[test]
    fn wide_ids_are_refused_before_0_5_23_and_tagged_after() {
        let mut t = WIDTHS[..16].to_vec();
        t.push(1 << 32);
        assert_eq!(page_digests(None, ChainTokens::Plain(&t), 16, false), Err(PageHashError::WideToken(1 << 32)));
        let d = page_digests(None, ChainTokens::Plain(&t), 16, true).unwrap();
        assert_eq!(
            d[0],
            hex32("654861d54fb3c2047631d0da29d83a9e21a6761a6827c401b7dbe9d3ea997d13"),
            "u32 pages unchanged"
        );
        let mut wide = vec![0xffu8];
        wide.extend((1u64 << 32).to_le_bytes());
        let expect: PageDigest = Sha256::new().chain_update(d[0]).chain_update(&wide).finalize().into();
        assert_eq!(d[1], expect);
        assert_eq!(
            page_digests(None, ChainTokens::Plain(&[u64::MAX]), 1, true),
            Err(PageHashError::TokenPastInt64(u64::MAX))
        );
    }
}
