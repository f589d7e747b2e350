//! The pods this router may pick and what it knows of them: the pod table with each pod's load
//! and requests in flight ([`fleet`]), where entries come from (the command line, a watched
//! [`file`], Kubernetes [`discovery`], registration on the admin door), and the scrapers that
//! keep each pod's load current ([`scrape`], reading vLLM's `/metrics` with [`vllm_metrics`]).

pub mod discovery;
pub mod file;
pub mod fleet;
pub mod scrape;
pub mod spec;
pub mod vllm_metrics;
