//! A pod as the sources name it (the command line, the pods file, discovery, registration):
//! its id, where to send its requests, and what it does in a prefill/decode fleet. A leaf: the
//! configuration and the pod table both read it.

use serde::{Deserialize, Serialize};

/// What a pod does in a prefill/decode (P/D) disaggregated fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode (an ordinary vLLM).
    #[default]
    Both,
    Prefill,
    Decode,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// A pod as configured: the indexer's id for it, where to send requests, what it does.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct PodSpec {
    pub id: String,
    pub url: String,
    #[serde(default)]
    pub role: Role,
}
