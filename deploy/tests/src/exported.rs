//! The metric names the code exports, read from its sources: every `"kvindex_…"` string
//! literal that is a whole metric name (the `pub const NAME: &str = "…"` tables of
//! `indexer/server/src/telemetry.rs` and `router/src/metrics.rs`, and literals passed straight
//! to `metrics::counter!` and friends), with which are histograms (`histogram!` /
//! `describe_histogram!`) and which of those have explicit buckets (`set_buckets_for_metric`):
//! metrics-exporter-prometheus renders a bucketed histogram as `_bucket`/`_sum`/`_count`, and
//! one without buckets as a summary (`quantile` label, `_sum`, `_count`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What the sources declare.
#[derive(Debug, Default)]
pub struct Exported {
    pub names: BTreeSet<String>,
    pub histograms: BTreeSet<String>,
    pub bucketed: BTreeSet<String>,
}

impl Exported {
    /// Reads every `.rs` file under the given directories (those that exist).
    pub fn from_dirs(dirs: &[&Path]) -> Exported {
        let mut files = Vec::new();
        for dir in dirs {
            collect_rs(dir, &mut files);
        }
        let sources: Vec<String> = files.iter().map(|f| std::fs::read_to_string(f).expect("read source")).collect();
        Exported::from_sources(&sources)
    }

    pub fn from_sources(sources: &[String]) -> Exported {
        let mut consts = BTreeMap::new();
        let mut out = Exported::default();
        for src in sources {
            for lit in string_literals(src) {
                if is_metric_name(&lit) {
                    out.names.insert(lit);
                }
            }
            for line in src.lines() {
                let line = line.trim();
                // `pub const NAME: &str = "kvindex_…";`
                if let Some(rest) = line.strip_prefix("pub const ").or_else(|| line.strip_prefix("const ")) {
                    if let (Some((name, _)), Some(lit)) =
                        (rest.split_once(':'), string_literals(rest).into_iter().next())
                    {
                        if is_metric_name(&lit) {
                            consts.insert(name.trim().to_string(), lit);
                        }
                    }
                }
            }
        }
        let resolve = |arg: &str| -> Option<String> {
            let arg = arg.trim();
            if let Some(lit) = arg.strip_prefix('"').and_then(|a| a.split('"').next()) {
                return is_metric_name(lit).then(|| lit.to_string());
            }
            // `NAME`, `telemetry::NAME`, `NAME.to_string()`, `NAME.into()`
            let path = arg.split('.').next().unwrap_or(arg);
            consts.get(path.rsplit("::").next().unwrap_or(path)).cloned()
        };
        for src in sources {
            for (marker, set) in [("histogram!(", 0), ("Matcher::Full(", 1)] {
                for (i, _) in src.match_indices(marker) {
                    let arg = &src[i + marker.len()..];
                    let arg = arg.split([',', ')']).next().unwrap_or("");
                    if let Some(name) = resolve(arg) {
                        if set == 0 { &mut out.histograms } else { &mut out.bucketed }.insert(name);
                    }
                }
            }
        }
        out
    }

    /// Is `series` (a name as written in PromQL) something these metrics expose?
    pub fn exposes(&self, series: &str) -> bool {
        if self.names.contains(series) && !self.bucketed.contains(series) {
            return true; // counters, gauges, and summaries by their own name (quantiles)
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = series.strip_suffix(suffix) {
                if self.histograms.contains(base) && (suffix != "_bucket" || self.bucketed.contains(base)) {
                    return true;
                }
            }
        }
        false
    }
}

fn is_metric_name(s: &str) -> bool {
    s.starts_with("kvindex_")
        && s.len() > 8
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The contents of the `"…"` string literals of Rust source, outside comments (metric names
/// need no escapes; raw strings and char literals holding a quote are stepped over well enough
/// for the files read here).
fn string_literals(src: &str) -> Vec<String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 3,
            b'\'' if b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') => i += 4,
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                out.push(String::from_utf8_lossy(&b[start..i.min(b.len())]).into_owned());
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
pub const SCORE: &str = "kvindex_score_latency_seconds";
pub const SNAP: &str = "kvindex_snapshot_seconds";
pub const EVENTS: &str = "kvindex_events_total";
fn install() { builder.set_buckets_for_metric(Matcher::Full(SCORE.to_string()), &b); }
fn f() {
    metrics::histogram!(SCORE).record(1.0);
    metrics::histogram!(telemetry::SNAP).record(1.0);
    metrics::counter!("kvindex_tokenizer_requests_total", "method" => m).increment(1);
    tracing::info!(target: "kvindex_router::decision", "x"); // "kvindex_in_comment_total"
}
"#;

    #[test]
    fn reads_names_histograms_and_buckets() {
        let e = Exported::from_sources(&[SRC.to_string()]);
        let names: Vec<_> = e.names.iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "kvindex_events_total",
                "kvindex_score_latency_seconds",
                "kvindex_snapshot_seconds",
                "kvindex_tokenizer_requests_total"
            ]
        );
        assert!(e.exposes("kvindex_events_total"));
        assert!(e.exposes("kvindex_score_latency_seconds_bucket"));
        assert!(e.exposes("kvindex_score_latency_seconds_count"));
        assert!(!e.exposes("kvindex_score_latency_seconds"), "a bucketed histogram has no bare series");
        assert!(e.exposes("kvindex_snapshot_seconds"), "a summary's quantiles");
        assert!(e.exposes("kvindex_snapshot_seconds_sum"));
        assert!(!e.exposes("kvindex_snapshot_seconds_bucket"), "no buckets were configured");
        assert!(!e.exposes("kvindex_events_total_bucket"));
        assert!(!e.exposes("kvindex_in_comment_total"));
    }
}
