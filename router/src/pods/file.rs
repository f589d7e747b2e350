//! Pods from a file that deployment tooling rewrites (a ConfigMap, a service-discovery agent):
//! a JSON array of `{"id", "url", "role"}` (and, for an engine serving data-parallel ranks
//! behind its URL, `"dp_size"` and `"dp_routing"`), re-read when its content changes. A file that
//! cannot be read or parsed leaves the previous pods in place, logged and counted, so a
//! half-written file never empties the fleet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{normalize_url, ConfigError};
use crate::error::StartError;
use crate::metrics as m;
use crate::pods::fleet::{Fleet, Source};
use crate::pods::spec::PodSpec;

/// Largest pods file read.
const MAX_FILE_BYTES: u64 = 8 << 20;

/// Why a pods file is not applied.
#[derive(Debug, thiserror::Error)]
pub enum PodsFileError {
    #[error("{0}")]
    Unreadable(#[from] std::io::Error),
    #[error("larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    #[error("not a JSON array of {{id, url, role}}: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("a pod has an empty id")]
    EmptyId,
    #[error("pod {0:?} is listed twice")]
    Twice(String),
    #[error("pod {id:?}: {error}")]
    BadUrl { id: String, error: ConfigError },
    #[error("pod {id:?}: {message}")]
    BadDp { id: String, message: String },
}

/// Parses and validates a pods file.
pub fn parse(text: &str) -> Result<Vec<PodSpec>, PodsFileError> {
    let specs: Vec<PodSpec> = serde_json::from_str(text)?;
    let mut seen = std::collections::HashSet::new();
    specs
        .into_iter()
        .map(|mut spec| {
            if spec.id.trim().is_empty() {
                return Err(PodsFileError::EmptyId);
            }
            if !seen.insert(spec.id.clone()) {
                return Err(PodsFileError::Twice(spec.id));
            }
            spec.url = normalize_url("url", &spec.url)
                .map_err(|error| PodsFileError::BadUrl { id: spec.id.clone(), error })?;
            if let Some(message) = spec.dp_refusal() {
                return Err(PodsFileError::BadDp { id: spec.id.clone(), message });
            }
            Ok(spec)
        })
        .collect()
}

fn read(path: &Path) -> Result<String, PodsFileError> {
    let len = std::fs::metadata(path)?.len();
    if len > MAX_FILE_BYTES {
        return Err(PodsFileError::TooLarge);
    }
    Ok(std::fs::read_to_string(path)?)
}

/// Reads the file once (at start a broken file is a configuration error).
pub fn load(fleet: &Fleet, path: &Path) -> Result<String, StartError> {
    let flag = || format!("--pods-file {}", path.display());
    let text = read(path).map_err(|e| StartError::setting(flag(), e))?;
    let specs = parse(&text).map_err(|e| StartError::setting(flag(), e))?;
    let refused = fleet.replace_source(Source::File, &specs);
    metrics::counter!(m::POD_CHANGES, "source" => "file", "op" => "load").increment(1);
    if !refused.is_empty() {
        tracing::warn!(?refused, "pods file names pods configured on the command line; ignored");
    }
    Ok(text)
}

/// Re-reads the file every `interval`, applying it when its content changed.
pub async fn watch(fleet: Arc<Fleet>, path: PathBuf, interval: Duration, mut last: String) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let text = match read(&path) {
            Ok(text) => text,
            Err(error) => {
                metrics::counter!(m::POD_CHANGES, "source" => "file", "op" => "error").increment(1);
                tracing::warn!(path = %path.display(), %error, "pods file unreadable; keeping the current pods");
                continue;
            }
        };
        if text == last {
            continue;
        }
        match parse(&text) {
            Ok(specs) => {
                fleet.replace_source(Source::File, &specs);
                metrics::counter!(m::POD_CHANGES, "source" => "file", "op" => "load").increment(1);
                tracing::info!(path = %path.display(), pods = specs.len(), "pods file applied");
            }
            Err(error) => {
                metrics::counter!(m::POD_CHANGES, "source" => "file", "op" => "error").increment(1);
                tracing::warn!(path = %path.display(), %error, "pods file invalid; keeping the current pods");
            }
        }
        last = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::spec::Role;

    #[test]
    fn parses_roles_and_refuses_bad_entries() {
        let specs =
            parse(r#"[{"id": "a:1", "url": "http://a:1/"}, {"id": "b:1", "url": "http://b:1", "role": "prefill"}]"#)
                .unwrap();
        assert_eq!(specs[0].role, Role::Both);
        assert_eq!(specs[0].url, "http://a:1");
        assert_eq!(specs[1].role, Role::Prefill);
        for bad in [
            "{}",
            r#"[{"id": "a", "url": "http://a:1"}, {"id": "a", "url": "http://a:2"}]"#,
            r#"[{"id": "", "url": "http://a:1"}]"#,
            r#"[{"id": "a", "url": "https://a:1"}]"#,
            r#"[{"id": "a", "url": "http://a:1", "dp_size": 0}]"#,
            r#"[{"id": "a", "url": "http://a:1", "dp_size": 2, "dp_routing": "gateway"}]"#,
            r#"[{"id": "a", "url": "http://a:1", "role": "prefill", "dp_size": 2, "dp_routing": "router"}]"#,
            r#"[{"id": "a", "url": "http://a:1", "role": "both-ish"}]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
