//! SGLang as a source: the rules of its releases ([`release`]), its page hash
//! ([`page_hash`]) and namespaces ([`namespace`]), the ids a radix path publishes
//! ([`path_ids`]), the sampled cross-check of a source's ids ([`cross_check`]), its DP endpoint rule ([`ports`]), and how its events are keyed without crediting what it would not serve
//! ([`pages`], and [`small_pages`] for pages smaller than a canonical block; [`builtin_ids`]:
//! the stores of releases before 0.5.6, which cannot be placed). Its events decode with the shared decoder ([`crate::wire::decode_batch_as`]
//! with [`crate::wire::Engine::Sglang`]). Pure: no I/O.
//!
//! Conventions (documented in docs/CONFIG.md): the topic is whatever `kv_events_config.topic`
//! says (llm-d's `kv@<pod>@<model>` when set so); the PUB and the replay ports are both offset
//! by the DP rank (`offset_endpoint_port`), so with the usual `replay = pub + 1`, rank 1's PUB
//! port is rank 0's replay port: configure each rank's pair explicitly, never by "pub + 1".

pub mod builtin_ids;
pub mod cross_check;
pub mod namespace;
pub mod page_hash;
pub mod pages;
pub mod path_ids;
pub mod ports;
pub mod release;
pub mod small_pages;

pub use cross_check::PageChainCheck;
pub use page_hash::{event_id, page_digests, ChainTokens, PageDigest, PageHashError};
pub use pages::{PageRules, PageVerdict};
pub use path_ids::{path_ids, PathError, PathIds, RadixPath};
pub use release::{EventFormat, PageHashImpl, SglangRelease};
pub use small_pages::{SmallPages, SmallPagesReport};
