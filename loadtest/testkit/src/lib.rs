//! What every crate's tests share, in one place instead of a copy per test-support module:
//! - [`ports::free_port`]: a loopback port for a server a test starts later;
//! - [`wait::until`] / [`wait::until_async`]: poll a condition until a deadline (no
//!   sleep-and-hope: a test waits for what it needs, and fails with what it waited for);
//! - [`env`]: the test venv's Python and the fixtures `scripts/setup.sh` installs, skipped
//!   with a message outside CI and failing under `CI`;
//! - [`binaries`]: the workspace's binaries for tests that run the real processes, built on
//!   demand when a crate's tests run alone.

pub mod binaries;
pub mod env;
pub mod ports;
pub mod wait;
