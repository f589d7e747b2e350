//! kvindex-router: a stateless router that places each LLM request on the pod that already
//! holds the longest exact prefix of its prompt, unless load says otherwise.
//!
//! The per-request work is a pipeline independent of HTTP, so every front door (the
//! OpenAI-compatible proxy in [`http`], and the Gateway API endpoint picker over Envoy's
//! ext_proc in [`extproc`]) makes the same decision:
//!
//! ```text
//! request body ─▶ request (parse) ─▶ tokenize ─▶ indexer (ScoreTokens, deadline, failover)
//!      ─▶ fleet (scraped load + own in-flight) ─▶ cost (rank, rendezvous ties) ─▶ Decision
//! ```
//!
//! [`pipeline::Router`] runs it; [`upstream`] forwards to the chosen pod. Replicas share no
//! state but the indexer, and break ties by rendezvous hashing, so they agree without talking.

pub mod config;
pub mod cost;
pub mod decision;
pub mod discovery;
pub mod extproc;
pub mod fleet;
pub mod http;
pub mod indexer;
pub mod metrics;
pub mod pd;
pub mod pipeline;
pub mod pods_file;
pub mod rendezvous;
pub mod request;
pub mod scrape;
pub mod serve;
pub mod tokenize;
pub mod upstream;
pub mod usage;
pub mod vllm_metrics;

pub use config::Config;
pub use decision::Decision;
pub use pipeline::{RouteError, Router};
pub use request::{Endpoint, Prompt, RouteRequest};
