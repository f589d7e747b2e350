//! What discovery reads from one Pod object, and the one decision made on it: is this pod an
//! engine to use now ([`DiscoveredPod`]), not yet / no longer one (`None`), or one whose API
//! data is unusable ([`Rejection`], counted and logged, treated as absent)?

use std::collections::BTreeMap;
use std::net::IpAddr;

use kvindex::wire::Engine;

use crate::settings::{
    check_name, check_version, Settings, CONTEXT_PARALLEL_ANNOTATION, DP_SIZE_ANNOTATION, EAGLE_ANNOTATION,
    ENGINE_ANNOTATION, ENGINE_VERSION_ANNOTATION, MAX_PAGE_SIZE, MODEL_ANNOTATION, PAGE_SIZE_ANNOTATION,
};
use crate::target::{Annotated, DiscoveredPod};

/// The fields of a Pod that discovery uses, decoupled from the Kubernetes types so the logic
/// is testable without them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodObservation {
    /// `<namespace>/<name>`: the pod's identity across events.
    pub name: String,
    /// `status.phase` (`Running`, `Pending`, …).
    pub phase: Option<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set: the pod is terminating.
    pub terminating: bool,
    /// `status.podIP`.
    pub ip: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

/// A pod that looks eligible but whose API data cannot be used. Treated as absent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {detail}")]
pub struct Rejection {
    pub pod: String,
    /// Metric label: `missing_ip`, `bad_ip`, `bad_dp_size`, `bad_model`, `no_model`,
    /// `bad_engine`, `bad_page_size`, `bad_engine_version`, `bad_eagle`, `bad_context_parallel`,
    /// `duplicate_id`.
    pub reason: &'static str,
    pub detail: String,
}

impl PodObservation {
    /// Running, Ready and not terminating: the engine should be serving.
    pub fn is_serving(&self) -> bool {
        self.phase.as_deref() == Some("Running") && self.ready && !self.terminating
    }

    /// The engine this pod is, if it is serving and its data is usable.
    pub fn classify(&self, settings: &Settings) -> Result<Option<DiscoveredPod>, Rejection> {
        if !self.is_serving() {
            return Ok(None);
        }
        let reject = |reason, detail: String| Rejection { pod: self.name.clone(), reason, detail };
        let ip = match self.ip.as_deref() {
            None | Some("") => return Err(reject("missing_ip", "Running and Ready but has no status.podIP".into())),
            Some(ip) => ip
                .parse::<IpAddr>()
                .map_err(|_| reject("bad_ip", format!("status.podIP {:?} is not an IP address", shorten(ip))))?,
        };
        let dp_size = match self.annotations.get(DP_SIZE_ANNOTATION) {
            None => settings.dp_size,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=settings.max_dp_size()).contains(&n) => n,
                _ => {
                    let detail = format!(
                        "annotation {DP_SIZE_ANNOTATION}={:?} is not a number from 1 to {}",
                        shorten(v),
                        settings.max_dp_size()
                    );
                    return Err(reject("bad_dp_size", detail));
                }
            },
        };
        let model = match self.annotations.get(MODEL_ANNOTATION) {
            Some(m) => {
                check_name(m).map_err(|e| reject("bad_model", format!("annotation {MODEL_ANNOTATION} {e}")))?;
                Some(m.clone())
            }
            None => settings.model.clone(),
        };
        if model.is_none() && settings.model_required {
            let detail = format!("no annotation {MODEL_ANNOTATION} and no configured model");
            return Err(reject("no_model", detail));
        }
        let engine = match self.annotations.get(ENGINE_ANNOTATION) {
            None => None,
            Some(v) => Some(v.trim().parse::<Engine>().map_err(|_| {
                reject(
                    "bad_engine",
                    format!("annotation {ENGINE_ANNOTATION}={:?} is not vllm, sglang or trtllm", shorten(v)),
                )
            })?),
        };
        let page_size = match self.annotations.get(PAGE_SIZE_ANNOTATION) {
            None => None,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Some(n),
                _ => {
                    let detail = format!(
                        "annotation {PAGE_SIZE_ANNOTATION}={:?} is not a number from 1 to {MAX_PAGE_SIZE}",
                        shorten(v)
                    );
                    return Err(reject("bad_page_size", detail));
                }
            },
        };
        let engine_version = match self.annotations.get(ENGINE_VERSION_ANNOTATION) {
            None => None,
            Some(v) => {
                let v = v.trim();
                check_version(v).map_err(|e| {
                    reject("bad_engine_version", format!("annotation {ENGINE_VERSION_ANNOTATION}={:?} {e}", shorten(v)))
                })?;
                Some(v.to_string())
            }
        };
        let eagle = match self.annotations.get(EAGLE_ANNOTATION).map(|v| v.trim()) {
            None => false,
            Some("true") => true,
            Some("false") => false,
            Some(v) => {
                return Err(reject(
                    "bad_eagle",
                    format!("annotation {EAGLE_ANNOTATION}={:?} is not true or false", shorten(v)),
                ))
            }
        };
        let context_parallel = match self.annotations.get(CONTEXT_PARALLEL_ANNOTATION) {
            None => 1,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=kvindex::MAX_CONTEXT_PARALLEL).contains(&n) => n,
                _ => {
                    let detail = format!(
                        "annotation {CONTEXT_PARALLEL_ANNOTATION}={:?} is not a number from 1 to {}",
                        shorten(v),
                        kvindex::MAX_CONTEXT_PARALLEL
                    );
                    return Err(reject("bad_context_parallel", detail));
                }
            },
        };
        let annotated = Annotated {
            engine: engine.is_some(),
            page_size: page_size.is_some(),
            engine_version: engine_version.is_some(),
            dp_size: self.annotations.contains_key(DP_SIZE_ANNOTATION),
        };
        Ok(Some(DiscoveredPod {
            name: self.name.clone(),
            ip,
            model,
            dp_size,
            pub_port: settings.pub_port,
            replay_port: settings.replay_port,
            http_port: settings.http_port,
            engine,
            page_size,
            engine_version,
            kv_events_format: None,
            rules: kvindex::PodRules { eagle, context_parallel },
            annotated,
        }))
    }
}

/// At most 64 characters of an API value, for messages (a value may be huge or hostile).
fn shorten(v: &str) -> String {
    let cut: String = v.chars().take(64).collect();
    let cut: String = cut.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    if cut.len() < v.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(ip: &str) -> PodObservation {
        PodObservation {
            name: "ns/vllm-0".into(),
            phase: Some("Running".into()),
            ready: true,
            terminating: false,
            ip: Some(ip.into()),
            annotations: BTreeMap::new(),
        }
    }

    fn with(mut p: PodObservation, key: &str, value: &str) -> PodObservation {
        p.annotations.insert(key.into(), value.into());
        p
    }

    #[test]
    fn only_running_ready_live_pods_count() {
        let s = Settings::default();
        assert_eq!(serving("10.0.0.7").classify(&s).unwrap().unwrap().pod_id(), "10.0.0.7:8000");
        for p in [
            PodObservation { ready: false, ..serving("10.0.0.7") },
            PodObservation { phase: Some("Pending".into()), ..serving("10.0.0.7") },
            PodObservation { phase: Some("Succeeded".into()), ..serving("10.0.0.7") },
            PodObservation { phase: None, ..serving("10.0.0.7") },
            PodObservation { terminating: true, ..serving("10.0.0.7") },
            // Not serving yet: a missing IP is normal, not an error.
            PodObservation { ready: false, ip: None, ..serving("") },
        ] {
            assert_eq!(p.classify(&s), Ok(None), "{p:?}");
        }
    }

    #[test]
    fn bad_api_data_is_rejected_with_a_reason() {
        let s = Settings::default();
        let reason = |p: PodObservation, s: &Settings| p.classify(s).unwrap_err().reason;
        assert_eq!(reason(PodObservation { ip: None, ..serving("") }, &s), "missing_ip");
        assert_eq!(reason(serving(""), &s), "missing_ip");
        assert_eq!(reason(serving("10.0.0.300"), &s), "bad_ip");
        assert_eq!(reason(serving("pod.example"), &s), "bad_ip");
        for bad in ["", "0", "-1", "two", "129", "1e3", &"9".repeat(100)] {
            assert_eq!(reason(with(serving("10.0.0.7"), DP_SIZE_ANNOTATION, bad), &s), "bad_dp_size", "{bad:?}");
        }
        let near_top = Settings { http_port: 65530, ..Settings::default() };
        assert_eq!(reason(with(serving("10.0.0.7"), DP_SIZE_ANNOTATION, "7"), &near_top), "bad_dp_size");
        assert_eq!(reason(with(serving("10.0.0.7"), MODEL_ANNOTATION, "a\u{1b}[2J"), &s), "bad_model");
        assert_eq!(reason(with(serving("10.0.0.7"), MODEL_ANNOTATION, ""), &s), "bad_model");
        let required = Settings { model_required: true, ..Settings::default() };
        assert_eq!(reason(serving("10.0.0.7"), &required), "no_model");
        let e = serving(&"x".repeat(10_000)).classify(&s).unwrap_err();
        assert!(e.to_string().len() < 200, "hostile values are cut in messages: {e}");
    }

    #[test]
    fn annotations_override_the_configured_dp_size_and_model() {
        let s = Settings { dp_size: 2, model: Some("base".into()), model_required: true, ..Settings::default() };
        let p = serving("10.0.0.7").classify(&s).unwrap().unwrap();
        assert_eq!((p.dp_size, p.model.as_deref()), (2, Some("base")));
        let annotated = with(with(serving("10.0.0.7"), DP_SIZE_ANNOTATION, " 4 "), MODEL_ANNOTATION, "Qwen/Qwen3-0.6B");
        let p = annotated.classify(&s).unwrap().unwrap();
        assert_eq!((p.dp_size, p.model.as_deref()), (4, Some("Qwen/Qwen3-0.6B")));
        assert_eq!(p.rank_pod_id(3), "10.0.0.7:8003");
    }

    #[test]
    fn engine_page_size_and_release_annotations_are_read_and_checked() {
        let s = Settings::default();
        let plain = serving("10.0.0.7").classify(&s).unwrap().unwrap();
        assert_eq!((plain.engine, plain.page_size, plain.engine_version.as_deref()), (None, None, None));
        assert_eq!(plain.annotated, Annotated::default());
        assert!(plain.wants_probe(), "nothing said: ask the engine");
        let sgl = with(
            with(with(serving("10.0.0.7"), ENGINE_ANNOTATION, "sglang"), PAGE_SIZE_ANNOTATION, "16"),
            ENGINE_VERSION_ANNOTATION,
            "0.5.19",
        );
        let p = sgl.classify(&s).unwrap().unwrap();
        assert_eq!(
            (p.engine, p.page_size, p.engine_version.as_deref()),
            (Some(Engine::Sglang), Some(16), Some("0.5.19"))
        );
        assert!(p.annotated.engine && p.annotated.page_size && p.annotated.engine_version && !p.annotated.dp_size);
        assert!(p.wants_probe(), "an SGLang pod's descriptor still gives its endpoints");
        let vllm = with(serving("10.0.0.7"), ENGINE_ANNOTATION, " vllm ").classify(&s).unwrap().unwrap();
        assert_eq!(vllm.engine, Some(Engine::Vllm));
        assert!(!vllm.wants_probe(), "vLLM serves no descriptor");
        let reason = |p: PodObservation| p.classify(&s).unwrap_err().reason;
        for bad in ["", "VLLM2", "llama.cpp", &"x".repeat(1000)] {
            assert_eq!(reason(with(serving("10.0.0.7"), ENGINE_ANNOTATION, bad)), "bad_engine", "{bad:?}");
        }
        for bad in ["", "0", "-4", "65537", "16k"] {
            assert_eq!(reason(with(serving("10.0.0.7"), PAGE_SIZE_ANNOTATION, bad)), "bad_page_size", "{bad:?}");
        }
        let rules = |p: PodObservation| p.classify(&s).unwrap().unwrap().rules;
        assert_eq!(plain.rules, kvindex::PodRules::default());
        let eagle = with(with(serving("10.0.0.7"), EAGLE_ANNOTATION, " true"), CONTEXT_PARALLEL_ANNOTATION, "4");
        assert_eq!(rules(eagle), kvindex::PodRules { eagle: true, context_parallel: 4 });
        assert!(!rules(with(serving("10.0.0.7"), EAGLE_ANNOTATION, "false")).eagle);
        for bad in ["", "yes", "1", "TRUE"] {
            assert_eq!(reason(with(serving("10.0.0.7"), EAGLE_ANNOTATION, bad)), "bad_eagle", "{bad:?}");
        }
        for bad in ["", "0", "65", "2x"] {
            assert_eq!(
                reason(with(serving("10.0.0.7"), CONTEXT_PARALLEL_ANNOTATION, bad)),
                "bad_context_parallel",
                "{bad:?}"
            );
        }
        for bad in ["", "0.5 19", "v\n1", &"9".repeat(65)] {
            assert_eq!(
                reason(with(serving("10.0.0.7"), ENGINE_VERSION_ANNOTATION, bad)),
                "bad_engine_version",
                "{bad:?}"
            );
        }
    }
}
