//! Holds `kvindex::vllm_hash` to the vectors produced by vLLM's own hash functions: every
//! `hashes.jsonl` record, and every `sha256_cbor*` chain in the frames files'
//! `hash_provenance`. `KVINDEX_VECTORS=<dir>` points the tests at another corpus with the same
//! layout (e.g. the held-out one).

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::support::{frame_files, read_jsonl, read_records};
use kvindex::vllm_hash::{
    BlockHasher, DigestBytes, HashAlgo, InternalHash, ParentRef, PublishedHash, PyValue, VllmHashConfig, VllmVersion,
};

fn config_of(record: &Json) -> VllmHashConfig {
    VllmHashConfig {
        version: VllmVersion::parse(record["version"].as_str().expect("version")).expect("version parses"),
        algo: record["algo"].as_str().expect("algo").parse().expect("known algo"),
        pythonhashseed: record["pythonhashseed"].as_str().map(str::to_string),
    }
}

fn token_ids(value: &Json) -> Vec<u32> {
    value
        .as_array()
        .expect("token_ids array")
        .iter()
        .map(|token| u32::try_from(token.as_u64().expect("token int")).expect("token fits u32"))
        .collect()
}

fn extra_keys(value: &Json) -> Vec<Option<PyValue>> {
    match value.as_array() {
        None => Vec::new(),
        Some(entries) => entries
            .iter()
            .map(|entry| match entry {
                Json::Null => None,
                other => Some(PyValue::from_json(other).expect("valid extra key")),
            })
            .collect(),
    }
}

fn label(record: &Json) -> String {
    format!("{} {} {} {}", record["version"], record["algo"], record["case"], record["pythonhashseed"])
}

#[test]
fn every_hash_record_reproduces() {
    let records = read_jsonl("hashes.jsonl");
    assert!(!records.is_empty(), "hashes.jsonl has no records");
    let mut failures = Vec::new();
    let mut compared_blocks = 0usize;
    for record in &records {
        let name = label(record);
        if record["algo"] == "builtin" {
            continue;
        }
        let hasher = match BlockHasher::new(&config_of(record)) {
            Ok(hasher) => hasher,
            Err(err) => {
                failures.push(format!("{name}: {err}"));
                continue;
            }
        };
        let mut check = |field: &str, actual: Json| {
            if record.get(field) != Some(&actual) {
                failures.push(format!("{name}: {field}: expected {:?}, got {actual}", record.get(field)));
            }
        };
        let block_size = record["block_size"].as_u64().expect("block_size") as usize;
        let tokens = token_ids(&record["token_ids"]);
        let extras = extra_keys(&record["extra_keys_per_block"]);
        let chain = hasher.hash_chain(None, &tokens, block_size, &extras);
        compared_blocks += chain.len();

        check("none_hash_hex", Json::from(hasher.none_hash().to_hex()));
        check("none_hash_seed", Json::from(hasher.none_hash_rule().seed()));
        check("none_hash_algo", Json::from(hasher.none_hash_algo().as_str()));
        let mut seed_input = Vec::new();
        hasher.write_none_hash_seed_input(&mut seed_input);
        check("serialized_none_hash_seed_hex", Json::from(hex::encode(seed_input)));
        check("block_digests_hex", Json::Array(chain.iter().map(|hash| Json::from(hash.to_hex())).collect()));
        check(
            "event_u64",
            Json::Array(
                chain
                    .iter()
                    .map(|hash| match hash.published_u64() {
                        Some(value) => Json::from(format!("0x{value:016x}")),
                        None => Json::Null,
                    })
                    .collect(),
            ),
        );
        let mut block0 = Vec::new();
        hasher.write_block_input(&mut block0, None, &tokens[..block_size], extras.first().and_then(Option::as_ref));
        check("serialized_input_hex_block0", Json::from(hex::encode(block0)));
        if record["internal_type"] == "int" {
            check("none_hash_int", Json::from(hasher.none_hash().to_decimal()));
            check("block_hashes_int", Json::Array(chain.iter().map(|hash| Json::from(hash.to_decimal())).collect()));
        } else {
            check("internal_type", Json::from("bytes"));
        }
    }
    assert!(compared_blocks > 0, "no blocks compared");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// The vectors' internal-hash notation: `bytes:<hex>` digests, `0x%016x` u64 ints.
fn parse_internal(text: &str) -> InternalHash {
    if let Some(hex_digits) = text.strip_prefix("bytes:") {
        let bytes = hex::decode(hex_digits).expect("hex digest");
        InternalHash::Digest(DigestBytes::from_slice(&bytes).expect("digest <= 32 bytes"))
    } else if let Some(hex_digits) = text.strip_prefix("0x") {
        InternalHash::U64(u64::from_str_radix(hex_digits, 16).expect("hex u64"))
    } else {
        panic!("unexpected internal hash notation {text:?}")
    }
}

/// An event's hash value as the wire decoder would hand it over (bytes kept in `storage`).
fn published_of(text: &str, storage: &mut Vec<Vec<u8>>) -> Option<usize> {
    if let Some(hex_digits) = text.strip_prefix("bytes:") {
        storage.push(hex::decode(hex_digits).expect("hex"));
        return Some(storage.len() - 1);
    }
    None
}

#[derive(Default)]
struct ProvenanceTally {
    chains: usize,
    blocks: usize,
    verified_blocks: u32,
}

#[test]
fn every_sha256_cbor_chain_in_frames_reproduces_and_verifies() {
    let mut tally = ProvenanceTally::default();
    let mut failures = Vec::new();
    let mut hashers: BTreeMap<(String, String, Option<String>), BlockHasher> = BTreeMap::new();
    for path in frame_files() {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for (line, record) in read_records(&path).iter().enumerate() {
            let Some(provenance) = record["hash_provenance"].as_array() else {
                continue;
            };
            let events = record["expect"]["events"].as_array().expect("events");
            for (index, entry) in provenance.iter().enumerate() {
                let Some(algo) = entry.get("algo").and_then(Json::as_str) else {
                    continue;
                };
                if !algo.starts_with("sha256_cbor") {
                    continue;
                }
                let name = format!("{file}:{} event {index}", line + 1);
                let version = record["version"].as_str().expect("version").to_string();
                let seed = record["pythonhashseed"].as_str().map(str::to_string);
                let key = (version.clone(), algo.to_string(), seed.clone());
                let hasher = hashers.entry(key).or_insert_with(|| {
                    BlockHasher::new(&VllmHashConfig {
                        version: VllmVersion::parse(&version).expect("version"),
                        algo: algo.parse::<HashAlgo>().expect("algo"),
                        pythonhashseed: seed,
                    })
                    .expect("reproducible provenance config")
                });
                let event = &events[index];
                let block_size = entry["block_size"].as_u64().expect("block_size") as usize;
                let tokens = token_ids(&event["token_ids"]);
                let extras = extra_keys(&entry["hash_extra_keys"]);
                let parent = entry["parent_internal"].as_str().map(parse_internal);
                let expected: Vec<InternalHash> = entry["internal_hashes"]
                    .as_array()
                    .expect("internal_hashes")
                    .iter()
                    .map(|hash| parse_internal(hash.as_str().expect("hash string")))
                    .collect();
                let chain = hasher.hash_chain(parent.as_ref(), &tokens, block_size, &extras);
                tally.chains += 1;
                tally.blocks += chain.len();
                if chain != expected {
                    failures.push(format!("{name}: expected {expected:?}, got {chain:?}"));
                    continue;
                }

                // The cross-check path on the same event must not report a mismatch.
                let mut storage = Vec::new();
                let hash_texts: Vec<&str> = event["block_hashes"]
                    .as_array()
                    .expect("block_hashes")
                    .iter()
                    .map(|hash| hash.as_str().expect("hash string"))
                    .collect();
                let slots: Vec<Option<usize>> =
                    hash_texts.iter().map(|text| published_of(text, &mut storage)).collect();
                let to_published = |text: &str, slot: Option<usize>| match slot {
                    Some(slot) => PublishedHash::Bytes(&storage[slot]),
                    None => {
                        PublishedHash::Int(u64::from_str_radix(text.trim_start_matches("0x"), 16).expect("hex u64"))
                    }
                };
                let published: Vec<PublishedHash<'_>> =
                    hash_texts.iter().zip(&slots).map(|(text, slot)| to_published(text, *slot)).collect();
                let parent_text = event["parent_block_hash"].as_str();
                let parent_bytes =
                    parent_text.and_then(|text| text.strip_prefix("bytes:")).map(|h| hex::decode(h).expect("hex"));
                let parent_ref = match (parent_text, &parent_bytes) {
                    (None, _) => ParentRef::Root,
                    (Some(_), Some(bytes)) => ParentRef::Published(PublishedHash::Bytes(bytes)),
                    (Some(text), None) => ParentRef::Published(PublishedHash::Int(
                        u64::from_str_radix(text.trim_start_matches("0x"), 16).expect("hex u64"),
                    )),
                };
                let carries: Vec<bool> = extras.iter().map(Option::is_some).collect();
                let verification = hasher.verify_chain(
                    parent_ref,
                    &tokens,
                    event["block_size"].as_u64().expect("block_size") as usize,
                    &published,
                    &carries,
                );
                if verification.mismatched != 0 {
                    failures.push(format!("{name}: verify_chain {verification:?}"));
                }
                tally.verified_blocks += verification.matched;
            }
        }
    }
    assert!(tally.chains >= 20, "only {} provenance chains found", tally.chains);
    assert!(tally.blocks > 0 && tally.verified_blocks > 0);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
