//! Unit tests for the vLLM block hash: the hand-checked vectors of `vllm-kv-events.md` §3/§6
//! (computed by vLLM's own functions) and the cross-check semantics of `verify_chain`.

use super::*;

fn hasher(version: &str, algo: HashAlgo, seed: Option<&str>) -> BlockHasher {
    let config = VllmHashConfig {
        version: VllmVersion::parse(version).expect("test version parses"),
        algo,
        pythonhashseed: seed.map(str::to_string),
    };
    BlockHasher::new(&config).expect("test configuration is reproducible")
}

fn tokens(range: std::ops::RangeInclusive<u32>) -> Vec<u32> {
    range.collect()
}

fn digest_hex(hash: &InternalHash) -> String {
    hash.to_hex()
}

/// (algo, NONE_HASH, block 0, block 1, event b0, event b1) for PYTHONHASHSEED=0, tokens 1..=32, bs 16.
const SEED0_TABLE: [(HashAlgo, &str, &str, &str, u64, u64); 4] = [
    (
        HashAlgo::Sha256,
        "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
        "bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325",
        "2744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31",
        0x6896072ae8b31325,
        0x7d92dcbb5b559e31,
    ),
    (
        HashAlgo::Sha256Cbor,
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
        "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea",
        "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf",
        0x2ceabcfae6d332ea,
        0x26470bbec927f5bf,
    ),
    (
        HashAlgo::Xxhash,
        "6fb31cc38bba6066183f7f2104b9c051",
        "6ba7d7fc1608e5f0a4612b1b0c87458f",
        "dbd92304eaa08219c5cf8f4ce18166b6",
        0xa4612b1b0c87458f,
        0xc5cf8f4ce18166b6,
    ),
    (
        HashAlgo::XxhashCbor,
        "1ebe36576dcb573f26b99533a20aaeca",
        "c2d7a75070fc6d6b0c3fb0af456c1009",
        "93add93233ea572fb2e2b1685bac6f8d",
        0x0c3fb0af456c1009,
        0xb2e2b1685bac6f8d,
    ),
];

#[test]
fn seed0_table_for_every_digest_algo_and_version_range() {
    for version in ["0.13.0", "0.19.1", "0.33.0"] {
        for (algo, none_hash, block0, block1, event0, event1) in SEED0_TABLE {
            let hasher = hasher(version, algo, Some("0"));
            assert_eq!(digest_hex(hasher.none_hash()), none_hash, "{version} {algo}");
            let chain = hasher.hash_chain(None, &tokens(1..=32), 16, &[]);
            assert_eq!(chain.len(), 2);
            assert_eq!(digest_hex(&chain[0]), block0, "{version} {algo}");
            assert_eq!(digest_hex(&chain[1]), block1, "{version} {algo}");
            assert_eq!(chain[0].published_u64(), Some(event0));
            assert_eq!(chain[1].published_u64(), Some(event1));
        }
    }
}

#[test]
fn serialized_block0_inputs_are_byte_exact() {
    let cases = [
        (
            HashAlgo::Sha256Cbor,
            "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e900102030405060708090a0b0c0d0e0f10f6",
        ),
        (
            HashAlgo::Sha256,
            "8005954a0000000000000043201973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c94284b014b024b034b044b054b064b074b084b094b0a4b0b4b0c4b0d4b0e4b0f4b1074944e87942e",
        ),
        (HashAlgo::XxhashCbor, "83501ebe36576dcb573f26b99533a20aaeca900102030405060708090a0b0c0d0e0f10f6"),
    ];
    for (algo, expected) in cases {
        let hasher = hasher("0.33.0", algo, Some("0"));
        let mut out = Vec::new();
        hasher.write_block_input(&mut out, None, &tokens(1..=16), None);
        assert_eq!(hex::encode(&out), expected, "{algo}");
    }
    let mut seed_input = Vec::new();
    hasher("0.33.0", HashAlgo::Sha256Cbor, Some("0")).write_none_hash_seed_input(&mut seed_input);
    assert_eq!(hex::encode(seed_input), "6130");
}

#[test]
fn unset_seed_from_0_29_uses_default_seed_for_crypto_algos() {
    let cbor = hasher("0.29.0", HashAlgo::Sha256Cbor, None);
    let mut seed_input = Vec::new();
    cbor.write_none_hash_seed_input(&mut seed_input);
    assert_eq!(hex::encode(seed_input), "6e766c6c6d2d6e6f6e652d68617368");
    assert_eq!(digest_hex(cbor.none_hash()), "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
    let chain = cbor.hash_chain(None, &tokens(1..=32), 16, &[]);
    assert_eq!(digest_hex(&chain[0]), "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682");
    assert_eq!(chain[0].published_u64(), Some(0x7b0bf7bf7fd01682));
    assert_eq!(chain[1].published_u64(), Some(0x0b368b33d87bf3bf));

    let pickle = hasher("0.31.0", HashAlgo::Sha256, None);
    assert_eq!(digest_hex(pickle.none_hash()), "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198");
    let chain = pickle.hash_chain(None, &tokens(1..=32), 16, &[]);
    assert_eq!(digest_hex(&chain[0]), "7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf");
    assert_eq!(digest_hex(&chain[1]), "8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577");
}

#[test]
fn unset_seed_is_an_error_where_none_hash_is_random() {
    let config = |version: &str, algo| VllmHashConfig {
        version: VllmVersion::parse(version).expect("parses"),
        algo,
        pythonhashseed: None,
    };
    for (version, algo) in [
        ("0.9.2", HashAlgo::Sha256),
        ("0.10.0", HashAlgo::Sha256Cbor64bit),
        ("0.26.0", HashAlgo::Sha256Cbor),
        ("0.28.9", HashAlgo::Sha256),
        ("0.29.0", HashAlgo::Xxhash),
        ("0.33.0", HashAlgo::XxhashCbor),
    ] {
        assert!(
            matches!(BlockHasher::new(&config(version, algo)), Err(VllmHashError::RandomNoneHash { .. })),
            "{version} {algo}"
        );
    }
}

#[test]
fn algos_are_gated_by_version_range() {
    let config = |version: &str, algo| VllmHashConfig {
        version: VllmVersion::parse(version).expect("parses"),
        algo,
        pythonhashseed: Some("0".into()),
    };
    let err = |version, algo| BlockHasher::new(&config(version, algo)).err();
    assert_eq!(err("0.9.2", HashAlgo::Builtin), Some(VllmHashError::BuiltinNotReproducible));
    assert!(matches!(err("0.9.2", HashAlgo::Sha256Cbor64bit), Some(VllmHashError::AlgoNotInVersion { .. })));
    assert!(matches!(err("0.10.2", HashAlgo::Sha256Cbor64bit), Some(VllmHashError::AlgoNotInVersion { .. })));
    assert!(matches!(err("0.10.1", HashAlgo::Sha256Cbor), Some(VllmHashError::AlgoNotInVersion { .. })));
    assert!(matches!(err("0.12.0", HashAlgo::Xxhash), Some(VllmHashError::AlgoNotInVersion { .. })));
    assert!(matches!(err("0.11.0", HashAlgo::Builtin), Some(VllmHashError::AlgoNotInVersion { .. })));
    assert!(matches!(err("0.8.5", HashAlgo::Sha256), Some(VllmHashError::VersionTooOld(_))));
    assert_eq!(err("0.10.0", HashAlgo::Sha256Cbor64bit), None);
    assert_eq!(err("0.13.0", HashAlgo::XxhashCbor), None);
}

#[test]
fn sha256_cbor_64bit_chain_is_over_u64_ints() {
    let hasher = hasher("0.10.0", HashAlgo::Sha256Cbor64bit, Some("0"));
    assert_eq!(*hasher.none_hash(), InternalHash::U64(0xf8b55adff2e61c3e));
    let mut input = Vec::new();
    hasher.write_block_input(&mut input, None, &tokens(1..=16), None);
    assert_eq!(hex::encode(input), "831bf8b55adff2e61c3e900102030405060708090a0b0c0d0e0f10f6");
    let chain = hasher.hash_chain(None, &tokens(1..=32), 16, &[]);
    assert_eq!(chain, vec![InternalHash::U64(0x548461b2ca3c5e4b), InternalHash::U64(0x309b569846d27d0c)]);
    assert_eq!(chain[1].published_u64(), Some(0x309b569846d27d0c));
}

#[test]
fn sha256_before_0_10_2_is_a_256_bit_int_that_cannot_be_published() {
    let hasher = hasher("0.10.0", HashAlgo::Sha256, Some("0"));
    let chain = hasher.hash_chain(None, &tokens(1..=16), 16, &[]);
    let hex = digest_hex(&chain[0]);
    assert!(hex.starts_with("535771b9") && hex.ends_with("c4dae0bc"), "{hex}");
    assert_eq!(chain[0].published_u64(), None);
    assert!(!hasher.can_publish());
    // 0.9.x uses the same pickle-sha256 NONE_HASH int.
    let old = self::hasher("0.9.0", HashAlgo::Sha256, Some("0"));
    assert_eq!(
        old.none_hash().to_decimal().as_deref(),
        Some("11512569939066563460446379600789296176438808911994074490255290397072634980988")
    );
}

#[test]
fn extra_key_examples() {
    let hasher = hasher("0.30.0", HashAlgo::Sha256Cbor, Some("0"));
    let old_style = PyValue::Tuple(vec![PyValue::Str("my-lora".into()), PyValue::Str("salt-1".into())]);
    let mut input = Vec::new();
    hasher.write_block_input(&mut input, None, &tokens(1..=16), Some(&old_style));
    // `…10 82 67"my-lora" 66"salt-1"`
    assert!(hex::encode(&input).ends_with("1082676d792d6c6f72616673616c742d31"));
    assert_eq!(
        digest_hex(&hasher.hash_block(None, &tokens(1..=16), Some(&old_style))),
        "fa8e3c82edaa7a102d2f28953ac99ee07991bc597f8239e826f909613a7a9518"
    );

    let tagged = PyValue::Tuple(vec![
        PyValue::Tuple(vec![
            PyValue::Str("lora".into()),
            PyValue::Str("my-lora".into()),
            PyValue::Str("/adapters/my-lora".into()),
        ]),
        PyValue::Tuple(vec![PyValue::Str("cache_salt".into()), PyValue::Str("salt-1".into())]),
    ]);
    let hasher = self::hasher("0.31.0", HashAlgo::Sha256Cbor, Some("0"));
    let mut input = Vec::new();
    hasher.write_block_input(&mut input, None, &tokens(1..=16), Some(&tagged));
    assert_eq!(
        hex::encode(&input),
        "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e\
         900102030405060708090a0b0c0d0e0f10\
         8283646c6f7261676d792d6c6f7261712f61646170746572732f6d792d6c6f7261826a63616368655f73616c746673616c742d31"
    );
    assert_eq!(
        digest_hex(&hasher.hash_block(None, &tokens(1..=16), Some(&tagged))),
        "ec40497b74b72564dc594ea9abf4a06a092fc35f1256d6df24740663e3710bd7"
    );
}

#[test]
fn falsy_parent_counts_as_none() {
    let hasher = hasher("0.10.1", HashAlgo::Sha256Cbor64bit, Some("0"));
    let from_none = hasher.hash_block(None, &tokens(1..=16), None);
    let from_zero = hasher.hash_block(Some(&InternalHash::U64(0)), &tokens(1..=16), None);
    assert_eq!(from_none, from_zero);
}

#[test]
fn versions_parse_with_suffixes_and_order() {
    let parse = |text| VllmVersion::parse(text);
    assert_eq!(parse("0.10.1"), Ok(VllmVersion::new(0, 10, 1)));
    assert_eq!(parse("v0.33.0"), Ok(VllmVersion::new(0, 33, 0)));
    assert_eq!(parse("0.11.0rc1"), Ok(VllmVersion::new(0, 11, 0)));
    assert_eq!(parse("0.25.2+cu128"), Ok(VllmVersion::new(0, 25, 2)));
    assert_eq!(parse("0.10.2.dev5+gabc"), Ok(VllmVersion::new(0, 10, 2)));
    assert_eq!(parse("0.13"), Ok(VllmVersion::new(0, 13, 0)));
    assert_eq!(parse(" 0.9.2 "), Ok(VllmVersion::new(0, 9, 2)));
    for bad in ["", "abc", "0", "0.", ".1.2", "0.x.1", "99999999999.0.0"] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
    assert!(VllmVersion::new(0, 10, 2) > VllmVersion::new(0, 10, 1));
    assert!(VllmVersion::new(0, 9, 2) < VllmVersion::new(0, 10, 0));
}

#[test]
fn decimal_of_256_bit_int() {
    let mut be = [0u8; 32];
    assert_eq!(be_bytes_to_decimal(&be), "0");
    be[31] = 10;
    assert_eq!(be_bytes_to_decimal(&be), "10");
    let max = [0xffu8; 32];
    assert_eq!(
        be_bytes_to_decimal(&max),
        "115792089237316195423570985008687907853269984665640564039457584007913129639935"
    );
}

#[test]
fn py_value_from_json_follows_vector_conventions() {
    let json: serde_json::Value =
        serde_json::from_str(r#"[null, -27, "mm", "bytes:00ff", ["a", 18446744073709551615]]"#).expect("valid json");
    assert_eq!(
        PyValue::from_json(&json),
        Ok(PyValue::Tuple(vec![
            PyValue::None,
            PyValue::Int(-27),
            PyValue::Str("mm".into()),
            PyValue::Bytes(vec![0, 0xff]),
            PyValue::Tuple(vec![PyValue::Str("a".into()), PyValue::Int(i128::from(u64::MAX))]),
        ]))
    );
    for bad in ["1.5", "true", "{}", "\"bytes:zz\""] {
        let json: serde_json::Value = serde_json::from_str(bad).expect("valid json");
        assert!(PyValue::from_json(&json).is_err(), "{bad}");
    }
}

// ---- verify_chain ----------------------------------------------------------------------------

fn published_u64s(chain: &[InternalHash]) -> Vec<u64> {
    chain.iter().map(|hash| hash.published_u64().expect("publishable")).collect()
}

fn as_published(values: &[u64]) -> Vec<PublishedHash<'static>> {
    values.iter().map(|&value| PublishedHash::Int(value)).collect()
}

#[test]
fn correct_chain_verifies() {
    let engine = hasher("0.33.0", HashAlgo::Sha256Cbor, Some("0"));
    let token_ids = tokens(1..=64);
    let chain = engine.hash_chain(None, &token_ids, 16, &[]);
    let published = as_published(&published_u64s(&chain));
    let result = engine.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[]);
    assert_eq!(result, Verification { checked: 4, matched: 4, mismatched: 0, unverifiable: 0, first_mismatch: None });
}

#[test]
fn wrong_seed_algo_or_block_size_mismatch() {
    let engine = hasher("0.33.0", HashAlgo::Sha256Cbor, Some("0"));
    let token_ids = tokens(1..=64);
    let published = as_published(&published_u64s(&engine.hash_chain(None, &token_ids, 16, &[])));

    let wrong_seed = hasher("0.33.0", HashAlgo::Sha256Cbor, Some("1"));
    let result = wrong_seed.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[]);
    assert_eq!((result.matched, result.first_mismatch), (0, Some(0)));
    assert!(result.mismatched >= 1);

    let wrong_algo = hasher("0.33.0", HashAlgo::Sha256, Some("0"));
    let result = wrong_algo.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[]);
    assert_eq!(result.matched, 0);
    assert!(result.mismatched >= 1);

    // The right hasher told the wrong block size: every checkable block mismatches.
    let result = engine.verify_chain(ParentRef::Root, &token_ids, 32, &published, &[]);
    assert_eq!(result.matched, 0);
    assert!(result.mismatched >= 1);

    // Unset seed where vLLM >= 0.29 defaults it, against an engine that set "0".
    let defaulted = hasher("0.33.0", HashAlgo::Sha256Cbor, None);
    let result = defaulted.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[]);
    assert_eq!(result.matched, 0);
}

#[test]
fn truncated_parent_is_unverifiable_but_full_parent_verifies() {
    let engine = hasher("0.23.0", HashAlgo::Sha256Cbor, Some("0"));
    let token_ids = tokens(1..=48);
    let chain = engine.hash_chain(None, &token_ids, 16, &[]);
    let continuation = &token_ids[16..];

    let truncated = ParentRef::Published(PublishedHash::Int(chain[0].published_u64().unwrap_or(0)));
    let published = as_published(&published_u64s(&chain[1..]));
    let result = engine.verify_chain(truncated, continuation, 16, &published, &[]);
    assert_eq!(result, Verification { checked: 0, matched: 0, mismatched: 0, unverifiable: 2, first_mismatch: None });

    // Raw-bytes mode carries full digests: the same continuation is verifiable.
    let InternalHash::Digest(parent) = chain[0] else { panic!("0.23 digests are bytes") };
    let raw: Vec<DigestBytes> = chain[1..]
        .iter()
        .map(|hash| match hash {
            InternalHash::Digest(digest) => *digest,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let published: Vec<PublishedHash<'_>> = raw.iter().map(|digest| PublishedHash::Bytes(digest.as_bytes())).collect();
    let result = engine.verify_chain(
        ParentRef::Published(PublishedHash::Bytes(parent.as_bytes())),
        continuation,
        16,
        &published,
        &[],
    );
    assert_eq!((result.checked, result.matched), (2, 2));
}

#[test]
fn sha256_cbor_64bit_any_parent_verifies() {
    let engine = hasher("0.10.1", HashAlgo::Sha256Cbor64bit, Some("0"));
    let token_ids = tokens(1..=48);
    let chain = engine.hash_chain(None, &token_ids, 16, &[]);
    let values = published_u64s(&chain);
    let result = engine.verify_chain(
        ParentRef::Published(PublishedHash::Int(values[0])),
        &token_ids[16..],
        16,
        &as_published(&values[1..]),
        &[],
    );
    assert_eq!((result.checked, result.matched), (2, 2));
}

#[test]
fn blocks_with_extra_keys_are_unverifiable_and_the_chain_resumes_only_from_full_values() {
    let engine = hasher("0.33.0", HashAlgo::Sha256Cbor, Some("0"));
    let token_ids = tokens(1..=48);
    let lora = PyValue::Tuple(vec![PyValue::Str("sql-lora".into())]);
    let chain = engine.hash_chain(None, &token_ids, 16, &[Some(lora.clone()), None, None]);
    let published = as_published(&published_u64s(&chain));
    let result = engine.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[true]);
    // Block 0 carries extra keys; blocks 1-2 chain from its unknown full digest.
    assert_eq!((result.checked, result.unverifiable), (0, 3));

    let sixty_four = hasher("0.10.1", HashAlgo::Sha256Cbor64bit, Some("0"));
    let chain = sixty_four.hash_chain(None, &token_ids, 16, &[Some(lora), None, None]);
    let published = as_published(&published_u64s(&chain));
    let result = sixty_four.verify_chain(ParentRef::Root, &token_ids, 16, &published, &[true]);
    assert_eq!((result.checked, result.matched, result.unverifiable), (2, 2, 1));
}

#[test]
fn unpublishable_and_degenerate_inputs_never_panic() {
    let engine = hasher("0.9.0", HashAlgo::Sha256, Some("0"));
    let result = engine.verify_chain(ParentRef::Root, &[1, 2], 1, &as_published(&[1, 2]), &[]);
    assert_eq!(result.unverifiable, 2);

    let engine = hasher("0.33.0", HashAlgo::Sha256Cbor, Some("0"));
    let result = engine.verify_chain(ParentRef::Root, &[], 0, &as_published(&[7]), &[]);
    assert_eq!(result.unverifiable, 1);
    let result = engine.verify_chain(ParentRef::Root, &[1, 2, 3], usize::MAX, &as_published(&[7, 8]), &[]);
    assert_eq!(result.mismatched, 1);
    let short = [PublishedHash::Bytes(&[1, 2, 3])];
    let result = engine.verify_chain(ParentRef::Root, &tokens(1..=16), 16, &short, &[]);
    assert_eq!(result.mismatched, 1);
}

// ---- properties ------------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    const DIGEST_ALGOS: [HashAlgo; 4] =
        [HashAlgo::Sha256, HashAlgo::Sha256Cbor, HashAlgo::Xxhash, HashAlgo::XxhashCbor];

    proptest! {
        /// Whatever the tokens and block size, an engine's own chain verifies against itself,
        /// in u64 mode and in raw-bytes mode.
        #[test]
        fn own_chain_always_verifies(
            token_ids in proptest::collection::vec(any::<u32>(), 0..120),
            block_size in 1usize..20,
            algo_index in 0usize..4,
        ) {
            let engine = hasher("0.33.0", DIGEST_ALGOS[algo_index], Some("7"));
            let chain = engine.hash_chain(None, &token_ids, block_size, &[]);
            let covered = &token_ids[..chain.len() * block_size];
            let as_u64 = as_published(&published_u64s(&chain));
            let result = engine.verify_chain(ParentRef::Root, covered, block_size, &as_u64, &[]);
            prop_assert_eq!((result.matched as usize, result.mismatched), (chain.len(), 0));

            let digests: Vec<DigestBytes> = chain
                .iter()
                .filter_map(|hash| match hash {
                    InternalHash::Digest(digest) => Some(*digest),
                    _ => None,
                })
                .collect();
            let raw: Vec<PublishedHash<'_>> =
                digests.iter().map(|digest| PublishedHash::Bytes(digest.as_bytes())).collect();
            let result = engine.verify_chain(ParentRef::Root, covered, block_size, &raw, &[]);
            prop_assert_eq!((result.matched as usize, result.mismatched), (chain.len(), 0));
        }

        /// Arbitrary event contents never panic and every block is accounted for once.
        #[test]
        fn arbitrary_events_never_panic(
            token_ids in proptest::collection::vec(any::<u32>(), 0..64),
            block_size in 0usize..40,
            values in proptest::collection::vec(any::<u64>(), 0..8),
            raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
            parent in proptest::option::of(any::<u64>()),
            carries in proptest::collection::vec(any::<bool>(), 0..8),
        ) {
            let mut published: Vec<PublishedHash<'_>> =
                values.iter().map(|&value| PublishedHash::Int(value)).collect();
            published.extend(raw.iter().map(|bytes| PublishedHash::Bytes(bytes)));
            let parent = match parent {
                None => ParentRef::Root,
                Some(value) => ParentRef::Published(PublishedHash::Int(value)),
            };
            for engine in [
                hasher("0.33.0", HashAlgo::Sha256Cbor, None),
                hasher("0.10.1", HashAlgo::Sha256Cbor64bit, Some("0")),
                hasher("0.10.1", HashAlgo::Sha256, Some("0")),
            ] {
                let result = engine.verify_chain(parent, &token_ids, block_size, &published, &carries);
                prop_assert_eq!(result.checked, result.matched + result.mismatched);
                prop_assert_eq!((result.checked + result.unverifiable) as usize, published.len());
            }
        }

        /// Pickled ints decode back to the same value (LONG1 two's complement, BININT widths).
        #[test]
        fn pickled_ints_round_trip(value in any::<i128>()) {
            let engine = hasher("0.33.0", HashAlgo::Sha256, Some("0"));
            let mut out = Vec::new();
            engine.write_block_input(&mut out, None, &[], Some(&PyValue::Int(value)));
            // PROTO(2) FRAME(9) SHORT_BINBYTES(2+32) MEMOIZE EMPTY_TUPLE, then the int.
            let int_start = 2 + 9 + 34 + 1 + 1;
            let decoded: i128 = match out[int_start] {
                b'K' => i128::from(out[int_start + 1]),
                b'M' => i128::from(u16::from_le_bytes([out[int_start + 1], out[int_start + 2]])),
                b'J' => {
                    let mut le = [0u8; 4];
                    le.copy_from_slice(&out[int_start + 1..int_start + 5]);
                    i128::from(i32::from_le_bytes(le))
                }
                0x8a => {
                    let len = usize::from(out[int_start + 1]);
                    let data = &out[int_start + 2..int_start + 2 + len];
                    prop_assert!(len <= 16);
                    let fill = if data[len - 1] & 0x80 != 0 { 0xff } else { 0 };
                    let mut le = [fill; 16];
                    le[..len].copy_from_slice(data);
                    // Minimal: dropping the top byte would change the value.
                    if len > 1 {
                        let top = data[len - 1];
                        let next_sign = data[len - 2] & 0x80 != 0;
                        prop_assert!(!((top == 0 && !next_sign) || (top == 0xff && next_sign)));
                    }
                    i128::from_le_bytes(le)
                }
                other => return Err(TestCaseError::fail(format!("unexpected opcode {other:#x}"))),
            };
            prop_assert_eq!(decoded, value);
        }
    }
}
