//! The `wire` fuzz target's body on stable, in every test run: its committed seed corpus (vLLM
//! frames) plus fixed-seed mutations of it (see `zmtp/fuzz/bodies/corpus.rs`). cargo-fuzz runs
//! the same body coverage-guided on nightly (`cd indexer/zmtp/fuzz && cargo +nightly fuzz run wire seeds/wire`).

#[path = "../../zmtp/fuzz/bodies/corpus.rs"]
mod corpus;
#[path = "../../zmtp/fuzz/bodies/wire.rs"]
mod wire;

#[test]
fn wire_target_over_its_corpus_and_mutations() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("zmtp/fuzz/seeds/wire");
    let ran = corpus::exercise(&dir, 5_000, wire::run);
    assert!(ran > 5_000);
}
