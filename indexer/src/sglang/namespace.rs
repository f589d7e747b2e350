//! SGLang's namespaces: how a request's cache salt and adapter (`extra_key`) change the
//! published ids. The cache salt seeds the event chain (0.5.19+,
//! `SHA256("sglang-cache-salt-v1\0" || salt)`); the storage chain is seeded by both parts
//! (0.5.22+); and from 0.5.22 (`format = "dynamo"`, and from 0.5.23 by default for named
//! adapters) each published id is re-hashed with a namespace seed.

use sha2::{Digest, Sha256};

use super::page_hash::PageDigest;

/// The event chain's seed for a salted request (0.5.19+).
pub fn cache_salt_seed(salt: &str) -> PageDigest {
    Sha256::new().chain_update(b"sglang-cache-salt-v1\0").chain_update(salt.as_bytes()).finalize().into()
}

/// `SHA256(tag || part…)` where each part is `0x00` when absent, else `0x01`, its UTF-8 length
/// as 8 little-endian bytes and its bytes: absent, empty and joined parts all differ.
fn tagged_seed(tag: &[u8], extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<PageDigest> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut hasher = Sha256::new();
    hasher.update(tag);
    for part in [extra_key, cache_salt] {
        match part {
            None => hasher.update([0u8]),
            Some(p) => {
                hasher.update([1u8]);
                hasher.update((p.len() as u64).to_le_bytes());
                hasher.update(p.as_bytes());
            }
        }
    }
    Some(hasher.finalize().into())
}

/// The seed of a published id's namespace (`kv_event_namespace_seed`); `None` = no namespace.
pub fn event_namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<PageDigest> {
    tagged_seed(b"sglang-kv-event-namespace-v1", extra_key, cache_salt)
}

/// The seed of the storage (HiCache) chain (`storage_namespace_seed`, 0.5.22+).
pub fn storage_namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<PageDigest> {
    tagged_seed(b"sglang-cache-namespace-v1", extra_key, cache_salt)
}

/// A published id in a namespace: the first 8 bytes (big-endian, signed) of
/// `SHA256(seed || id as 8 big-endian bytes)`; the id itself without a seed.
pub fn namespaced_id(id: i64, seed: Option<&PageDigest>) -> i64 {
    let Some(seed) = seed else { return id };
    let digest: [u8; 32] = Sha256::new().chain_update(seed).chain_update(id.to_be_bytes()).finalize().into();
    super::page_hash::event_id(&digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_match_sglang() {
        // hashes-sglang.jsonl: chain_seed_hex of the salted cases, namespace_seed_hex of
        // 0.5.23 lora-p16-two-nodes (extra_key only).
        assert_eq!(
            hex::encode(cache_salt_seed("tenant-a-salt")),
            "61a1209a0b70b20f4b0e6b58b673f16f5fb9fe696ef0f507d42dbb4fa653bfea"
        );
        let seed = event_namespace_seed(Some("fc6dc3fb53a2587f8a932b37a739d69b"), None).unwrap();
        assert_eq!(hex::encode(seed), "ce76a611d1a23f9d4c7042e3056d1ee2eee09b9ca5188802eb7065eb390c9a58");
        assert_eq!(event_namespace_seed(None, None), None);
        assert_ne!(event_namespace_seed(Some(""), None), event_namespace_seed(None, Some("")));
        assert_eq!(namespaced_id(-5, None), -5);
    }
}
