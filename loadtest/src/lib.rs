//! kvindex-loadtest: a simulated vLLM fleet for testing and benchmarking kvindex.
//!
//! [`engine`] is the pure pod model (prefix cache, scheduler, timing, events); [`wire`] turns
//! its events into vLLM's exact ZeroMQ messages and serves replay; [`http`] is the
//! OpenAI-compatible API of one pod; [`pod`] runs a pod's engines (one per data-parallel rank)
//! on the wall clock; [`fleet`] starts
//! N pods; [`cli`] is the `kvindex-sim` command line. [`workload`], [`policy`] and [`driver`]
//! compare routing policies on the same seeded request sequence, in process;
//! [`kvindex_service`] runs a real `kvindex serve` for the policy that routes through it;
//! [`process`] starts the workspace's binaries (simulator fleets, router replicas) for tests;
//! [`plot`] draws the comparison as a PNG.

pub mod cli;
pub mod driver;
pub mod engine;
pub mod fleet;
pub mod http;
pub mod kvindex_service;
pub mod plot;
pub mod pod;
pub mod policy;
pub mod process;
pub mod wire;
pub mod workload;
