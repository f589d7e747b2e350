//! A message refused because its stream may not feed the pod it names (one pod, one owner:
//! `write::table::PodOwners`): counted under its reason, and logged now and then with both streams,
//! so an operator sees which engine (or which foreign publisher) names whose pod.

use metrics::counter;

use super::{Context, Worker};
use crate::protocols::StreamKey;
use crate::telemetry as m;
use crate::write::table::{Foreign, Mode};
use crate::write::transport::{escape, escape_bytes};

impl Worker {
    pub(super) fn refuse_foreign(&mut self, key: &StreamKey, pod: &str, why: &Foreign, cx: Context<'_>) {
        match why {
            Foreign::BoundTopic(_) => counter!(m::TOPIC_CONFLICTS).increment(1),
            Foreign::Owned(_) | Foreign::Registered { .. } => {
                counter!(m::SOURCES_REFUSED, "reason" => why.reason()).increment(1)
            }
        }
        self.refused += 1;
        if !self.refused.is_power_of_two() {
            return;
        }
        let stream = stream(key, cx.peer.map(ToString::to_string));
        let topic = escape_bytes(cx.topic);
        let pod = escape(pod);
        let total = self.refused;
        match why {
            Foreign::Owned(owner) => {
                let owner = owned_by(&owner.key, owner.mode, owner.source.map(|s| s.to_string()));
                tracing::warn!(%pod, %stream, %topic, %owner, refused_total = total,
                    "message dropped: its stream would feed a pod another stream owns (two engines, or a foreign publisher, name one pod)");
            }
            Foreign::BoundTopic(owner) => {
                let owner = owned_by(&owner.key, owner.mode, owner.source.map(|s| s.to_string()));
                tracing::warn!(%pod, %stream, %topic, %owner, refused_total = total,
                    "message dropped: a DP rank of a topic bound to another source address");
            }
            Foreign::Registered { base, dialled } => {
                let owner = if *dialled { "the dialled pod" } else { "the configured pod" };
                tracing::warn!(%pod, %stream, %topic, owner = %format!("{owner} {:?}", escape(base)), refused_total = total,
                    "message dropped: its stream would feed a pod of a configured pod's ranks");
            }
        }
    }
}

/// A stream as a log names it: its rank-0 pod id, rank and publisher.
fn stream(key: &StreamKey, from: Option<String>) -> String {
    format!("{:?} rank {} from {}", escape(&key.base), key.rank, from.as_deref().unwrap_or("-"))
}

/// The owning stream as a log names it.
fn owned_by(key: &StreamKey, mode: Mode, source: Option<String>) -> String {
    let via = match (mode, source) {
        (Mode::PerPod, _) => "dialled".to_string(),
        (Mode::Central, Some(source)) => format!("bound to {source}"),
        (Mode::Central, None) => "central".to_string(),
    };
    format!("{:?} rank {} ({via})", escape(&key.base), key.rank)
}
