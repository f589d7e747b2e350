//! The discovery settings, declared once for both services: `kvindex serve` and
//! `kvindex-router` flatten [`DiscoveryArgs`] into their command lines (the indexer also reads
//! it from its config file), so both take the same flags, env vars, defaults and ranges, and
//! [`DiscoveryArgs::watch_config`] checks them the same way for both.

use std::time::Duration;

use crate::settings::Settings;
use crate::settings::{
    DEFAULT_HTTP_PORT, DEFAULT_LABEL_SELECTOR, DEFAULT_PROBE_TIMEOUT, DEFAULT_PUB_PORT, DEFAULT_REPLAY_PORT,
    MAX_DP_SIZE,
};
use crate::watcher::{self, ApiServer, WatchConfig};

/// Kubernetes pod discovery (`--discovery kubernetes`). Unset values take the defaults below
/// when checked; a service layers its other sources (a config file) under the flags first.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, serde::Deserialize)]
#[serde(default)]
pub struct DiscoveryArgs {
    /// Pod discovery: `kubernetes` (watch the namespace's pods through the API server) or
    /// `none` (default).
    #[arg(long, value_name = "KIND", env = "KVINDEX_DISCOVERY")]
    pub discovery: Option<String>,
    /// Namespace watched (default: the service account's namespace, else `default`).
    #[arg(long, value_name = "NS", env = "KVINDEX_DISCOVERY_NAMESPACE")]
    pub discovery_namespace: Option<String>,
    /// Label selector of the engine pods (default `llm-d.ai/inference-serving=true`).
    #[arg(long, value_name = "SELECTOR", env = "KVINDEX_DISCOVERY_LABEL_SELECTOR")]
    pub discovery_label_selector: Option<String>,
    /// Engine PUB port; DP rank r publishes on this + r (default 5557; unused by the router).
    #[arg(long, value_name = "PORT", env = "KVINDEX_DISCOVERY_PUB_PORT")]
    pub discovery_pub_port: Option<i64>,
    /// Engine replay ROUTER port; rank r on this + r (default 5558; 0 = no replay; unused by
    /// the router).
    #[arg(long, value_name = "PORT", env = "KVINDEX_DISCOVERY_REPLAY_PORT")]
    pub discovery_replay_port: Option<i64>,
    /// Engine HTTP port: rank r of a pod is `<podIP>:<this + r>` (default 8000).
    #[arg(long, value_name = "PORT", env = "KVINDEX_DISCOVERY_HTTP_PORT")]
    pub discovery_http_port: Option<i64>,
    /// DP ranks of a pod without the `kvindex.io/dp-size` annotation (default 1).
    #[arg(long, value_name = "N", env = "KVINDEX_DISCOVERY_DP_SIZE")]
    pub discovery_dp_size: Option<i64>,
    /// Model of a pod without the `kvindex.io/model` annotation (unused by the router).
    #[arg(long, value_name = "NAME", env = "KVINDEX_DISCOVERY_MODEL")]
    pub discovery_model: Option<String>,
    /// Ask each new pod's HTTP port what engine it is (SGLang's `/server_info`; vLLM answers
    /// 404) unless its `kvindex.io/engine` annotation names vLLM or TensorRT-LLM: `on`
    /// (default) or `off` (unused by the router).
    #[arg(long, value_name = "on|off", env = "KVINDEX_DISCOVERY_ENGINE_PROBE")]
    pub discovery_engine_probe: Option<String>,
    /// Wall clock of one engine probe, connect to last byte (default 2000; unused by the
    /// router).
    #[arg(long, value_name = "MS", env = "KVINDEX_DISCOVERY_ENGINE_PROBE_TIMEOUT_MS")]
    pub discovery_engine_probe_timeout_ms: Option<i64>,
    /// API server URL without credentials (`kubectl proxy`, tests); default: in-cluster
    /// service account, else $KUBECONFIG / ~/.kube/config.
    #[arg(long, value_name = "URL", env = "KVINDEX_DISCOVERY_API_SERVER")]
    pub discovery_api_server: Option<String>,
}

/// An integer discovery setting: its key (the field and file key), default and range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntArg {
    pub key: &'static str,
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

pub const PUB_PORT: IntArg = IntArg { key: "discovery_pub_port", default: DEFAULT_PUB_PORT as i64, min: 1, max: 65535 };
pub const REPLAY_PORT: IntArg =
    IntArg { key: "discovery_replay_port", default: DEFAULT_REPLAY_PORT as i64, min: 0, max: 65535 };
pub const HTTP_PORT: IntArg =
    IntArg { key: "discovery_http_port", default: DEFAULT_HTTP_PORT as i64, min: 1, max: 65535 };
pub const DP_SIZE: IntArg = IntArg { key: "discovery_dp_size", default: 1, min: 1, max: MAX_DP_SIZE as i64 };
pub const ENGINE_PROBE_TIMEOUT_MS: IntArg = IntArg {
    key: "discovery_engine_probe_timeout_ms",
    default: DEFAULT_PROBE_TIMEOUT.as_millis() as i64,
    min: 1,
    max: 60_000,
};
/// The integer settings, in declaration order.
pub const INT_ARGS: [IntArg; 5] = [PUB_PORT, REPLAY_PORT, HTTP_PORT, DP_SIZE, ENGINE_PROBE_TIMEOUT_MS];

/// `discovery_engine_probe`: its default and its choices.
pub const ENGINE_PROBE_DEFAULT: &str = "on";
pub const ENGINE_PROBE_CHOICES: [&str; 2] = ["on", "off"];

/// `discovery`: its default and its choices (`""` also means `none`).
pub const KIND_DEFAULT: &str = "none";
pub const KIND_CHOICES: [&str; 2] = ["kubernetes", "none"];
/// `discovery_label_selector`'s default.
pub const LABEL_SELECTOR_DEFAULT: &str = DEFAULT_LABEL_SELECTOR;

/// A discovery setting that does not check: its key (the service names its flag or origin).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ArgError {
    pub key: &'static str,
    pub message: String,
}

impl ArgError {
    fn new(key: &'static str, message: impl Into<String>) -> Self {
        ArgError { key, message: message.into() }
    }

    /// The flag of the setting at fault (`--discovery-dp-size`).
    pub fn flag(&self) -> &'static str {
        match self.key {
            "discovery" => "--discovery",
            "discovery_namespace" => "--discovery-namespace",
            "discovery_label_selector" => "--discovery-label-selector",
            "discovery_pub_port" => "--discovery-pub-port",
            "discovery_replay_port" => "--discovery-replay-port",
            "discovery_http_port" => "--discovery-http-port",
            "discovery_model" => "--discovery-model",
            "discovery_api_server" => "--discovery-api-server",
            "discovery_engine_probe" => "--discovery-engine-probe",
            "discovery_engine_probe_timeout_ms" => "--discovery-engine-probe-timeout-ms",
            _ => "--discovery-dp-size",
        }
    }
}

impl IntArg {
    fn check(&self, v: Option<i64>) -> Result<i64, ArgError> {
        let v = v.unwrap_or(self.default);
        if v < self.min || v > self.max {
            return Err(ArgError::new(self.key, format!("must be between {} and {}, got {v}", self.min, self.max)));
        }
        Ok(v)
    }
}

impl DiscoveryArgs {
    /// The watch configuration, or `None` when discovery is off. `model_required`: a pod with
    /// no model (annotation or `discovery_model`) is rejected (the indexer's per-pod mode).
    pub fn watch_config(&self, model_required: bool) -> Result<Option<WatchConfig>, ArgError> {
        match self.discovery.as_deref().unwrap_or(KIND_DEFAULT) {
            "none" | "" => return Ok(None),
            "kubernetes" => {}
            other => {
                let choices: Vec<String> = KIND_CHOICES.iter().map(|c| format!("{c:?}")).collect();
                return Err(ArgError::new("discovery", format!("must be {}, got {other:?}", choices.join(" or "))));
            }
        }
        let replay_port = REPLAY_PORT.check(self.discovery_replay_port)?;
        let probe_timeout = ENGINE_PROBE_TIMEOUT_MS.check(self.discovery_engine_probe_timeout_ms)?;
        let engine_probe = match self.discovery_engine_probe.as_deref().unwrap_or(ENGINE_PROBE_DEFAULT) {
            "on" => Some(Duration::from_millis(probe_timeout as u64)),
            "off" => None,
            other => {
                let message = format!("must be \"on\" or \"off\", got {other:?}");
                return Err(ArgError::new("discovery_engine_probe", message));
            }
        };
        let settings = Settings {
            pub_port: PUB_PORT.check(self.discovery_pub_port)? as u16,
            replay_port: (replay_port != 0).then_some(replay_port as u16),
            http_port: HTTP_PORT.check(self.discovery_http_port)? as u16,
            dp_size: DP_SIZE.check(self.discovery_dp_size)? as u32,
            model: self.discovery_model.clone().filter(|m| !m.is_empty()),
            model_required,
            engine_probe,
        };
        if let Err(m) = settings.validate() {
            let key = if m.starts_with("model") { "discovery_model" } else { "discovery_dp_size" };
            return Err(ArgError::new(key, m));
        }
        let namespace = watcher::namespace(self.discovery_namespace.as_deref())
            .map_err(|m| ArgError::new("discovery_namespace", m))?;
        let label_selector = watcher::label_selector(self.discovery_label_selector.as_deref())
            .map_err(|m| ArgError::new("discovery_label_selector", m))?;
        let api_server = ApiServer::parse(self.discovery_api_server.as_deref())
            .map_err(|m| ArgError::new("discovery_api_server", m))?;
        Ok(Some(WatchConfig { namespace, label_selector, api_server, settings }))
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command, FromArgMatches};

    use super::*;

    fn parse(args: &[&str]) -> Result<Option<WatchConfig>, ArgError> {
        let command = DiscoveryArgs::augment_args(Command::new("t"));
        let matches = command.try_get_matches_from(std::iter::once("t").chain(args.iter().copied())).unwrap();
        DiscoveryArgs::from_arg_matches(&matches).unwrap().watch_config(false)
    }

    #[test]
    fn defaults_and_ranges_are_checked_once_for_both_services() {
        assert!(matches!(parse(&[]), Ok(None)));
        let on = parse(&["--discovery", "kubernetes"]).unwrap().unwrap();
        assert_eq!((on.settings.pub_port, on.settings.replay_port, on.settings.http_port), (5557, Some(5558), 8000));
        assert_eq!(on.label_selector, LABEL_SELECTOR_DEFAULT);
        let e = parse(&["--discovery", "consul"]).unwrap_err();
        assert_eq!((e.key, e.message.as_str()), ("discovery", "must be \"kubernetes\" or \"none\", got \"consul\""));
        let e = parse(&["--discovery", "kubernetes", "--discovery-pub-port", "0"]).unwrap_err();
        assert_eq!((e.flag(), e.message.as_str()), ("--discovery-pub-port", "must be between 1 and 65535, got 0"));
        let e = parse(&["--discovery", "kubernetes", "--discovery-http-port", "65535", "--discovery-dp-size", "2"]);
        assert_eq!(e.unwrap_err().flag(), "--discovery-dp-size");
        let no_replay = parse(&["--discovery", "kubernetes", "--discovery-replay-port", "0"]).unwrap().unwrap();
        assert_eq!(no_replay.settings.replay_port, None);
        assert_eq!(on.settings.engine_probe, Some(Duration::from_millis(2000)), "probing is on by default");
        let off = parse(&["--discovery", "kubernetes", "--discovery-engine-probe", "off"]).unwrap().unwrap();
        assert_eq!(off.settings.engine_probe, None);
        let quick = ["--discovery", "kubernetes", "--discovery-engine-probe-timeout-ms", "250"];
        assert_eq!(parse(&quick).unwrap().unwrap().settings.engine_probe, Some(Duration::from_millis(250)));
        let e = parse(&["--discovery", "kubernetes", "--discovery-engine-probe", "yes"]).unwrap_err();
        assert_eq!(
            (e.flag(), e.message.as_str()),
            ("--discovery-engine-probe", "must be \"on\" or \"off\", got \"yes\"")
        );
        let e = parse(&["--discovery", "kubernetes", "--discovery-engine-probe-timeout-ms", "0"]).unwrap_err();
        assert_eq!(e.flag(), "--discovery-engine-probe-timeout-ms");
    }
}
