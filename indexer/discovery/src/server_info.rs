//! SGLang's description of itself, `GET /server_info` (older, and deprecated since:
//! `/get_server_info`), read by discovery to learn what a pod is without an annotation: the
//! engine family, the page size its events are published at, its publisher ranks, its release
//! and where its KV-event publisher listens. Pure: a body in, an [`EngineDescriptor`] out, and
//! [`EngineDescriptor::apply_to`] merging it into a discovered pod; the HTTP call is
//! `engine_probe.rs`'s.
//!
//! The shapes, from each release's own `srt/entrypoints/http_server.py` (the test shapes in
//! `testdata/sglang-server-info/` are written by its `make_shapes.py`, which runs each release's
//! own `describe_kv_events_publisher` and `KVEventsConfig` from the PyPI wheel):
//! - every release: the server arguments at the top level (`dataclasses.asdict(server_args)`,
//!   from 0.5.19 `server_args.resolved_dict()`): `page_size`, `dp_size`, `enable_dp_attention`
//!   (0.5.23 also `attn_dp_size`, `dcp_size`), `kv_events_config` (the `--kv-events-config`
//!   JSON string: `publisher`, `endpoint`, `replay_endpoint`, `topic`, `format`, with
//!   `KVEventsConfig`'s defaults `"null"` and `tcp://*:5557`), and `version`;
//! - from 0.5.15 also `kv_events`, the publisher's descriptor (`describe_kv_events_publisher`:
//!   `publisher`, `endpoint_host`, `endpoint_port_base`, `topic`, `block_size`, `dp_size`; 0.5.23
//!   adds `replay_endpoint_port_base`), or `null` when publishing is off or misconfigured.
//!
//! Where both say, the descriptor wins: it is what the scheduler bound (`block_size` is the page
//! size times the decode-context-parallel width, `dp_size` counts every publisher rank). The
//! endpoint's host is never used: SGLang's contract is to dial the pod's own address (the host
//! is often a wildcard), rank r at port base + r (`kvindex::sglang::ports`).

use kvindex::wire::Engine;
use serde::{Deserialize, Deserializer};

use crate::settings::{check_version, MAX_DP_SIZE, MAX_PAGE_SIZE};
use crate::target::DiscoveredPod;

/// What an SGLang pod's `/server_info` says, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineDescriptor {
    /// The release (`0.5.19`).
    pub version: Option<String>,
    /// Tokens per published page: `kv_events.block_size`, else `page_size`.
    pub page_size: Option<u32>,
    /// Publisher ranks: `kv_events.dp_size`, else `dp_size` × `attn_dp_size`.
    pub dp_size: Option<u32>,
    /// The KV-event publisher; `None`: publishing is off (or not on a TCP port).
    pub publisher: Option<Publisher>,
}

/// Where an SGLang pod publishes its KV events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publisher {
    /// Rank r's PUB socket is on `pub_port + r`.
    pub pub_port: u16,
    /// Rank r's replay ROUTER is on `replay_port + r`; `None`: no (TCP) replay endpoint.
    pub replay_port: Option<u16>,
    /// The topic it publishes under (`""`: none).
    pub topic: String,
    /// `kv_events_config.format` (`default`, `dynamo`; 0.5.22+), when given.
    pub format: Option<String>,
}

/// Why a body is not an SGLang server description we can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not SGLang's server info: {0}")]
pub struct NotServerInfo(pub String);

/// The top-level fields read; every other server argument is skipped unread.
#[derive(Deserialize)]
struct Raw {
    version: Option<String>,
    #[serde(default, deserialize_with = "present")]
    page_size: Option<Option<i64>>,
    dp_size: Option<i64>,
    attn_dp_size: Option<i64>,
    /// A JSON string, or (some builds) the object already parsed.
    kv_events_config: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    kv_events: Option<Option<RawDescriptor>>,
}

#[derive(Deserialize)]
struct RawDescriptor {
    publisher: Option<String>,
    endpoint_port_base: Option<i64>,
    replay_endpoint_port_base: Option<i64>,
    topic: Option<String>,
    block_size: Option<i64>,
    dp_size: Option<i64>,
}

/// `--kv-events-config`, with SGLang's `KVEventsConfig` defaults for what it leaves out.
#[derive(Deserialize, Default)]
struct RawConfig {
    publisher: Option<String>,
    endpoint: Option<String>,
    replay_endpoint: Option<String>,
    topic: Option<String>,
    format: Option<String>,
}

/// A field that is there (possibly `null`), told apart from one that is not.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

fn ranged(what: &str, v: i64, max: u32) -> Result<u32, NotServerInfo> {
    u32::try_from(v)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| NotServerInfo(format!("{what} {v} is not from 1 to {max}")))
}

fn port(what: &str, v: i64) -> Result<u16, NotServerInfo> {
    Ok(ranged(what, v, 65535)? as u16)
}

/// The port of a `tcp://host:port` endpoint, split as SGLang splits it (last colon); `None` for
/// any other transport or no port.
fn tcp_port(endpoint: &str) -> Option<u16> {
    let (_, port) = endpoint.strip_prefix("tcp://")?.rsplit_once(':')?;
    port.parse::<u16>().ok().filter(|&p| p != 0)
}

fn parse_config(raw: Option<serde_json::Value>) -> Result<Option<RawConfig>, NotServerInfo> {
    let bad = |e: serde_json::Error| NotServerInfo(format!("kv_events_config: {e}"));
    match raw {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => serde_json::from_str(&s).map(Some).map_err(bad),
        Some(v @ serde_json::Value::Object(_)) => serde_json::from_value(v).map(Some).map_err(bad),
        Some(_) => Err(NotServerInfo("kv_events_config is neither a JSON string nor an object".into())),
    }
}

impl EngineDescriptor {
    /// Reads a `/server_info` body. Anything but a JSON object with a string `version` and a
    /// `page_size` field (every SGLang release has both) is [`NotServerInfo`], as is any value
    /// out of range (a port, a page size, a rank count): a pod cannot make discovery use it.
    pub fn parse(body: &[u8]) -> Result<EngineDescriptor, NotServerInfo> {
        let raw: Raw = serde_json::from_slice(body).map_err(|e| NotServerInfo(e.to_string()))?;
        let version = raw.version.ok_or_else(|| NotServerInfo("no \"version\"".into()))?;
        check_version(&version).map_err(|e| NotServerInfo(format!("version {e}")))?;
        let Some(page_size) = raw.page_size else { return Err(NotServerInfo("no \"page_size\"".into())) };
        let mut page_size = page_size.map(|p| ranged("page_size", p, MAX_PAGE_SIZE)).transpose()?;
        let mut dp_size = match raw.dp_size {
            Some(dp) => {
                let attn = raw.attn_dp_size.unwrap_or(1).max(1);
                Some(ranged("dp_size", dp.saturating_mul(attn), MAX_DP_SIZE)?)
            }
            None => None,
        };
        let config = parse_config(raw.kv_events_config)?;
        let config_ref = config.as_ref();
        let format = config_ref.and_then(|c| c.format.clone());
        if let Some(f) = &format {
            check_version(f).map_err(|e| NotServerInfo(format!("kv_events_config.format {e}")))?;
        }
        let replay_of_config = config_ref.and_then(|c| c.replay_endpoint.as_deref()).and_then(tcp_port);
        let publisher = match raw.kv_events {
            // 0.5.15+: the descriptor (`null`: no publisher).
            Some(None) => None,
            Some(Some(d)) => {
                if let Some(b) = d.block_size {
                    page_size = Some(ranged("kv_events.block_size", b, MAX_PAGE_SIZE)?);
                }
                if let Some(dp) = d.dp_size {
                    dp_size = Some(ranged("kv_events.dp_size", dp, MAX_DP_SIZE)?);
                }
                match (d.publisher.as_deref(), d.endpoint_port_base) {
                    (Some("null"), _) | (_, None) => None,
                    (_, Some(base)) => Some(Publisher {
                        pub_port: port("kv_events.endpoint_port_base", base)?,
                        replay_port: match d.replay_endpoint_port_base {
                            Some(p) => Some(port("kv_events.replay_endpoint_port_base", p)?),
                            None => replay_of_config,
                        },
                        topic: d.topic.unwrap_or_default(),
                        format,
                    }),
                }
            }
            // Before 0.5.15: only the configuration, read with SGLang's defaults.
            None => config.and_then(|c| {
                if c.publisher.as_deref().unwrap_or("null") == "null" {
                    return None;
                }
                let pub_port = tcp_port(c.endpoint.as_deref().unwrap_or("tcp://*:5557"))?;
                Some(Publisher { pub_port, replay_port: replay_of_config, topic: c.topic.unwrap_or_default(), format })
            }),
        };
        if let Some(p) = &publisher {
            if p.topic.len() > crate::settings::MAX_NAME_LEN || p.topic.chars().any(char::is_control) {
                return Err(NotServerInfo("kv_events topic is too long or has control characters".into()));
            }
        }
        Ok(EngineDescriptor { version: Some(version), page_size, dp_size, publisher })
    }

    /// The pod as this descriptor describes it: SGLang, its page size, release, ranks and
    /// publisher ports, except what the pod's annotations fixed (the operator's word per pod).
    /// Ports that would not fit every rank are not taken (the configured ones stay).
    pub fn apply_to(&self, pod: &DiscoveredPod) -> DiscoveredPod {
        let mut out = pod.clone();
        if !pod.annotated.engine {
            out.engine = Some(Engine::Sglang);
        }
        if !pod.annotated.page_size && self.page_size.is_some() {
            out.page_size = self.page_size;
        }
        if !pod.annotated.engine_version && self.version.is_some() {
            out.engine_version = self.version.clone();
        }
        if !pod.annotated.dp_size {
            if let Some(dp) = self.dp_size {
                out.dp_size = dp;
            }
        }
        if let Some(p) = &self.publisher {
            let fits = |port: u16| u32::from(port) + out.dp_size - 1 <= 65535;
            if fits(p.pub_port) && p.replay_port.is_none_or(fits) {
                out.pub_port = p.pub_port;
                out.replay_port = p.replay_port;
            }
            out.kv_events_format = p.format.clone();
        }
        if !fits_http(&out) {
            out.dp_size = pod.dp_size;
        }
        out
    }
}

/// Every rank's HTTP port (its pod id) exists.
fn fits_http(pod: &DiscoveredPod) -> bool {
    u32::from(pod.http_port) + pod.dp_size - 1 <= 65535
        && [Some(pod.pub_port), pod.replay_port].into_iter().flatten().all(|p| u32::from(p) + pod.dp_size - 1 <= 65535)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Annotated;

    fn shape(name: &str) -> Vec<u8> {
        let path = format!("{}/../../testdata/sglang-server-info/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn pod() -> DiscoveredPod {
        DiscoveredPod::example("llm/sglang-0", "10.0.0.7")
    }

    #[test]
    fn every_release_shape_gives_page_size_ranks_release_and_ports() {
        // 0.5.10: server args only; the publisher from kv_events_config (replay on 6001).
        let d = EngineDescriptor::parse(&shape("0.5.10.json")).unwrap();
        assert_eq!((d.version.as_deref(), d.page_size, d.dp_size), (Some("0.5.10"), Some(16), Some(2)));
        let p = d.publisher.unwrap();
        assert_eq!((p.pub_port, p.replay_port, p.topic.as_str(), p.format), (6000, Some(6001), "kv", None));
        // 0.5.15: the descriptor, without a replay port: the config's.
        let d = EngineDescriptor::parse(&shape("0.5.15.json")).unwrap();
        assert_eq!((d.version.as_deref(), d.page_size, d.dp_size), (Some("0.5.15"), Some(32), Some(1)));
        let p = d.publisher.unwrap();
        assert_eq!((p.pub_port, p.replay_port), (7000, Some(7001)));
        // 0.5.19: resolved_dict(); the descriptor's dp_size, no replay port: the config's.
        let d = EngineDescriptor::parse(&shape("0.5.19.json")).unwrap();
        assert_eq!((d.version.as_deref(), d.page_size, d.dp_size), (Some("0.5.19"), Some(8), Some(2)));
        let p = d.publisher.unwrap();
        assert_eq!((p.pub_port, p.replay_port, p.topic.as_str()), (5557, Some(5570), "kv"));
        // 0.5.19, publishing off (`kv_events: null`).
        let d = EngineDescriptor::parse(&shape("0.5.19-no-publisher.json")).unwrap();
        assert_eq!(
            (d.version.as_deref(), d.page_size, d.dp_size, d.publisher),
            (Some("0.5.19"), Some(1), Some(1), None)
        );
        // 0.5.23: block_size = page_size × dcp_size, dp_size = every rank, the replay port base,
        // the format.
        let d = EngineDescriptor::parse(&shape("0.5.23-dp-attention.json")).unwrap();
        assert_eq!((d.version.as_deref(), d.page_size, d.dp_size), (Some("0.5.23"), Some(64), Some(4)));
        let p = d.publisher.unwrap();
        assert_eq!((p.pub_port, p.replay_port, p.format.as_deref()), (5557, Some(5600), Some("dynamo")));
    }

    #[test]
    fn the_descriptor_sets_the_pod_except_what_its_annotations_fixed() {
        let d = EngineDescriptor::parse(&shape("0.5.23-dp-attention.json")).unwrap();
        let p = d.apply_to(&pod());
        assert_eq!(
            (p.engine, p.page_size, p.engine_version.as_deref()),
            (Some(Engine::Sglang), Some(64), Some("0.5.23"))
        );
        assert_eq!(
            (p.dp_size, p.pub_port, p.replay_port, p.kv_events_format.as_deref()),
            (4, 5557, Some(5600), Some("dynamo"))
        );
        // SGLang's DP rule: rank r on base + r, both sockets, at the pod's own address.
        assert_eq!(p.pub_endpoint(3), "tcp://10.0.0.7:5560");
        assert_eq!(p.replay_endpoint(1).as_deref(), Some("tcp://10.0.0.7:5601"));
        assert_eq!(kvindex::sglang::ports::rank_endpoint("tcp://10.0.0.7:5557", 3).unwrap(), p.pub_endpoint(3));

        let annotated = DiscoveredPod {
            page_size: Some(8),
            engine_version: Some("0.5.22".into()),
            dp_size: 2,
            annotated: Annotated { engine: false, page_size: true, engine_version: true, dp_size: true },
            ..pod()
        };
        let p = d.apply_to(&annotated);
        assert_eq!((p.page_size, p.engine_version.as_deref(), p.dp_size), (Some(8), Some("0.5.22"), 2));
        assert_eq!(p.engine, Some(Engine::Sglang));

        // No publisher: SGLang, but the configured ports stay.
        let off = EngineDescriptor::parse(&shape("0.5.19-no-publisher.json")).unwrap().apply_to(&pod());
        assert_eq!((off.engine, off.pub_port, off.replay_port), (Some(Engine::Sglang), 5557, Some(5558)));
        // Ports that do not fit every rank are not taken.
        let high = EngineDescriptor {
            dp_size: Some(4),
            publisher: Some(Publisher { pub_port: 65534, ..Publisher::default() }),
            ..EngineDescriptor::default()
        };
        let p = high.apply_to(&pod());
        assert_eq!((p.dp_size, p.pub_port), (4, 5557));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let refused = |body: &str| EngineDescriptor::parse(body.as_bytes()).unwrap_err().0;
        assert!(refused("<html>404</html>").contains("expected value"));
        assert!(refused("[]").contains("expected struct"));
        assert!(refused(r#"{"detail":"Not Found"}"#).contains("version"));
        assert!(refused(r#"{"version":"0.5.1"}"#).contains("page_size"));
        assert!(refused(r#"{"version":"0.5.1\n","page_size":1}"#).contains("version"));
        for bad in [
            r#"{"version":"0.5.1","page_size":0}"#,
            r#"{"version":"0.5.1","page_size":70000}"#,
            r#"{"version":"0.5.1","page_size":1,"dp_size":129}"#,
            r#"{"version":"0.5.1","page_size":1,"dp_size":64,"attn_dp_size":4}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events":{"endpoint_port_base":70000}}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events":{"endpoint_port_base":5557,"block_size":-1}}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events_config":"{not json"}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events_config":7}"#,
            r#"{"version":"0.5.1","page_size":"16"}"#,
        ] {
            assert!(EngineDescriptor::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        // What SGLang itself would not publish on: no publisher.
        for off in [
            r#"{"version":"0.5.1","page_size":null,"kv_events_config":null}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events_config":"{\"publisher\":\"null\"}"}"#,
            r#"{"version":"0.5.1","page_size":1,"kv_events_config":"{\"publisher\":\"zmq\",\"endpoint\":\"ipc:///x\"}"}"#,
        ] {
            assert_eq!(EngineDescriptor::parse(off.as_bytes()).unwrap().publisher, None, "{off}");
        }
        // KVEventsConfig's default endpoint.
        let default = r#"{"version":"0.5.1","page_size":1,"kv_events_config":"{\"publisher\":\"zmq\"}"}"#;
        let p = EngineDescriptor::parse(default.as_bytes()).unwrap().publisher.unwrap();
        assert_eq!((p.pub_port, p.replay_port), (5557, None));
    }
}
