//! The threads a snapshot runs on: ingest and queries come first.
//!
//! A snapshot's exports, encoding and RocksDB write are background work whose only deadline is
//! the next snapshot, while the apply workers and the gRPC server have requests waiting. On a
//! saturated machine the snapshot must take what the hot path leaves, not share the cores with
//! it evenly, so its threads run at a lower CPU priority: nice [`NICE`] on Linux (there the nice
//! value is per thread), RocksDB's own flush and compaction threads too (`store::options`).
//! On an idle machine that costs nothing: a lower priority only matters when a core is
//! contended.

use std::sync::OnceLock;

/// How much lower than the process a snapshot thread runs (Linux nice increment).
pub const NICE: i32 = 10;

/// The snapshot pool: one thread per core, at a lower priority. Built on first use.
pub fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kvindex-snapshot-{i}"))
            .start_handler(|_| lower_priority())
            // A panic in snapshot work must not take ingest down (rayon aborts without a
            // handler): the task's reply channel is dropped, and the snapshot fails, logged.
            .panic_handler(|_| tracing::error!("a snapshot task panicked: this snapshot fails, ingest goes on"))
            .build()
            .expect("a thread pool of a few threads can always be built")
    })
}

/// Threads the pool runs at once (the most exports a worker keeps in flight).
pub fn threads() -> usize {
    pool().current_num_threads()
}

/// Lowers the calling thread's CPU priority by [`NICE`]. Best effort: a refusal (a sandbox
/// without the permission) leaves the thread at the process's priority, which is correct, only
/// less polite to ingest.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority/setpriority take plain integers and touch no memory of ours;
        // `who = 0` is the calling thread on Linux.
        unsafe {
            let current = libc::getpriority(libc::PRIO_PROCESS, 0);
            libc::setpriority(libc::PRIO_PROCESS, 0, (current + NICE).min(19));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn snapshot_threads_run_below_the_callers_priority() {
        // SAFETY: see `lower_priority`.
        let caller = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let (tx, rx) = std::sync::mpsc::channel();
        pool().spawn(move || {
            let _ = tx.send(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) });
        });
        let theirs = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the pool runs");
        assert_eq!(theirs, (caller + NICE).min(19), "a snapshot thread runs at the caller's nice + {NICE}");
        assert!(threads() >= 1);
    }
}
