//! The one decision line per request (`target: kvindex_router::decision`, message `routed`),
//! whichever door the request came through: the request id, what was scored and how, every
//! candidate with its numbers, the pod named and the time of each stage. Never the prompt or
//! its token ids.

use super::decision::Decision;
use super::request::Endpoint;
use crate::config::ext_proc::Mode;

/// The door a decision was made for, with what only that door knows.
#[derive(Debug, Clone, Copy)]
pub enum Door {
    /// The OpenAI proxy: the pod that answered (`attempt` into the ranking; `None` when none
    /// did) and the upstream status (502 when none answered).
    Proxy { endpoint: Endpoint, attempt: Option<usize>, status: u16 },
    /// The endpoint picker: the pod named is the ranking's first.
    ExtProc { mode: Mode },
}

impl Door {
    fn label(self) -> &'static str {
        match self {
            Door::Proxy { .. } => "http",
            Door::ExtProc { .. } => "ext_proc",
        }
    }
}

/// Writes the decision line.
pub fn routed(decision: &Decision, door: Door) {
    let (endpoint, mode, attempt, status) = match door {
        Door::Proxy { endpoint, attempt, status } => (Some(endpoint.label()), None, attempt, Some(status)),
        Door::ExtProc { mode } => (None, Some(mode.label()), None, None),
    };
    let chosen = match door {
        Door::Proxy { attempt, .. } => attempt.and_then(|a| decision.ranked.get(a)),
        Door::ExtProc { .. } => decision.ranked.first(),
    };
    tracing::info!(
        target: "kvindex_router::decision",
        request_id = decision.id,
        door = door.label(),
        endpoint,
        mode,
        model = %decision.model,
        policy = decision.policy,
        prompt_tokens = decision.prompt_tokens,
        total_blocks = decision.total_blocks,
        score = decision.score.label(),
        pod = chosen.map(|c| c.pod.as_str()),
        matched_blocks = chosen.map(|c| c.matched_blocks),
        cached_blocks = chosen.map(|c| c.cached_blocks),
        best_cached_blocks = decision.best_cached_blocks,
        cost = chosen.map(|c| c.cost),
        attempt,
        status,
        prefill = %decision.prefill_summary(),
        candidates = %decision.candidates_summary(),
        tokenize_us = decision.timings.tokenize_us,
        score_us = decision.timings.score_us,
        pick_us = decision.timings.pick_us,
        route_us = decision.timings.total_us,
        "routed"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::Value;
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;
    use crate::place::decision::{PodChoice, ScoreOutcome, Timings};

    /// The log lines written while it is the subscriber's writer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl MakeWriter<'_> for Captured {
        type Writer = Captured;
        fn make_writer(&self) -> Captured {
            self.clone()
        }
    }

    fn choice(pod: &str, cached: u32) -> PodChoice {
        PodChoice { cost: 3.0, ..PodChoice::example(pod, cached, 1.0) }
    }

    fn line(decision: &Decision, door: Door) -> Value {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt().json().flatten_event(true).with_writer(captured.clone()).finish();
        tracing::subscriber::with_default(subscriber, || routed(decision, door));
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "one line per call: {text}");
        serde_json::from_str(lines[0]).unwrap()
    }

    #[test]
    fn both_doors_write_the_same_line_with_what_only_they_know() {
        let decision = Decision {
            id: 7,
            model: "m".into(),
            policy: "cost",
            prompt_tokens: Some(40),
            total_blocks: 2,
            block_size: 16,
            score: ScoreOutcome::Scored { indexer: "i".into() },
            ranked: vec![choice("a:1", 2), choice("b:1", 1)],
            prefill: None,
            best_cached_blocks: 2,
            timings: Timings::default(),
            tokens: Some(Arc::new(vec![1, 2, 3])),
            lora_name: None,
            cache_salt: None,
            base_model: "m".into(),
        };
        let proxy = line(&decision, Door::Proxy { endpoint: Endpoint::ChatCompletions, attempt: Some(1), status: 200 });
        let picker = line(&decision, Door::ExtProc { mode: Mode::EndpointPicker });
        for (l, door) in [(&proxy, "http"), (&picker, "ext_proc")] {
            assert_eq!(
                (l["target"].as_str(), l["message"].as_str()),
                (Some("kvindex_router::decision"), Some("routed"))
            );
            assert_eq!((l["request_id"].as_u64(), l["door"].as_str()), (Some(7), Some(door)));
            assert_eq!(l["candidates"], proxy["candidates"], "the same ranking, written the same way");
            assert_eq!(l["best_cached_blocks"], 2);
            assert!(!l.to_string().contains("[1,2,3]"), "never the token ids: {l}");
        }
        assert_eq!(
            (proxy["pod"].as_str(), proxy["attempt"].as_u64(), proxy["status"].as_u64()),
            (Some("b:1"), Some(1), Some(200))
        );
        assert_eq!((proxy["endpoint"].as_str(), proxy.get("mode")), (Some("chat_completions"), None));
        assert_eq!((picker["pod"].as_str(), picker["mode"].as_str()), (Some("a:1"), Some("endpoint-picker")));
        assert!(picker.get("status").is_none() && picker.get("endpoint").is_none());
        let unanswered = line(&decision, Door::Proxy { endpoint: Endpoint::Completions, attempt: None, status: 502 });
        assert_eq!((unanswered.get("pod"), unanswered["status"].as_u64()), (None, Some(502)));
    }
}
