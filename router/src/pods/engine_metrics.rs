//! One pod's load as the router sees it, whichever engine serves it: [`parse`] hands a
//! `/metrics` body to the parser of the engine family whose request gauges it holds (vLLM's
//! first, so a pod exposing both families reads as vLLM, as before SGLang was read), and the
//! cost model sees the same [`EngineLoad`] for every engine. A pod that is one data-parallel
//! rank of an engine serving every rank behind one endpoint reads that rank's series only.

use crate::pods::engine_load::{EngineLoad, Unread};
use crate::pods::{sglang_metrics, vllm_metrics};

/// Parses a `/metrics` body as vLLM's, else as SGLang's, the series of data-parallel rank
/// `rank` only when given. The error is the `kvindex_router_scrapes_total` outcome: the page
/// holds neither family's request gauges (`unknown_engine`), or none of that rank
/// (`rank_missing`: the pod is configured with more ranks than its engine runs).
pub fn parse(text: &str, rank: Option<u32>) -> Result<EngineLoad, &'static str> {
    vllm_metrics::parse(text, rank)
        .or_else(|unread| match unread {
            Unread::NotThisEngine => sglang_metrics::parse(text, rank),
            Unread::NoSuchRank => Err(Unread::NoSuchRank),
        })
        .map_err(|unread| match unread {
            Unread::NotThisEngine => "unknown_engine",
            Unread::NoSuchRank => "rank_missing",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_read_by_its_own_names_and_vllm_wins_when_both_are_there() {
        let vllm = "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n";
        let sglang = "sglang:num_running_reqs{tp_rank=\"0\"} 5\nsglang:num_queue_reqs{tp_rank=\"0\"} 7\n";
        let read = |text: &str| parse(text, None).map(|l| (l.running, l.waiting));
        assert_eq!(read(vllm), Ok((2.0, 1.0)));
        assert_eq!(read(sglang), Ok((5.0, 7.0)));
        assert_eq!(read(&format!("{sglang}{vllm}")), Ok((2.0, 1.0)));
        assert_eq!(read("up 1\nprocess_cpu_seconds_total 3\n"), Err("unknown_engine"));
        assert_eq!(read(""), Err("unknown_engine"));
    }

    #[test]
    fn a_rank_reads_its_own_engine_and_a_rank_the_engine_does_not_run_is_missing() {
        let vllm = "vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_running{engine=\"1\"} 3\n";
        let sglang = "sglang:num_running_reqs{dp_rank=\"0\"} 5\nsglang:num_running_reqs{dp_rank=\"1\"} 7\n";
        let running = |text: &str, rank| parse(text, Some(rank)).map(|l| l.running);
        assert_eq!((running(vllm, 0), running(vllm, 1)), (Ok(2.0), Ok(3.0)));
        assert_eq!((running(sglang, 0), running(sglang, 1)), (Ok(5.0), Ok(7.0)));
        assert_eq!(running(vllm, 2), Err("rank_missing"));
        assert_eq!(running(sglang, 2), Err("rank_missing"));
        assert_eq!(running("up 1\n", 0), Err("unknown_engine"));
    }
}
