//! Valgrind callgrind's client requests, for benches that count instructions per stage: on a
//! shared machine wall-clock figures move with whatever else runs, instruction counts do not.
//! Run the bench under `valgrind --tool=callgrind --instr-atstart=no` and bracket the work to
//! count with [`start`] / [`stop`] (counts add up across brackets and across every thread of
//! the process, e.g. a runtime's workers and its blocking pool), then [`dump`] it under a name.
//! Outside valgrind each request is a few no-op instructions (the magic sequence rotates a
//! register by 128 bits and swaps a register with itself), so a bench can call them always.
//!
//! The sequence and numbers are valgrind's `valgrind.h` / `callgrind.h` (amd64); on other
//! architectures the requests do nothing.

const TOOL_BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
const DUMP_STATS_AT: u64 = TOOL_BASE + 3;
const ZERO_STATS: u64 = TOOL_BASE + 1;
const START_INSTRUMENTATION: u64 = TOOL_BASE + 4;
const STOP_INSTRUMENTATION: u64 = TOOL_BASE + 5;
/// Core request: `RUNNING_ON_VALGRIND` (the number of valgrinds we run under).
const RUNNING_ON_VALGRIND: u64 = 0x1001;

#[cfg(target_arch = "x86_64")]
fn request(code: u64, arg: u64) -> u64 {
    let args: [u64; 6] = [code, arg, 0, 0, 0, 0];
    let mut result: u64 = 0;
    // SAFETY: valgrind's documented client-request sequence. Natively the four rotations add up
    // to 128 bits (rdi unchanged, declared clobbered anyway) and `xchg rbx, rbx` does nothing;
    // under valgrind it reads `args` through rax and writes the answer to rdx.
    unsafe {
        std::arch::asm!(
            "rol rdi, 3",
            "rol rdi, 13",
            "rol rdi, 61",
            "rol rdi, 51",
            "xchg rbx, rbx",
            in("rax") args.as_ptr(),
            inout("rdx") result,
            out("rdi") _,
            options(nostack),
        );
    }
    result
}

#[cfg(not(target_arch = "x86_64"))]
fn request(_code: u64, _arg: u64) -> u64 {
    0
}

/// Whether this process runs under valgrind.
pub fn running() -> bool {
    request(RUNNING_ON_VALGRIND, 0) > 0
}

/// Counts from here on (needs `--instr-atstart=no` to have been off before).
pub fn start() {
    request(START_INSTRUMENTATION, 0);
}

/// Stops counting until the next [`start`].
pub fn stop() {
    request(STOP_INSTRUMENTATION, 0);
}

/// Forgets what was counted so far.
pub fn zero() {
    request(ZERO_STATS, 0);
}

/// Writes what was counted since the last dump or [`zero`] to a new `callgrind.out.<pid>.<n>`
/// file labelled `name`, and zeroes the counts.
pub fn dump(name: &str) {
    let mut label = name.as_bytes().to_vec();
    label.push(0);
    request(DUMP_STATS_AT, label.as_ptr() as u64);
}
