//! The pods this router may pick and what it knows of them: the pod table with each pod's load
//! and requests in flight ([`fleet`], each holding its
//! [`reservation`] on the indexers), where entries come from (the command line, a watched
//! [`file`], Kubernetes [`discovery`], registration on the admin door), and the scrapers that
//! keep each pod's load current ([`scrape`], reading each engine's `/metrics` with
//! [`engine_metrics`]: [`vllm_metrics`] or [`sglang_metrics`] over [`prom_text`], into an
//! [`engine_load::EngineLoad`]).

pub mod discovery;
pub mod engine_load;
pub mod engine_metrics;
pub mod file;
pub mod fleet;
pub mod prom_text;
pub mod reservation;
pub mod scrape;
pub mod sglang_metrics;
pub mod spec;
pub mod vllm_metrics;
