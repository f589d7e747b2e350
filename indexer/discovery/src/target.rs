//! A discovered engine pod and the names and endpoints derived from it. The pod id is
//! `<podIP>:<http_port>`, which is what vLLM's topic `kv@<podIP>:8000@<model>` carries, what
//! the router sends traffic to, and (rank r > 0 at `<podIP>:<http_port + r>`) how the indexer
//! names DP ranks (`port-offset`). IPv6 addresses are bracketed (`[fd00::7]:8000`).

use std::net::{IpAddr, SocketAddr};

use kvindex::wire::Engine;

/// One Running, Ready pod with an IP, as its consumers need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredPod {
    /// `<namespace>/<name>` of the Kubernetes pod (for logs).
    pub name: String,
    pub ip: IpAddr,
    /// The served model (annotation or configured); `None` when neither says.
    pub model: Option<String>,
    /// Data-parallel ranks behind the pod (1 = no DP).
    pub dp_size: u32,
    pub pub_port: u16,
    pub replay_port: Option<u16>,
    pub http_port: u16,
    /// The engine family: the pod's annotation, else what probing its engine found; `None`:
    /// the consumer's `default_engine`.
    pub engine: Option<Engine>,
    /// SGLang's page size (annotation, else probe); `None`: the engine's default.
    pub page_size: Option<u32>,
    /// The engine's release (annotation, else probe), e.g. `0.5.19`.
    pub engine_version: Option<String>,
    /// SGLang's `kv_events_config.format` (`default` or `dynamo`, 0.5.22+), from a probe.
    pub kv_events_format: Option<String>,
    /// What the operator's annotations declare of the engine's cache hits (EAGLE, context
    /// parallelism); the default when none.
    pub rules: kvindex::PodRules,
    /// What the pod's annotations fixed: a probe of the engine does not override these.
    pub annotated: Annotated,
}

/// Which of a pod's engine facts its annotations gave (the operator's word per pod, stronger
/// than what the engine's `/server_info` says, which is stronger than the flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Annotated {
    pub engine: bool,
    pub page_size: bool,
    pub engine_version: bool,
    pub dp_size: bool,
}

impl DiscoveredPod {
    fn addr(&self, port: u16, rank: u32) -> SocketAddr {
        SocketAddr::new(self.ip, (u32::from(port) + rank) as u16)
    }

    /// The pod id of rank 0: `<podIP>:<http_port>`.
    pub fn pod_id(&self) -> String {
        self.rank_pod_id(0)
    }

    /// The pod id of rank `rank`: `<podIP>:<http_port + rank>` (llm-d's port-offset naming).
    pub fn rank_pod_id(&self, rank: u32) -> String {
        self.addr(self.http_port, rank).to_string()
    }

    /// Rank `rank`'s HTTP base URL.
    pub fn http_url(&self, rank: u32) -> String {
        format!("http://{}", self.addr(self.http_port, rank))
    }

    /// Rank `rank`'s PUB endpoint (vLLM offsets the port by the rank).
    pub fn pub_endpoint(&self, rank: u32) -> String {
        format!("tcp://{}", self.addr(self.pub_port, rank))
    }

    /// Rank `rank`'s replay endpoint, when replay is configured.
    pub fn replay_endpoint(&self, rank: u32) -> Option<String> {
        self.replay_port.map(|port| format!("tcp://{}", self.addr(port, rank)))
    }

    /// Whether asking the engine (`/server_info`) can tell more than the annotations did: the
    /// engine is not annotated, or annotated SGLang (whose descriptor still gives the page size,
    /// release and endpoints the annotations left out). vLLM and TensorRT-LLM serve no such
    /// descriptor.
    pub fn wants_probe(&self) -> bool {
        !self.annotated.engine || self.engine == Some(Engine::Sglang)
    }
}

#[cfg(test)]
impl DiscoveredPod {
    /// A pod at `ip` with the default ports, one rank and nothing learnt of its engine: the
    /// unit tests' starting point.
    pub(crate) fn example(name: &str, ip: &str) -> DiscoveredPod {
        DiscoveredPod {
            name: name.into(),
            ip: ip.parse().unwrap(),
            model: Some("m".into()),
            dp_size: 1,
            pub_port: 5557,
            replay_port: Some(5558),
            http_port: 8000,
            engine: None,
            page_size: None,
            engine_version: None,
            kv_events_format: None,
            rules: kvindex::PodRules::default(),
            annotated: Annotated::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ip: &str) -> DiscoveredPod {
        DiscoveredPod { dp_size: 2, ..DiscoveredPod::example("ns/vllm-0", ip) }
    }

    #[test]
    fn names_and_endpoints_follow_the_port_offset_rule() {
        let p = pod("10.0.0.7");
        assert_eq!(p.pod_id(), "10.0.0.7:8000");
        assert_eq!(p.rank_pod_id(1), "10.0.0.7:8001");
        assert_eq!(p.rank_pod_id(1), kvindex_dp_pod_id("10.0.0.7:8000", 1));
        assert_eq!(p.http_url(1), "http://10.0.0.7:8001");
        assert_eq!(p.pub_endpoint(0), "tcp://10.0.0.7:5557");
        assert_eq!(p.pub_endpoint(1), "tcp://10.0.0.7:5558");
        assert_eq!(p.replay_endpoint(1).as_deref(), Some("tcp://10.0.0.7:5559"));
        assert_eq!(DiscoveredPod { replay_port: None, ..p }.replay_endpoint(0), None);
        let v6 = pod("fd00::7");
        assert_eq!(v6.pod_id(), "[fd00::7]:8000");
        assert_eq!(v6.pub_endpoint(1), "tcp://[fd00::7]:5558");
    }

    /// The indexer's rule (`kvindex::wire::dp_pod_id`), restated: host, port + rank.
    fn kvindex_dp_pod_id(base: &str, rank: u32) -> String {
        let (host, port) = base.rsplit_once(':').unwrap();
        format!("{host}:{}", port.parse::<u32>().unwrap() + rank)
    }
}
