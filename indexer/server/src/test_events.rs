//! vLLM-shaped event batches for the service's unit tests (the stream table's, the apply
//! worker's): one `BlockStored` in the map form, encoded with `rmp-serde`. The wire decoder's own
//! tests cover every form against vLLM's vectors; these tests are about what happens around it.

#[derive(serde::Serialize)]
struct Stored {
    #[serde(rename = "type")]
    ty: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: u32,
    lora_id: Option<i64>,
    medium: &'static str,
}

/// A batch `[ts, [BlockStored], dp_rank]` storing one 16-token GPU block `hash` after
/// `parent`.
pub fn one_block_stored(hash: u64, parent: Option<u64>, token_ids: Vec<u32>, dp_rank: i64) -> Vec<u8> {
    let event = Stored {
        ty: "BlockStored",
        block_hashes: vec![hash],
        parent_block_hash: parent,
        token_ids,
        block_size: 16,
        lora_id: None,
        medium: "GPU",
    };
    rmp_serde::to_vec_named(&(1.0f64, vec![event], dp_rank)).expect("a batch encodes")
}

#[derive(serde::Serialize)]
struct Removed {
    #[serde(rename = "type")]
    ty: &'static str,
    block_hashes: Vec<u64>,
    medium: &'static str,
}

#[derive(serde::Serialize)]
struct Cleared {
    #[serde(rename = "type")]
    ty: &'static str,
}

/// A batch `[ts, [BlockRemoved], dp_rank]` evicting GPU blocks `hashes`.
pub fn blocks_removed(hashes: Vec<u64>, dp_rank: i64) -> Vec<u8> {
    let event = Removed { ty: "BlockRemoved", block_hashes: hashes, medium: "GPU" };
    rmp_serde::to_vec_named(&(1.0f64, vec![event], dp_rank)).expect("a batch encodes")
}

/// A batch `[ts, [AllBlocksCleared], dp_rank]`.
pub fn all_blocks_cleared(dp_rank: i64) -> Vec<u8> {
    rmp_serde::to_vec_named(&(1.0f64, vec![Cleared { ty: "AllBlocksCleared" }], dp_rank)).expect("a batch encodes")
}
