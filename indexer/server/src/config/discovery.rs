//! The `discovery_*` settings: Kubernetes pod discovery (the `kvindex-discovery` crate),
//! checked into its [`WatchConfig`]. In per-pod mode every discovered pod is dialled and needs
//! a model (annotation or `discovery_model`); in central mode (`zmq_bind`) engines dial us
//! and their topics carry the model, and discovery supplies replay endpoints and clears pods
//! that go away.

use kvindex_discovery::settings::{DEFAULT_HTTP_PORT, DEFAULT_PUB_PORT, DEFAULT_REPLAY_PORT};
use kvindex_discovery::{watcher, ApiServer, WatchConfig};

use super::{ConfigError, IntCheck, Settings, Sources};

/// The discovery config of `s`, or `None` when discovery is off.
pub(super) fn validate(
    s: &Settings,
    src: &Sources<'_>,
    int: &IntCheck<'_>,
    central: bool,
) -> Result<Option<WatchConfig>, ConfigError> {
    match s.discovery.as_deref().unwrap_or("none") {
        "none" | "" => return Ok(None),
        "kubernetes" => {}
        other => return Err(src.error("discovery", format!("must be \"kubernetes\" or \"none\", got {other:?}"))),
    }
    let port = |key, v, default| int(key, v, default, 1, 65535).map(|p| p as u16);
    let replay_port = int("discovery_replay_port", s.discovery_replay_port, i64::from(DEFAULT_REPLAY_PORT), 0, 65535)?;
    let settings = kvindex_discovery::Settings {
        pub_port: port("discovery_pub_port", s.discovery_pub_port, i64::from(DEFAULT_PUB_PORT))?,
        replay_port: (replay_port != 0).then_some(replay_port as u16),
        http_port: port("discovery_http_port", s.discovery_http_port, i64::from(DEFAULT_HTTP_PORT))?,
        dp_size: int("discovery_dp_size", s.discovery_dp_size, 1, 1, i64::from(super::pod::MAX_DP_SIZE))? as u32,
        model: s.discovery_model.clone().filter(|m| !m.is_empty()),
        model_required: !central,
    };
    if let Err(m) = settings.validate() {
        let key = if m.starts_with("model") { "discovery_model" } else { "discovery_dp_size" };
        return Err(src.error(key, m));
    }
    let namespace =
        watcher::namespace(s.discovery_namespace.as_deref()).map_err(|m| src.error("discovery_namespace", m))?;
    let label_selector = watcher::label_selector(s.discovery_label_selector.as_deref())
        .map_err(|m| src.error("discovery_label_selector", m))?;
    let api_server =
        ApiServer::parse(s.discovery_api_server.as_deref()).map_err(|m| src.error("discovery_api_server", m))?;
    Ok(Some(WatchConfig { namespace, label_selector, api_server, settings }))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn discovery_is_off_by_default_and_checked_when_on() {
        assert!(Config::from_args(["--block-size", "16"]).unwrap().discovery.is_none());
        let c = Config::from_args(["--discovery", "kubernetes", "--discovery-namespace", "llm"]).unwrap();
        let d = c.discovery.unwrap();
        assert_eq!((d.namespace.as_str(), d.label_selector.as_str()), ("llm", "llm-d.ai/inference-serving=true"));
        assert_eq!((d.settings.pub_port, d.settings.replay_port, d.settings.http_port), (5557, Some(5558), 8000));
        assert!(d.settings.model_required, "per-pod mode needs a model");
        let d = Config::from_args([
            "--discovery",
            "kubernetes",
            "--discovery-replay-port",
            "0",
            "--zmq-bind",
            "tcp://*:5557",
        ])
        .unwrap()
        .discovery
        .unwrap();
        assert_eq!(d.settings.replay_port, None);
        assert!(!d.settings.model_required, "central mode: the topic names the model");
        for (args, key) in [
            (&["--discovery", "consul"][..], "discovery"),
            (&["--discovery", "kubernetes", "--discovery-pub-port", "0"], "discovery_pub_port"),
            (&["--discovery", "kubernetes", "--discovery-dp-size", "129"], "discovery_dp_size"),
            (
                &["--discovery", "kubernetes", "--discovery-http-port", "65535", "--discovery-dp-size", "2"],
                "discovery_dp_size",
            ),
            (&["--discovery", "kubernetes", "--discovery-namespace", "a b"], "discovery_namespace"),
            (&["--discovery", "kubernetes", "--discovery-api-server", "10.0.0.1:6443"], "discovery_api_server"),
        ] {
            assert_eq!(Config::from_args(args).unwrap_err().key, key, "{args:?}");
        }
    }
}
