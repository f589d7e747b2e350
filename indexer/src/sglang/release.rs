//! What each SGLang release publishes, as rules over its version (checked against each
//! release's own `kv_events.py`, `mem_cache/events.py`/`utils.py` and hash code):
//!
//! | from   | rule |
//! |--------|------|
//! | 0.5.6  | page ids are the SHA-256 page chain (before: Python's `hash()`, not reproducible, and a node's first page has no parent, so those stores never credit: [`super::builtin_ids`]; cross-check off) |
//! | 0.5.15 | the C++ hash binding, pages batched into one event; `medium` published |
//! | 0.5.19 | a cache salt seeds the event chain; salted stores carry a `metadata` map; the OpenAI routes take the data-parallel rank to serve on (`X-Data-Parallel-Rank`) |
//! | 0.5.20 | map-form (tagged) events with `cache_salt` and `session_id`; the storage chain is seeded by (extra_key, cache_salt) |
//! | 0.5.22 | `lora_name`; `format = "dynamo"` namespaces every published id by (extra_key, cache_salt); replay replies carry the topic frame |
//! | 0.5.23 | ids past u32 hash as wide pages; the default format namespaces ids of named adapters |

use std::fmt;
use std::str::FromStr;

/// An SGLang release, `major.minor.patch` (suffixes such as `.post1` or `rc0` are ignored:
/// they never changed the event format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SglangRelease {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// The event format option `kv_events_config.format` (0.5.22+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventFormat {
    #[default]
    Default,
    Dynamo,
}

impl EventFormat {
    /// The name SGLang's `kv_events_config.format` takes (what `from_str` reads).
    pub fn as_str(self) -> &'static str {
        match self {
            EventFormat::Default => "default",
            EventFormat::Dynamo => "dynamo",
        }
    }
}

impl FromStr for EventFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(EventFormat::Default),
            "dynamo" => Ok(EventFormat::Dynamo),
            other => Err(format!("unknown SGLang kv_events format {other:?} (expected default or dynamo)")),
        }
    }
}

/// How a release hashes pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageHashImpl {
    /// Python's `hash()` of the page (before 0.5.6): not position-aware (and deterministic for a
    /// tuple of ints: hash randomisation covers only str and bytes).
    PythonBuiltin,
    /// SHA-256 page chain in Python (0.5.6 up to 0.5.15).
    Sha256Python,
    /// SHA-256 page chain in the C++ binding (0.5.15+).
    Sha256Native,
}

impl SglangRelease {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        SglangRelease { major, minor, patch }
    }

    fn at_least(self, major: u32, minor: u32, patch: u32) -> bool {
        self >= SglangRelease::new(major, minor, patch)
    }

    pub fn page_hash(self) -> PageHashImpl {
        if !self.at_least(0, 5, 6) {
            PageHashImpl::PythonBuiltin
        } else if !self.at_least(0, 5, 15) {
            PageHashImpl::Sha256Python
        } else {
            PageHashImpl::Sha256Native
        }
    }

    /// Whether kvindex can recompute this release's page ids (the sampled cross-check).
    pub fn hash_reproducible(self) -> bool {
        self.page_hash() != PageHashImpl::PythonBuiltin
    }

    /// Ids past u32 hash as wide pages (earlier releases raise, publishing nothing).
    pub fn wide_pages(self) -> bool {
        self.at_least(0, 5, 23)
    }

    /// What the release's hash raises for an id past u32 when it has no wide pages.
    pub fn wide_token_error(self) -> &'static str {
        match self.page_hash() {
            PageHashImpl::Sha256Native => "IndexError: token id does not fit in uint32",
            _ => "OverflowError: int too big to convert",
        }
    }

    /// What the release raises for an id past int64 (its token buffer is `array("q")`).
    pub fn past_int64_error(self) -> &'static str {
        match self.page_hash() {
            PageHashImpl::Sha256Native => "OverflowError: signed integer is greater than maximum",
            _ => "OverflowError: int too big to convert",
        }
    }

    /// A cache salt seeds the event chain.
    pub fn salted_event_chain(self) -> bool {
        self.at_least(0, 5, 19)
    }

    /// The OpenAI routes take the data-parallel rank a request is to be served on
    /// (`X-Data-Parallel-Rank`, over the body's `routed_dp_rank`), and the DP controller obeys it
    /// before any load-balance method. Read in 0.5.19, 0.5.20 and 0.5.23; 0.5.6 and earlier
    /// take a rank on `/generate` only (`data_parallel_rank`), not on the OpenAI routes.
    pub fn routes_named_dp_rank(self) -> bool {
        self.at_least(0, 5, 19)
    }

    /// The storage chain is seeded by (extra_key, cache_salt); before, it is the plain chain.
    pub fn namespaced_storage_chain(self) -> bool {
        self.at_least(0, 5, 20)
    }

    /// Events are tagged maps (array_like positional lists before).
    pub fn map_events(self) -> bool {
        self.at_least(0, 5, 20)
    }

    /// `BlockStored`/`BlockRemoved` carry `medium`.
    pub fn publishes_medium(self) -> bool {
        self.at_least(0, 5, 15)
    }

    /// Replay replies carry the topic frame (`[empty, topic, seq, payload]`).
    pub fn replay_topic_frame(self) -> bool {
        self.at_least(0, 5, 22)
    }

    /// Whether published ids are re-hashed into a namespace, and by which parts: `Some((uses
    /// extra_key, uses cache_salt))`. `adapter_named`: the request's adapter has a public name.
    pub fn id_namespace(self, format: EventFormat, adapter_named: bool) -> Option<(bool, bool)> {
        match format {
            EventFormat::Dynamo if self.at_least(0, 5, 22) => Some((true, true)),
            EventFormat::Default if self.at_least(0, 5, 23) && adapter_named => Some((true, false)),
            _ => None,
        }
    }

    /// Whether `BlockStored` names the adapter (`lora_name`).
    pub fn publishes_lora_name(self, format: EventFormat) -> bool {
        match format {
            EventFormat::Dynamo => self.at_least(0, 5, 22),
            EventFormat::Default => self.at_least(0, 5, 23),
        }
    }
}

impl fmt::Display for SglangRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A version string that is not `major.minor[.patch][suffix]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an SGLang version: {0:?}")]
pub struct BadRelease(pub String);

impl FromStr for SglangRelease {
    type Err = BadRelease;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadRelease(s.to_string());
        let core = s.trim().trim_start_matches('v');
        let mut parts = core.split('.');
        let mut number = |required: bool| -> Result<u32, BadRelease> {
            match parts.next() {
                None if !required => Ok(0),
                None => Err(bad()),
                Some(p) => {
                    let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
                    if digits.is_empty() {
                        return if required { Err(bad()) } else { Ok(0) };
                    }
                    digits.parse().map_err(|_| bad())
                }
            }
        };
        let release = SglangRelease { major: number(true)?, minor: number(true)?, patch: number(false)? };
        Ok(release)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_suffixes() {
        assert_eq!("0.5.23".parse(), Ok(SglangRelease::new(0, 5, 23)));
        assert_eq!("0.5.6.post2".parse(), Ok(SglangRelease::new(0, 5, 6)));
        assert_eq!("0.5.20rc1".parse(), Ok(SglangRelease::new(0, 5, 20)));
        assert_eq!("0.6".parse(), Ok(SglangRelease::new(0, 6, 0)));
        assert!("sglang".parse::<SglangRelease>().is_err());
    }

    #[test]
    fn rules_follow_the_releases() {
        let r = |s: &str| s.parse::<SglangRelease>().unwrap();
        assert!(!r("0.5.5").hash_reproducible());
        assert!(r("0.5.6").hash_reproducible());
        assert!(!r("0.5.19").map_events() && r("0.5.20").map_events());
        assert!(!r("0.5.21").replay_topic_frame() && r("0.5.22").replay_topic_frame());
        assert_eq!(r("0.5.22").id_namespace(EventFormat::Default, true), None);
        assert_eq!(r("0.5.23").id_namespace(EventFormat::Default, true), Some((true, false)));
        assert_eq!(r("0.5.22").id_namespace(EventFormat::Dynamo, false), Some((true, true)));
        assert!(!r("0.5.22").wide_pages() && r("0.5.23").wide_pages());
        assert!(!r("0.5.6").routes_named_dp_rank() && r("0.5.19").routes_named_dp_rank());
    }
}
