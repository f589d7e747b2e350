//! What every crate's tests share, in one place instead of a copy per test-support module:
//! - [`ports::free_port`]: a loopback port for a server a test starts later;
//! - [`wait::until`] / [`wait::until_async`]: poll a condition until a deadline (no
//!   sleep-and-hope: a test waits for what it needs, and fails with what it waited for);
//! - [`env`]: the test venv's Python and the fixtures `scripts/setup.sh` installs, skipped
//!   with a message outside CI and failing under `CI`;
//! - [`binaries`]: the workspace's binaries for tests that run the real processes, built on
//!   demand when a crate's tests run alone;
//! - [`http::dechunk`]: a chunked body joined, for plain-socket HTTP clients;
//! - [`json_peer`]: an independent peer process (the Python peers) driven one JSON line a
//!   command;
//! - [`prometheus`]: a `/metrics` scrape and the sum of a metric's samples by label;
//! - [`process::ChildProcess`]: a child of a workspace binary, its stdout lines and announced
//!   addresses, killed on drop;
//! - [`serve::Serve`]: the one `kvindex serve` launcher (flags, environment, its announced
//!   addresses, an optional wait for `/readyz`, killed on drop);
//! - [`procfs`]: another process's peak memory, children and start time;
//! - [`run`]: a helper program run to the end, failing with what it printed;
//! - [`callgrind`]: valgrind's client requests, for benches that count instructions per stage.

pub mod binaries;
pub mod callgrind;
pub mod env;
pub mod http;
pub mod json_peer;
pub mod ports;
pub mod process;
pub mod procfs;
pub mod prometheus;
pub mod run;
pub mod serve;
pub mod wait;
