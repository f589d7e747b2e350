//! What discovery derives from a pod besides its IP: the engines' ports, DP ranks, model,
//! engine family, page size and release, each from the operator's flags unless the pod's
//! annotations (or, where enabled, the engine's own `/server_info`) say otherwise. Shared by
//! `kvindex serve` and `kvindex-router`, so both name a pod the same way.

use std::time::Duration;

/// Annotation giving a pod's number of data-parallel ranks (overrides `dp_size`).
pub const DP_SIZE_ANNOTATION: &str = "kvindex.io/dp-size";
/// Annotation giving a pod's served model (overrides `model`).
pub const MODEL_ANNOTATION: &str = "kvindex.io/model";
/// Annotation naming a pod's engine family (`vllm`, `sglang`, `trtllm`): overrides the probe
/// and the consumer's `default_engine`.
pub const ENGINE_ANNOTATION: &str = "kvindex.io/engine";
/// Annotation giving an SGLang pod's `--page-size` (tokens per page, 1–[`MAX_PAGE_SIZE`]).
pub const PAGE_SIZE_ANNOTATION: &str = "kvindex.io/page-size";
/// Annotation giving the engine's release (`0.5.19`): which of its release rules apply.
pub const ENGINE_VERSION_ANNOTATION: &str = "kvindex.io/engine-version";
/// Annotation saying the engine runs EAGLE/MTP speculative decoding (`true`/`false`): it drops
/// the last block of every cache hit, so the index credits one engine block less.
pub const EAGLE_ANNOTATION: &str = "kvindex.io/eagle";
/// Annotation giving the engine's context-parallel world size (decode times prefill context
/// parallelism, 1–`kvindex::MAX_CONTEXT_PARALLEL`): its cache hits come in blocks that much
/// larger.
pub const CONTEXT_PARALLEL_ANNOTATION: &str = "kvindex.io/context-parallel";

/// Default label selector: llm-d's mark on inference-serving pods.
pub const DEFAULT_LABEL_SELECTOR: &str = "llm-d.ai/inference-serving=true";
/// Default engine PUB port (vLLM's KV-events endpoint `tcp://*:5557`).
pub const DEFAULT_PUB_PORT: u16 = 5557;
/// Default engine replay ROUTER port (`replay_endpoint` `tcp://*:5558`).
pub const DEFAULT_REPLAY_PORT: u16 = 5558;
/// Default engine HTTP port (`vllm serve --port 8000`): pod ids are `<podIP>:<this>`.
pub const DEFAULT_HTTP_PORT: u16 = 8000;
/// Most DP ranks behind one pod (the indexer's bound on dialers per pod).
pub const MAX_DP_SIZE: u32 = 128;
/// Longest model name or pod name kept, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Largest page size taken from an annotation or a probe (the indexer's `page_size` bound).
pub const MAX_PAGE_SIZE: u32 = 65_536;
/// Longest engine release kept, in bytes (`0.5.23.post1rc0` is 15).
pub const MAX_VERSION_LEN: usize = 64;
/// Default wall clock of one engine probe (connect, both paths, the whole body).
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(2000);

/// How a discovered pod becomes engine endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Rank r's PUB socket is `tcp://<podIP>:<pub_port + r>`.
    pub pub_port: u16,
    /// Rank r's replay ROUTER is `tcp://<podIP>:<replay_port + r>`; `None`: no replay.
    pub replay_port: Option<u16>,
    /// Rank r serves HTTP on `<http_port + r>`; the pod id of rank 0 is `<podIP>:<http_port>`.
    pub http_port: u16,
    /// DP ranks of a pod without the [`DP_SIZE_ANNOTATION`].
    pub dp_size: u32,
    /// Model of a pod without the [`MODEL_ANNOTATION`].
    pub model: Option<String>,
    /// Whether a pod with no model (neither annotation nor `model`) is rejected: the indexer's
    /// per-pod mode needs one (it namespaces the pod's blocks); the router does not.
    pub model_required: bool,
    /// Ask each new pod's HTTP port what engine it is (SGLang's `/server_info`), within this
    /// wall clock, unless its annotations already say; `None`: never probe.
    pub engine_probe: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            pub_port: DEFAULT_PUB_PORT,
            replay_port: Some(DEFAULT_REPLAY_PORT),
            http_port: DEFAULT_HTTP_PORT,
            dp_size: 1,
            model: None,
            model_required: false,
            engine_probe: None,
        }
    }
}

impl Settings {
    /// Checks the settings as a whole: every rank's ports must exist.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_DP_SIZE).contains(&self.dp_size) {
            return Err(format!("dp_size must be between 1 and {MAX_DP_SIZE}, got {}", self.dp_size));
        }
        for (what, port) in
            [("pub_port", Some(self.pub_port)), ("http_port", Some(self.http_port)), ("replay_port", self.replay_port)]
        {
            if let Some(port) = port {
                if port == 0 {
                    return Err(format!("{what} must not be 0"));
                }
                if u32::from(port) + self.dp_size - 1 > 65535 {
                    return Err(format!("{what} {port} + {} DP ranks runs past port 65535", self.dp_size));
                }
            }
        }
        if let Some(model) = &self.model {
            check_name(model).map_err(|e| format!("model {e}"))?;
        }
        Ok(())
    }

    /// The largest DP size a pod may announce with these ports.
    pub fn max_dp_size(&self) -> u32 {
        let lowest = [Some(self.pub_port), Some(self.http_port), self.replay_port].into_iter().flatten().max();
        let room = 65535 - u32::from(lowest.unwrap_or(1)) + 1;
        room.min(MAX_DP_SIZE)
    }
}

/// An engine release from an annotation or a probe: bounded, digits, letters and `.+-_` only.
pub fn check_version(v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_VERSION_LEN {
        return Err(format!("must be 1 to {MAX_VERSION_LEN} bytes"));
    }
    if !v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_')) {
        return Err("must be letters, digits and . + - _ only".into());
    }
    Ok(())
}

/// A name from the API server (model, pod name): bounded, no control characters (it ends up
/// in logs, metric labels and the index).
pub fn check_name(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err("must not be empty".into());
    }
    if v.len() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} bytes, got {}", v.len()));
    }
    if v.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_must_fit_every_rank() {
        assert!(Settings::default().validate().is_ok());
        assert!(Settings { dp_size: 0, ..Settings::default() }.validate().is_err());
        assert!(Settings { dp_size: 129, ..Settings::default() }.validate().is_err());
        assert!(Settings { http_port: 65535, dp_size: 2, ..Settings::default() }.validate().is_err());
        assert!(Settings { http_port: 65534, dp_size: 2, ..Settings::default() }.validate().is_ok());
        assert!(Settings { pub_port: 0, ..Settings::default() }.validate().is_err());
        assert!(Settings { replay_port: None, ..Settings::default() }.validate().is_ok());
        assert!(Settings { model: Some("a\nb".into()), ..Settings::default() }.validate().is_err());
        assert_eq!(Settings::default().max_dp_size(), 128);
        assert_eq!(Settings { http_port: 65530, ..Settings::default() }.max_dp_size(), 6);
    }
}
