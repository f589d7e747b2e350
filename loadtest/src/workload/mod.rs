//! Seeded, reproducible workloads for the simulated fleet: the reference multi-turn scenario
//! ([`multi_turn`]) and many tenants with long shared system prompts ([`tenants`]). A workload is data (prompts'
//! token ids, output lengths, think times); the driver ([`crate::driver`]) plays it against
//! pods and feeds generated outputs back into multi-turn conversations.

pub mod multi_turn;
pub mod rng;
pub mod tenants;

pub use multi_turn::{Conversation, MultiTurnConfig};
pub use rng::Rng;
pub use tenants::TenantsConfig;
