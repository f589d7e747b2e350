//! The `discovery_*` settings: Kubernetes pod discovery (the `kvindex-discovery` crate),
//! checked into its [`WatchConfig`]. In per-pod mode every discovered pod is dialled and needs
//! a model (annotation or `discovery_model`); in central mode (`zmq_bind`) engines dial us
//! and their topics carry the model, and discovery supplies replay endpoints and clears pods
//! that go away.

use kvindex_discovery::WatchConfig;

use super::{ConfigError, Settings, Sources};

/// The discovery config of `s`, or `None` when discovery is off. The flags, defaults and
/// ranges are `kvindex-discovery`'s ([`kvindex_discovery::DiscoveryArgs`], shared with the
/// router); an error names the key and where its value came from.
pub(super) fn validate(s: &Settings, src: &Sources<'_>, central: bool) -> Result<Option<WatchConfig>, ConfigError> {
    s.discovery.watch_config(!central).map_err(|e| src.error(e.key, e.message))
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
