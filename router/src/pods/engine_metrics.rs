//! One pod's load as the router sees it, whichever engine serves it: [`parse`] hands a
//! `/metrics` body to the parser of the engine family whose request gauges it holds (vLLM's
//! first, so a pod exposing both families reads as vLLM, as before SGLang was read), and the
//! cost model sees the same [`EngineLoad`] for every engine.

use crate::pods::engine_load::EngineLoad;
use crate::pods::{sglang_metrics, vllm_metrics};

/// Parses a `/metrics` body as vLLM's, else as SGLang's; an error when it holds neither
/// family's request gauges.
pub fn parse(text: &str) -> Result<EngineLoad, &'static str> {
    vllm_metrics::parse(text)
        .or_else(|_| sglang_metrics::parse(text))
        .map_err(|_| "no vllm: or sglang: request gauges (num_requests_running / num_running_reqs)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_read_by_its_own_names_and_vllm_wins_when_both_are_there() {
        let vllm = "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n";
        let sglang = "sglang:num_running_reqs{tp_rank=\"0\"} 5\nsglang:num_queue_reqs{tp_rank=\"0\"} 7\n";
        assert_eq!((parse(vllm).unwrap().running, parse(vllm).unwrap().waiting), (2.0, 1.0));
        assert_eq!((parse(sglang).unwrap().running, parse(sglang).unwrap().waiting), (5.0, 7.0));
        let both = format!("{sglang}{vllm}");
        assert_eq!((parse(&both).unwrap().running, parse(&both).unwrap().waiting), (2.0, 1.0));
        assert!(parse("up 1\nprocess_cpu_seconds_total 3\n").is_err());
        assert!(parse("").is_err());
    }
}
