//! The core's test support: the vLLM vectors in the repository ([`vectors`]), the frames of
//! a captured record, and the reference model of what an engine holds ([`reference`]).
#![allow(dead_code)]

pub mod reference;
pub mod vectors;

#[allow(unused_imports)] // not every test uses the vectors
pub use vectors::*;

use serde_json::Value;

/// The frames of a vectors record (`frames_hex`).
pub fn frames_of(record: &Value) -> Vec<Vec<u8>> {
    record["frames_hex"]
        .as_array()
        .expect("frames_hex")
        .iter()
        .map(|f| hex::decode(f.as_str().expect("hex string")).expect("hex"))
        .collect()
}
