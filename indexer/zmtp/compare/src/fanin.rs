//! The 64-publisher fan-in: one subscriber process bound on loopback, one process of 64 libzmq
//! publishers dialling it (vLLM's central mode). Two loads: paced (a fleet's steady rate, for
//! latency and CPU per message) and flat out (for throughput and loss under overload). Runs
//! alternate the candidates so that the machine's noise falls on all of them; the table gives
//! medians over the runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::child::Child;
use crate::stats::median;

pub struct Plan {
    pub impls: Vec<String>,
    pub runs: usize,
    pub publishers: usize,
    pub payload: usize,
    /// (name, messages per publisher, aggregate rate; 0 = flat out)
    pub loads: Vec<(String, u64, u64)>,
}

fn one(imp: &str, publishers: usize, messages: u64, rate: u64, payload: usize) -> Value {
    let sub =
        Child::spawn(&["sub".into(), imp.into(), "fanin".into(), publishers.to_string(), messages.to_string()], None);
    let ready = sub.expect("ready", Duration::from_secs(30)).expect("subscriber ready");
    let endpoint = ready["ready"].as_str().unwrap().to_string();
    let _pubs = Child::spawn(
        &["pub".into(), endpoint, publishers.to_string(), messages.to_string(), rate.to_string(), payload.to_string()],
        None,
    );
    let summary = sub.expect("summary", Duration::from_secs(600)).expect("subscriber summary");
    summary["summary"].clone()
}

pub fn run(plan: Plan) {
    let mut results: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    for run in 0..plan.runs {
        for (load, messages, rate) in &plan.loads {
            for imp in &plan.impls {
                let r = one(imp, plan.publishers, *messages, *rate, plan.payload);
                eprintln!("run {run} {load} {imp}: {r}");
                results.entry((load.clone(), imp.clone())).or_default().push(r);
            }
        }
    }
    println!(
        "| load | subscriber | received / sent | publishers short | msgs/s | CPU µs/msg | CPU s | p50 µs | p99 µs | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for ((load, imp), rs) in &results {
        let m = |k: &str| median(rs.iter().map(|r| r[k].as_f64().unwrap_or(0.0)).collect());
        println!(
            "| {load} | {imp} | {:.0} / {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} | {:.1} |",
            m("received"),
            m("expected"),
            m("publishers_short"),
            m("msgs_per_s"),
            m("cpu_us_per_msg"),
            m("cpu_s"),
            m("p50_us"),
            m("p99_us"),
            m("peak_rss_mib"),
        );
    }
    println!("\n(medians of {} runs; each run's figures are on stderr)", plan.runs);
}
