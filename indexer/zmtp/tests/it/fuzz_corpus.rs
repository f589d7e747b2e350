//! The `decoder` fuzz target's body on stable, in every test run: its committed seed corpus plus
//! fixed-seed mutations of it (see `fuzz/bodies/corpus.rs`). cargo-fuzz runs the same body
//! coverage-guided on nightly (`cd indexer/zmtp/fuzz && cargo +nightly fuzz run decoder seeds/decoder`).

#[path = "../../fuzz/bodies/corpus.rs"]
mod corpus;
#[path = "../../fuzz/bodies/decoder.rs"]
mod decoder;

#[test]
fn decoder_target_over_its_corpus_and_mutations() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/decoder");
    let ran = corpus::exercise(&dir, 20_000, decoder::run);
    assert!(ran > 20_000);
}
