//! Topic and pod-id conventions shared with llm-d.
//!
//! vLLM imposes no topic; llm-d's convention is `kv@<pod-id>@<model>`, split on `@` into
//! exactly three parts, otherwise the whole topic is the pod id and the model is empty. A
//! data-parallel rank is its own pod: `<addr>:<port + rank>`, as llm-d names DP endpoints.

/// The parts of a `kv@<id>@<model>` topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic<'a> {
    pub id: &'a str,
    pub model: &'a str,
}

/// Parses a topic the way llm-d does. The `kv` prefix is not checked here: the subscription
/// filter already selected the topic.
pub fn parse_topic(topic: &str) -> Topic<'_> {
    let mut parts = topic.split('@');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(id), Some(model), None) => Topic { id, model },
        _ => Topic { id: topic, model: "" },
    }
}

/// The pod id of data-parallel rank `rank` of the engine whose rank-0 pod id is `base`.
///
/// `host:port` becomes `host:(port + rank)`, matching vLLM's port offset for DP publishers and
/// llm-d's endpoint naming. An id without a numeric port gets a `#dp<rank>` suffix instead,
/// so ranks never collapse onto one pod. Rank 0 (or no rank) is the id itself.
pub fn dp_pod_id(base: &str, rank: Option<i64>) -> String {
    let rank = match rank {
        Some(r) if r > 0 => r,
        _ => return base.to_string(),
    };
    if let Some((host, port)) = base.rsplit_once(':') {
        if let Ok(port) = port.parse::<u32>() {
            if let Some(shifted) = port.checked_add(rank as u32).filter(|p| *p <= 65535 && rank <= 65535) {
                return format!("{host}:{shifted}");
            }
        }
    }
    format!("{base}#dp{rank}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_d_topics() {
        assert_eq!(
            parse_topic("kv@10.0.0.7:8000@Qwen/Qwen3-0.6B"),
            Topic { id: "10.0.0.7:8000", model: "Qwen/Qwen3-0.6B" }
        );
        assert_eq!(parse_topic("kv@10.0.0.7@m"), Topic { id: "10.0.0.7", model: "m" });
        assert_eq!(parse_topic("kv@a@b@c"), Topic { id: "kv@a@b@c", model: "" });
        assert_eq!(parse_topic(""), Topic { id: "", model: "" });
    }

    #[test]
    fn dp_ranks_offset_the_port() {
        assert_eq!(dp_pod_id("10.0.0.7:8000", Some(1)), "10.0.0.7:8001");
        assert_eq!(dp_pod_id("10.0.0.7:8000", Some(0)), "10.0.0.7:8000");
        assert_eq!(dp_pod_id("10.0.0.7:8000", None), "10.0.0.7:8000");
        assert_eq!(dp_pod_id("[::1]:8000", Some(2)), "[::1]:8002");
        assert_eq!(dp_pod_id("pod-a", Some(3)), "pod-a#dp3");
        assert_eq!(dp_pod_id("h:65535", Some(1)), "h:65535#dp1");
    }
}
