//! The metric series labelled by a source (`kvindex_events_total{type,source}`,
//! `kvindex_gaps_total{source}`, the hash check's two `{source}` counters) or by a dialled pod
//! (`kvindex_subscriber_reconnections_total{pod}`) live exactly as long as that source or
//! dialler. The `metrics` recorder never forgets a series, so a series per topic a peer made up,
//! or per pod IP a rollout left behind, would stay in `/metrics` for good (two addresses
//! churning topics grew it linearly). These are counted here instead, in counters their stream
//! or dialler holds, and rendered at scrape time from those still held: a reclaimed or removed
//! stream, or an unregistered pod's dialler, takes its series with it.
//!
//! Process-wide, like the recorder (`telemetry::recorder`), so servers in one process share it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use metrics_exporter_prometheus::formatting::{
    sanitize_label_value, write_help_line, write_metric_line, write_type_line,
};
use parking_lot::Mutex;

use crate::telemetry as m;

/// The event types of `kvindex_events_total`, in [`StreamCounters::events`]' order.
pub const EVENT_TYPES: [&str; 4] = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown"];

/// One source's counters (a DP-resolved pod), shared by the streams that count for it.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Applied events, by [`EVENT_TYPES`].
    pub events: [AtomicU64; 4],
    pub gaps: AtomicU64,
    pub hash_checked: AtomicU64,
    pub hash_mismatched: AtomicU64,
}

/// A dialled pod's counters.
#[derive(Debug, Default)]
pub struct DiallerCounters {
    pub reconnections: AtomicU64,
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counters by label value, held weakly: an entry whose holders are gone is not rendered, and
/// is pruned as the map grows.
struct Family<C> {
    live: HashMap<Arc<str>, Weak<C>>,
    /// Size past which dead entries are pruned (twice the live ones at the last prune).
    prune_at: usize,
}

impl<C: Default> Family<C> {
    fn new() -> Self {
        Family { live: HashMap::new(), prune_at: 64 }
    }

    /// The counters of `label`, shared with whoever holds them already.
    fn get(&mut self, label: &str) -> Arc<C> {
        if let Some(held) = self.live.get(label).and_then(Weak::upgrade) {
            return held;
        }
        if self.live.len() >= self.prune_at {
            self.live.retain(|_, c| c.strong_count() > 0);
            self.prune_at = (2 * self.live.len()).max(64);
        }
        let counters = Arc::new(C::default());
        self.live.insert(Arc::from(label), Arc::downgrade(&counters));
        counters
    }

    /// The counters still held, by label value.
    fn held(&self) -> Vec<(Arc<str>, Arc<C>)> {
        let mut held: Vec<_> = self.live.iter().filter_map(|(k, c)| Some((k.clone(), c.upgrade()?))).collect();
        held.sort_by(|a, b| a.0.cmp(&b.0));
        held
    }
}

pub struct SourceSeries {
    streams: Mutex<Family<StreamCounters>>,
    diallers: Mutex<Family<DiallerCounters>>,
}

impl SourceSeries {
    fn new() -> SourceSeries {
        SourceSeries { streams: Mutex::new(Family::new()), diallers: Mutex::new(Family::new()) }
    }

    /// The process's series.
    pub fn global() -> &'static SourceSeries {
        static SERIES: OnceLock<SourceSeries> = OnceLock::new();
        SERIES.get_or_init(SourceSeries::new)
    }

    /// The counters of source `pod`, rendered for as long as someone holds them.
    pub fn stream(&self, pod: &str) -> Arc<StreamCounters> {
        self.streams.lock().get(pod)
    }

    /// The counters of dialled pod `pod`, rendered for as long as someone holds them.
    pub fn dialler(&self, pod: &str) -> Arc<DiallerCounters> {
        self.diallers.lock().get(pod)
    }

    /// Appends the series held now to a Prometheus text exposition (`/metrics`), in the
    /// recorder's format. A family with no series is left out, as the recorder does.
    pub fn render(&self, out: &mut String) {
        let streams = self.streams.lock().held();
        let diallers = self.diallers.lock().held();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        family(out, m::EVENTS, &streams, |out, source, c| {
            for (t, n) in EVENT_TYPES.iter().zip(&c.events) {
                line(out, m::EVENTS, &[("type", t), ("source", source)], load(n));
            }
        });
        family(out, m::GAPS, &streams, |out, source, c| line(out, m::GAPS, &[("source", source)], load(&c.gaps)));
        // The hash check's series exist once it checked something, as they did in the recorder.
        let checked: Vec<_> = streams.iter().filter(|(_, c)| load(&c.hash_checked) > 0).cloned().collect();
        family(out, m::HASH_CHECKED, &checked, |out, source, c| {
            line(out, m::HASH_CHECKED, &[("source", source)], load(&c.hash_checked))
        });
        let mismatched: Vec<_> = streams.iter().filter(|(_, c)| load(&c.hash_mismatched) > 0).cloned().collect();
        family(out, m::HASH_MISMATCHES, &mismatched, |out, source, c| {
            line(out, m::HASH_MISMATCHES, &[("source", source)], load(&c.hash_mismatched))
        });
        let reconnected: Vec<_> = diallers.iter().filter(|(_, c)| load(&c.reconnections) > 0).cloned().collect();
        family(out, m::RECONNECTIONS, &reconnected, |out, pod, c| {
            line(out, m::RECONNECTIONS, &[("pod", pod)], load(&c.reconnections))
        });
    }
}

/// One counter family: its HELP (from the metric table) and TYPE, then each source's lines.
fn family<C>(out: &mut String, name: &str, held: &[(Arc<str>, Arc<C>)], lines: impl Fn(&mut String, &str, &C)) {
    if held.is_empty() {
        return;
    }
    if let Some(metric) = m::METRICS.iter().find(|d| d.name == name) {
        write_help_line(out, name, metric.help);
    }
    write_type_line(out, name, "counter");
    for (label, counters) in held {
        lines(out, label, counters);
    }
    out.push('\n');
}

fn line(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", sanitize_label_value(v))).collect();
    write_metric_line::<&str, u64>(out, name, None, &labels, None, value, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_lives_as_long_as_its_holders_and_its_label_is_escaped() {
        let series = SourceSeries::new();
        let a = series.stream("pod-a");
        let a_again = series.stream("pod-a");
        add(&a.events[0], 3);
        add(&a_again.gaps, 1);
        let odd = series.stream("made\"up\n");
        let dialler = series.dialler("pod-a");
        add(&dialler.reconnections, 2);
        let mut out = String::new();
        series.render(&mut out);
        assert!(out.contains("kvindex_events_total{type=\"BlockStored\",source=\"pod-a\"} 3\n"), "{out}");
        assert!(out.contains("kvindex_gaps_total{source=\"pod-a\"} 1\n"), "shared by both holders: {out}");
        assert!(out.contains("source=\"made\\\"up\\n\"}"), "escaped: {out}");
        assert!(out.contains("kvindex_subscriber_reconnections_total{pod=\"pod-a\"} 2\n"), "{out}");
        assert!(out.contains("# TYPE kvindex_events_total counter\n"), "{out}");
        assert!(!out.contains("kvindex_hash_check"), "nothing checked, no series: {out}");

        drop((a, a_again, dialler));
        let mut out = String::new();
        series.render(&mut out);
        assert!(!out.contains("pod-a"), "gone with its holders: {out}");
        assert!(out.contains("made\\\"up"), "{out}");
        drop(odd);
        let mut out = String::new();
        series.render(&mut out);
        assert_eq!(out, "", "no family without a series");
    }

    #[test]
    fn churned_labels_are_pruned() {
        let series = SourceSeries::new();
        let kept = series.stream("kept");
        for i in 0..10_000 {
            drop(series.stream(&format!("made-up-{i}")));
        }
        assert!(series.streams.lock().live.len() <= 128, "{}", series.streams.lock().live.len());
        drop(kept);
    }
}
