//! The untrusted-bytes parser under arbitrary input, in the normal test suite (a bounded number
//! of cases, 1000 by default; `PROPTEST_CASES=100000 cargo nextest run -p kvindex-zmtp decoder_fuzz` for more,
//! and `indexer/zmtp/fuzz/` for coverage-guided fuzzing):
//! - it never panics;
//! - it allocates in proportion to the bytes it was given, never to the sizes they declare
//!   (a counting allocator measures the peak of live bytes on this thread);
//! - what it holds for an unfinished message stays within `max_message_size` (plus one command
//!   in progress, at most `MAX_COMMAND_SIZE`); every message it yields keeps `max_parts` and
//!   `max_message_size`;
//! - splitting the input into arbitrary chunks changes nothing (the same items, the same
//!   error), and an error is final.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvindex_zmtp::decoder::{Decoder, Item, MAX_COMMAND_SIZE};
use kvindex_zmtp::{Limits, ProtocolError};
use proptest::prelude::*;

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak of live bytes allocated on this thread while `f` runs, above what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, (PEAK.with(Cell::get) - base).max(0) as usize)
}

fn limits() -> Limits {
    Limits { max_frame_size: 1024, max_message_size: 2048, max_parts: 4, ..Limits::default() }
}

/// What the decoder makes of `chunks`, fed in order: the items, then the error if any.
fn run(chunks: &[&[u8]], limits: &Limits) -> (Vec<Item>, Option<ProtocolError>, usize) {
    let mut d = Decoder::new(limits);
    let mut items = Vec::new();
    let mut held_max = 0;
    for chunk in chunks {
        let mut input = *chunk;
        loop {
            match d.decode(&mut input) {
                Ok(Some(item)) => {
                    if let Item::Message(frames) = &item {
                        assert!(frames.len() <= limits.max_parts);
                        assert!(frames.iter().map(|f| f.len()).sum::<usize>() <= limits.max_message_size);
                    }
                    items.push(item);
                }
                Ok(None) => {
                    assert!(input.is_empty(), "Ok(None) only when the input is used up");
                    break;
                }
                Err(e) => {
                    assert_eq!(d.decode(&mut &b"more"[..]), Err(e.clone()), "an error is final");
                    return (items, Some(e), held_max);
                }
            }
            held_max = held_max.max(d.held_bytes());
        }
        held_max = held_max.max(d.held_bytes());
    }
    (items, None, held_max)
}

fn greeting(minor: u8) -> Vec<u8> {
    let mut g = vec![0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = minor;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// A frame header: flags, then a size that is small, on the short/long boundary, at a limit,
/// or absurd; the body bytes that follow may be fewer than declared, or padded to the
/// declared size when that is small enough to be worth sending.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let flags = prop_oneof![Just(0u8), Just(1), Just(4), Just(2), Just(3), Just(6), any::<u8>()];
    let size = prop_oneof![
        0u64..300,
        Just(255),
        Just(256),
        Just(1024),
        Just(1025),
        Just(2048),
        Just(MAX_COMMAND_SIZE as u64 + 1),
        Just(1 << 36),
        Just(u64::MAX),
        any::<u64>(),
    ];
    let command = prop_oneof![
        Just(b"\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB".to_vec()),
        Just(b"\x04PING\x00\x00ctx".to_vec()),
        Just(b"\x05ERROR\x04oops".to_vec()),
        Just(b"\x09SUBSCRIBEkv@".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    (flags, size, proptest::collection::vec(any::<u8>(), 0..600), command, any::<bool>(), any::<bool>()).prop_map(
        |(flags, size, filler, command, use_command, complete)| {
            let mut body = if use_command && flags & 4 != 0 { command } else { filler };
            if complete && size <= 4096 {
                body.resize(size as usize, 0xaa);
            }
            let mut out = vec![flags];
            if flags & 2 != 0 {
                out.extend_from_slice(&size.max(body.len() as u64).to_be_bytes());
            } else {
                out.push(size.min(255) as u8);
            }
            let declared = if flags & 2 != 0 { size.max(body.len() as u64) } else { size.min(255) };
            out.extend_from_slice(&body[..body.len().min(declared as usize)]);
            out
        },
    )
}

/// A stream that gets past the greeting most of the time: a greeting (sometimes damaged),
/// then frames.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(0u8), Just(1), Just(2)],
        proptest::option::weighted(0.1, (0usize..64, any::<u8>())),
        proptest::collection::vec(frame(), 0..24),
    )
        .prop_map(|(minor, damage, frames)| {
            let mut s = greeting(minor);
            if let Some((i, b)) = damage {
                s[i] = b;
            }
            for f in frames {
                s.extend(f);
            }
            s
        })
}

fn chunked(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        out.push(bytes[last..p].to_vec());
        last = p;
    }
    out
}

fn check(bytes: &[u8], cuts: &[usize]) {
    let limits = limits();
    let ((items, error, held_max), peak) = peak_during(|| run(&[bytes], &limits));
    // Items own copies of what they carry; the decoder itself may hold one body in progress
    // (at most twice what arrived, at least one growth step) and its part list.
    let bound = 3 * bytes.len() + (64 << 10) + 4096;
    assert!(peak <= bound, "{peak} bytes allocated for {} bytes of input (bound {bound})", bytes.len());
    assert!(held_max <= limits.max_message_size + MAX_COMMAND_SIZE, "held {held_max}");
    let pieces = chunked(bytes, cuts);
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let (items2, error2, _) = run(&refs, &limits);
    assert_eq!((items, error), (items2, error2), "chunking changed the result");
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    // Failures are recorded beside this file (`decoder_fuzz.proptest-regressions`), and proptest
    // re-runs their seeds first; `recorded_failures_still_pass` re-runs their shrunk inputs too,
    // which stay valid when a strategy changes and the seeds no longer reproduce the case.
    let persistence = proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions");
    ProptestConfig { cases, failure_persistence: Some(Box::new(persistence)), ..ProptestConfig::default() }
}

/// The shrunk `(bytes, cuts)` of every case recorded in the regressions file.
fn recorded_failures() -> Vec<(Vec<u8>, Vec<usize>)> {
    fn list<T: std::str::FromStr>(line: &str, name: &str) -> Vec<T> {
        let start =
            line.find(&format!("{name} = [")).unwrap_or_else(|| panic!("no `{name}` in {line:.80}")) + name.len() + 4;
        let end = start + line[start..].find(']').expect("an unclosed list");
        line[start..end]
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().ok().expect("a number"))
            .collect()
    }
    let text = include_str!("decoder_fuzz.proptest-regressions");
    text.lines().filter(|l| l.starts_with("cc ")).map(|l| (list(l, "bytes"), list(l, "cuts"))).collect()
}

#[test]
fn recorded_failures_still_pass() {
    let cases = recorded_failures();
    assert!(!cases.is_empty(), "the regressions file lists no case");
    for (bytes, cuts) in &cases {
        check(bytes, cuts);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        check(&bytes, &cuts);
    }

    #[test]
    fn greeting_then_arbitrary_frames(bytes in stream(), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        check(&bytes, &cuts);
    }
}

#[test]
fn the_allocation_probe_sees_a_declared_body_grow() {
    // The probe itself must be able to fail: a 1 MiB body that arrives in full is allocated
    // (and held: MORE is set, the message is unfinished).
    let mut s = greeting(1);
    s.push(3);
    s.extend_from_slice(&(1u64 << 20).to_be_bytes());
    let limits = Limits { max_frame_size: 2 << 20, max_message_size: 2 << 20, ..Limits::default() };
    let first = s.clone();
    s.extend(std::iter::repeat_n(7u8, 1 << 20));
    let ((_, _, held), peak) = peak_during(|| run(&[&first, &s[first.len()..]], &limits));
    assert!(peak >= 1 << 20, "peak {peak}");
    assert_eq!(held, 1 << 20);
}

#[test]
fn the_stream_generator_reaches_every_outcome() {
    // Otherwise the property above could pass by never getting past the greeting.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2000 {
        let bytes = stream().new_tree(&mut runner).unwrap().current();
        let (items, error, _) = run(&[&bytes], &limits());
        if items.iter().any(|i| matches!(i, Item::Message(_))) {
            seen.insert("message");
        }
        if items.iter().any(|i| matches!(i, Item::Command(_))) {
            seen.insert("command");
        }
        if let Some(e) = error {
            seen.insert(e.label());
        }
    }
    for outcome in [
        "message",
        "command",
        "bad_signature",
        "frame_too_large",
        "message_too_large",
        "too_many_parts",
        "command_too_large",
        "invalid_flags",
        "malformed_command",
    ] {
        assert!(seen.contains(outcome), "never reached {outcome}: {seen:?}");
    }
}
