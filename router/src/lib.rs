//! kvindex-router: a stateless router that places each LLM request on the pod that already
//! holds the longest exact prefix of its prompt, unless load says otherwise.
//!
//! Five rooms, each reading only the ones before it:
//!
//! - [`config`]: the command line, validated into a [`Config`] (a leaf the others read);
//! - [`pods`]: the pod table, where its entries come from, and each pod's load;
//! - [`place`]: the per-request pipeline, independent of any protocol, so every front door
//!   makes the same decision, and commits it:
//!
//! ```text
//! request body ─▶ request (parse) ─▶ tokenize ─▶ indexer (ScoreTokens, deadline, failover)
//!      ─▶ candidates (scraped load + own in-flight) ─▶ cost (rank, rendezvous ties) ─▶ Decision
//! ```
//!
//! - [`upstream`]: HTTP to a pod, knowing nothing of the router;
//! - [`doors`]: the OpenAI-compatible proxy and the Gateway API endpoint picker (Envoy
//!   ext_proc), both placing through [`place::Router`], their errors typed in [`error`].
//!
//! [`serve`] assembles them. Replicas share no state but the indexer, and break ties by
//! rendezvous hashing, so they agree without talking.

pub mod config;
pub mod doors;
pub mod error;
pub mod metrics;
pub mod place;
pub mod pods;
pub mod serve;
pub mod upstream;

pub use config::Config;
pub use error::RouteError;
pub use place::decision::Decision;
pub use place::request::{Endpoint, Prompt, RouteRequest};
pub use place::Router;
