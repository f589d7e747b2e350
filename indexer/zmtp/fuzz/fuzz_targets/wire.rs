//! Fuzzes vLLM's frame layouts, the msgpack batch decoder and applying batches to an index
//! (the body is in `bodies/wire.rs`, which the stable test suite also runs over the seed corpus).
#![no_main]

#[path = "../bodies/wire.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
