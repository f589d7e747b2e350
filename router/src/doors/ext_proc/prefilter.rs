//! The pre-filter's rule: which pods to leave to the endpoint picker behind us. Among the pods
//! whose load is within the load band of the least loaded, those holding the longest cached
//! prefix; on a miss (no pod in the band holds any block), no hint at all, because an empty
//! subset is a 503 to the next picker. A pure function of the pipeline's decision, so every
//! replica names the same pods.

use crate::place::decision::PodChoice;

/// The pods to hint, best first, or `None` on a miss. `band` is `--load-band` (requests above
/// the least loaded eligible pod); pods over the KV cutoff or unreachable are left out unless
/// no pod is otherwise eligible.
pub fn hint(ranked: &[PodChoice], band: f64) -> Option<Vec<String>> {
    let healthy: Vec<&PodChoice> = ranked.iter().filter(|c| c.load.reachable && !c.over_kv_cutoff).collect();
    let reachable: Vec<&PodChoice> = ranked.iter().filter(|c| c.load.reachable).collect();
    let pool = if !healthy.is_empty() {
        healthy
    } else if !reachable.is_empty() {
        reachable
    } else {
        ranked.iter().collect()
    };
    let floor = pool.iter().map(|c| c.requests()).fold(f64::INFINITY, f64::min);
    let in_band: Vec<&PodChoice> = pool.into_iter().filter(|c| c.requests() <= floor + band).collect();
    let best = in_band.iter().map(|c| c.cached_blocks).max()?;
    if best == 0 {
        return None;
    }
    // The picker behind us knows endpoints, not the ranks this router would name there.
    let mut pods: Vec<String> = Vec::new();
    for c in in_band.iter().filter(|c| c.cached_blocks == best) {
        if !pods.iter().any(|p| p == c.endpoint()) {
            pods.push(c.endpoint().to_string());
        }
    }
    Some(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(pod: &str, cached: u32, load: f64) -> PodChoice {
        PodChoice::example(pod, cached, load)
    }

    #[test]
    fn the_longest_prefix_within_the_band_and_every_pod_tied_on_it() {
        let ranked = [choice("a", 10, 0.0), choice("b", 40, 1.0), choice("c", 40, 0.5), choice("d", 90, 5.0)];
        assert_eq!(hint(&ranked, 1.0).unwrap(), ["b", "c"], "d holds more but is out of the band");
        assert_eq!(hint(&ranked, 5.0).unwrap(), ["d"]);
    }

    #[test]
    fn a_miss_is_no_hint_never_an_empty_one() {
        assert_eq!(hint(&[choice("a", 0, 0.0), choice("b", 0, 0.0)], 1.0), None);
        assert_eq!(hint(&[choice("a", 0, 0.0), choice("b", 9, 3.0)], 1.0), None, "the holder is out of the band");
        assert_eq!(hint(&[], 1.0), None);
    }

    #[test]
    fn full_or_unreachable_pods_are_hinted_only_when_nothing_else_is_left() {
        let mut full = choice("full", 50, 0.0);
        full.over_kv_cutoff = true;
        let mut gone = choice("gone", 50, 0.0);
        gone.load.reachable = false;
        assert_eq!(hint(&[full.clone(), gone.clone(), choice("ok", 5, 0.0)], 1.0).unwrap(), ["ok"]);
        assert_eq!(hint(&[full, gone], 1.0).unwrap(), ["full"]);
    }
}
