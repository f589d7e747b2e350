//! Reads an engine's load from its Prometheus `/metrics` text: the three gauges vLLM exports
//! for routers (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` before vLLM 0.10). A pod with
//! several engines (data-parallel ranks, one series each) sums its requests and reports its
//! fullest engine's KV usage.

/// One pod's load as last scraped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    pub waiting: f64,
    pub running: f64,
    /// 0–1.
    pub kv_usage: Option<f64>,
}

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";

/// Splits a sample line into its metric name and value; `None` for comments and lines that
/// are not samples.
fn sample(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        // Skip the label set, honouring quoted values (which may hold `}` or spaces).
        let mut quoted = false;
        let mut escaped = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end? + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, value))
}

/// Parses a `/metrics` body; an error when it has no vLLM request gauges at all.
pub fn parse(text: &str) -> Result<EngineLoad, &'static str> {
    let mut load = EngineLoad::default();
    let (mut seen_requests, mut kv_old) = (false, None::<f64>);
    for (name, value) in text.lines().filter_map(sample) {
        seen_requests |= name == WAITING || name == RUNNING;
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        match name {
            WAITING => load.waiting += value,
            RUNNING => load.running += value,
            KV_USAGE => load.kv_usage = Some(load.kv_usage.map_or(value, |u| u.max(value))),
            KV_USAGE_OLD => kv_old = Some(kv_old.map_or(value, |u| u.max(value))),
            _ => {}
        }
    }
    if !seen_requests {
        return Err("no vllm:num_requests_waiting / vllm:num_requests_running series");
    }
    load.kv_usage = load.kv_usage.or(kv_old).map(|u| u.clamp(0.0, 1.0));
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_engines_and_keeps_the_fullest_kv_usage() {
        let text = "# HELP vllm:num_requests_running Number of requests.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"a } b\"} 4.0 1700000000000\n\
            vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n\
            vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n\
            vllm:num_requests_running_total 99\n";
        let load = parse(text).unwrap();
        assert_eq!(load, EngineLoad { waiting: 4.0, running: 5.0, kv_usage: Some(0.75) });
    }

    #[test]
    fn older_vllm_names_and_garbage() {
        let load = parse("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\nnot a sample\n{}\n").unwrap();
        assert_eq!(load, EngineLoad { waiting: 1.0, running: 0.0, kv_usage: Some(0.5) });
        assert!(parse("up 1\n").is_err());
        assert!(parse("vllm:num_requests_waiting{engine=\"0 1\n").is_err(), "unterminated labels");
        assert_eq!(parse("vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n").unwrap().running, 0.0);
    }
}
