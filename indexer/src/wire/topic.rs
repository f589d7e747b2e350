//! Topic and pod-id conventions shared with llm-d.
//!
//! vLLM imposes no topic; llm-d's convention is `kv@<pod-id>@<model>`, split on `@` into
//! exactly three parts, otherwise the whole topic is the pod id and the model is empty. A
//! data-parallel rank is its own pod: `<addr>:<port + rank>`, as llm-d names DP endpoints.
//!
//! Every pod id must name one pod only: a port is read in its canonical form alone (`8000`,
//! never `08000` or `+8000`, which would otherwise name the same DP pod as `8000` from another
//! base), and a topic id may not spell a DP suffix (`#dp`) itself ([`topic_id_refusal`]).

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

/// The DP suffix of a pod id without a port: `<id>#dp<rank>`.
const DP_SUFFIX: &str = "#dp";

/// `text` as a port in its one canonical spelling: ASCII digits, no sign, no leading zero,
/// at most 65535. `None` for anything else (`08000`, `+8000`, `8000 `, `70000`).
pub fn canonical_port(text: &str) -> Option<u16> {
    let canonical = !text.is_empty()
        && text.len() <= 5
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// Why a topic's pod id may not name a stream, if it may not: a port that is not in its
/// canonical form (two spellings of one port would name one DP pod from two bases), or a DP
/// suffix spelled out (`pod#dp1` is rank 1 of `pod`'s name, not a pod of its own).
pub fn topic_id_refusal(id: &str) -> Option<&'static str> {
    if id.contains(DP_SUFFIX) {
        return Some("topic id contains \"#dp\", the suffix of a data-parallel rank's pod id");
    }
    let (_, port) = id.rsplit_once(':')?;
    let looks_numeric = port.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-');
    (looks_numeric && canonical_port(port).is_none())
        .then_some("topic id's port is not canonical (digits only, no sign, no leading zero, at most 65535)")
}

/// The pod id of data-parallel rank `rank` of the engine whose rank-0 pod id is `base`.
///
/// `host:port` becomes `host:(port + rank)`, matching vLLM's port offset for DP publishers and
/// llm-d's endpoint naming. An id without a canonical port ([`canonical_port`]), or whose
/// port + rank passes 65535, gets a `#dp<rank>` suffix instead, so ranks never collapse onto
/// one pod. Rank 0 (or no rank) is the id itself.
pub fn dp_pod_id(base: &str, rank: Option<i64>) -> String {
    let rank = match rank {
        Some(r) if r > 0 => r,
        _ => return base.to_string(),
    };
    if let Some((host, port)) = base.rsplit_once(':') {
        if let Some(port) = canonical_port(port) {
            if let Some(shifted) = i64::from(port).checked_add(rank).filter(|p| *p <= 65535) {
                return format!("{host}:{shifted}");
            }
        }
    }
    format!("{base}{DP_SUFFIX}{rank}")
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
        assert_eq!(dp_pod_id("h:8000", Some(i64::MAX)), format!("h:8000#dp{}", i64::MAX));
    }

    #[test]
    fn only_a_canonical_port_is_offset() {
        // Each of these once read as port 7999 (or 7990), so rank 1 (or 10) of another base
        // named the pod `h:8000`.
        for base in ["h:07999", "h:+7999", "h:007999"] {
            assert_eq!(dp_pod_id(base, Some(1)), format!("{base}#dp1"));
        }
        assert_eq!(dp_pod_id("h:+7990", Some(10)), "h:+7990#dp10");
        assert_eq!(dp_pod_id("h:0", Some(1)), "h:1");
        assert_eq!(canonical_port("8000"), Some(8000));
        assert_eq!(canonical_port("65535"), Some(65535));
        for text in ["", "08000", "+8000", "-1", "65536", "123456", "80 0", "8000\n", "٨٠٠٠"] {
            assert_eq!(canonical_port(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_topic_id_with_another_spelling_of_a_port_or_a_dp_suffix_is_refused() {
        for id in ["10.0.0.9:8000", "[::1]:8000", "pod-a", "host:http", "10.0.0.7", "h:0"] {
            assert_eq!(topic_id_refusal(id), None, "{id}");
        }
        for id in ["10.0.0.9:07999", "10.0.0.9:+7999", "h:-1", "h:65536", "h:8000x", "pod-a#dp1", "h:8000#dp1", "a#dpx"]
        {
            assert!(topic_id_refusal(id).is_some(), "{id}");
        }
    }
}
