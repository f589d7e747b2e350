//! Fuzzes the ZMTP decoder (the body is in `bodies/decoder.rs`, which the stable test suite
//! also runs over the seed corpus).
#![no_main]

#[path = "../bodies/decoder.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
