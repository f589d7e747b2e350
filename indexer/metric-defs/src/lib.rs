//! Metrics declared once. Each service (and each library that counts: discovery, the chat
//! template sandbox) keeps one table of [`Metric`]s: name, kind, labels, unit and help.
//! [`describe`] registers the table with the `metrics` facade (the HELP and TYPE lines of
//! `/metrics`), and [`doc::check`] holds a Markdown page of metric tables (docs/METRICS.md,
//! docs/ROUTER-CONFIG.md) to the tables, so the page cannot name a metric that does not exist, miss
//! one that does, or state another kind or other labels.
//!
//! The name constants stay where the services count (`telemetry::EVENTS`); a table entry names
//! the constant, so a metric's name is still written once.

pub mod doc;

pub use metrics::Unit;

/// What Prometheus type a metric has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As the metrics docs write it (`counter`, `gauge`, `histogram`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric as a service exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// Every label any series of it carries.
    pub labels: &'static [&'static str],
    pub unit: Option<Unit>,
    /// The HELP text.
    pub help: &'static str,
}

/// Describes every metric of `table` to the installed recorder.
pub fn describe(table: &[Metric]) {
    for m in table {
        match (m.kind, m.unit) {
            (Kind::Counter, Some(unit)) => metrics::describe_counter!(m.name, unit, m.help),
            (Kind::Counter, None) => metrics::describe_counter!(m.name, m.help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(m.name, unit, m.help),
            (Kind::Gauge, None) => metrics::describe_gauge!(m.name, m.help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(m.name, unit, m.help),
            (Kind::Histogram, None) => metrics::describe_histogram!(m.name, m.help),
        }
    }
}

/// The problems of one table on its own: a name declared twice, an empty help.
pub fn check_table(table: &[Metric]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, m) in table.iter().enumerate() {
        if table[..i].iter().any(|o| o.name == m.name) {
            problems.push(format!("{} is declared twice", m.name));
        }
        if m.help.trim().is_empty() {
            problems.push(format!("{} has no help", m.name));
        }
    }
    problems
}
