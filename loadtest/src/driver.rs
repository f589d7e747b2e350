//! Plays a workload against N in-process simulated pods under one routing policy, as a
//! discrete-event simulation on the simulated clock (no sockets, fully deterministic), and
//! reports hit rate, TTFT percentiles and per-pod KV usage.
//!
//! Each pod runs steps back to back while it has work. A request is routed and submitted when
//! it arrives; it joins the pod's queue and is admitted at that pod's next step. A step's
//! events are published (encoded in vLLM's wire format and decoded again for policies that
//! subscribe) and its tokens delivered at the step's end, so a precise policy sees what a real
//! subscriber would, one step late. A conversation's next turn arrives its think time after
//! the previous answer finished, with that answer appended to the prompt.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::engine::{Engine, EngineConfig, NewRequest, RequestId, RequestSummary, RequestUpdate, StepOutcome};
use crate::policy::{FleetView, Policy};
use crate::wire::{encode_batch, WireVersion};
use crate::workload::Conversation;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Happening {
    /// Turn `turn` of conversation `conversation` arrives.
    Arrival { conversation: usize, turn: usize },
    /// Pod `pod`'s running step ends.
    StepEnd { pod: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Scheduled {
    at: f64,
    /// Insertion order: equal times resolve deterministically.
    order: u64,
    what: Happening,
}

impl Eq for Scheduled {}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: invert to pop the earliest first.
        other.at.total_cmp(&self.at).then_with(|| other.order.cmp(&self.order))
    }
}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What one policy achieved on the workload.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyReport {
    pub policy: String,
    pub requests: usize,
    /// Cached prompt tokens / prompt tokens.
    pub hit_rate: f64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    /// Time-averaged KV usage per pod over the run.
    pub kv_usage_per_pod: Vec<f64>,
    /// Requests routed to each pod.
    pub requests_per_pod: Vec<usize>,
    pub preemptions: u64,
    /// Simulated seconds until the last answer.
    pub makespan_s: f64,
}

struct PodState {
    engine: Engine,
    /// The step in flight and when it ends.
    in_flight: Option<StepOutcome>,
    /// ∫ kv_usage dt, for the time average.
    usage_area: f64,
    usage_since: f64,
}

struct Open {
    conversation: usize,
    turn: usize,
    prompt: Vec<u32>,
    outputs: Vec<u32>,
}

/// Runs `conversations` on `pods` engines built from `engine`, routed by `policy`. Fails only
/// when the engine's hash configuration is not reproducible.
pub fn run(
    policy: &mut dyn Policy,
    engine: &EngineConfig,
    pods: usize,
    conversations: &[Conversation],
) -> Result<PolicyReport, String> {
    let mut fleet: Vec<PodState> = (0..pods.max(1))
        .map(|_| {
            Ok(PodState {
                engine: Engine::new(engine.clone()).map_err(|e| format!("hash configuration: {e}"))?,
                in_flight: None,
                usage_area: 0.0,
                usage_since: 0.0,
            })
        })
        .collect::<Result<_, String>>()?;
    let mut queue = BinaryHeap::new();
    let mut order = 0u64;
    let mut push = |queue: &mut BinaryHeap<Scheduled>, at: f64, what: Happening| {
        order += 1;
        queue.push(Scheduled { at, order, what });
    };
    for (index, conversation) in conversations.iter().enumerate() {
        if !conversation.turns.is_empty() {
            push(&mut queue, conversation.start_at, Happening::Arrival { conversation: index, turn: 0 });
        }
    }
    let mut histories: Vec<Vec<u32>> = conversations.iter().map(|c| c.opening.clone()).collect();
    let mut open: HashMap<(usize, RequestId), Open> = HashMap::new();
    let mut summaries: Vec<RequestSummary> = Vec::new();
    let mut requests_per_pod = vec![0usize; fleet.len()];
    let mut now = 0.0f64;

    while let Some(next) = queue.pop() {
        now = next.at;
        match next.what {
            Happening::Arrival { conversation, turn } => {
                let mut prompt = histories[conversation].clone();
                prompt.extend(&conversations[conversation].turns[turn].user);
                let pod = choose(policy, &prompt, &fleet);
                if let Some(failure) = policy.failure() {
                    return Err(format!("{}: {failure}", policy.name()));
                }
                requests_per_pod[pod] += 1;
                let max_tokens = conversations[conversation].turns[turn].max_tokens;
                let state = &mut fleet[pod];
                match state.engine.submit(NewRequest { prompt: prompt.clone(), max_tokens }, now) {
                    Ok(id) => {
                        open.insert((pod, id), Open { conversation, turn, prompt, outputs: Vec::new() });
                    }
                    Err(_) => continue, // larger than a pod: skipped, never counted
                }
                if state.in_flight.is_none() {
                    start_step(state, pod, now, &mut queue, &mut push);
                }
            }
            Happening::StepEnd { pod } => {
                let Some(outcome) = fleet[pod].in_flight.take() else {
                    continue;
                };
                if policy.wants_step_events() {
                    policy.publish_step(pod, &outcome.events);
                }
                if policy.wants_events() && !outcome.events.is_empty() {
                    let payload = encode_batch(WireVersion::V0_33, now, &outcome.events, 0);
                    if let Ok(batch) = kvindex::wire::decode_batch(&payload) {
                        policy.observe(pod, &batch);
                    }
                }
                for update in outcome.updates {
                    match update {
                        RequestUpdate::Token { id, token, .. } => {
                            if let Some(request) = open.get_mut(&(pod, id)) {
                                request.outputs.push(token);
                            }
                        }
                        RequestUpdate::Finished { id, summary } => {
                            summaries.push(summary);
                            let Some(done) = open.remove(&(pod, id)) else {
                                continue;
                            };
                            let mut history = done.prompt;
                            history.extend(done.outputs);
                            histories[done.conversation] = history;
                            let next_turn = done.turn + 1;
                            if let Some(turn) = conversations[done.conversation].turns.get(next_turn) {
                                let at = now + turn.think_time_s;
                                push(
                                    &mut queue,
                                    at,
                                    Happening::Arrival { conversation: done.conversation, turn: next_turn },
                                );
                            }
                        }
                        RequestUpdate::Scheduled { .. } => {}
                    }
                }
                if fleet[pod].engine.has_work() {
                    start_step(&mut fleet[pod], pod, now, &mut queue, &mut push);
                }
            }
        }
    }

    let kv_usage_per_pod = fleet
        .iter_mut()
        .map(|state| {
            account_usage(state, now);
            if now > 0.0 {
                state.usage_area / now
            } else {
                0.0
            }
        })
        .collect();
    let preemptions = fleet.iter().map(|p| p.engine.stats().preemptions).sum();
    Ok(report(policy.name(), &summaries, kv_usage_per_pod, requests_per_pod, preemptions, now))
}

fn choose(policy: &mut dyn Policy, prompt: &[u32], fleet: &[PodState]) -> usize {
    let engines: Vec<&Engine> = fleet.iter().map(|p| &p.engine).collect();
    let view = FleetView { pods: &engines };
    policy.choose(prompt, &view).min(fleet.len() - 1)
}

fn account_usage(state: &mut PodState, now: f64) {
    let usage = state.engine.stats().kv_usage;
    state.usage_area += usage * (now - state.usage_since).max(0.0);
    state.usage_since = now;
}

fn start_step(
    state: &mut PodState,
    pod: usize,
    now: f64,
    queue: &mut BinaryHeap<Scheduled>,
    push: &mut impl FnMut(&mut BinaryHeap<Scheduled>, f64, Happening),
) {
    account_usage(state, now);
    let outcome = state.engine.step(now);
    let end = now + outcome.duration;
    let idle_step = outcome.scheduled == 0 && outcome.events.is_empty() && outcome.updates.is_empty();
    state.in_flight = Some(outcome);
    if !idle_step {
        push(queue, end, Happening::StepEnd { pod });
    } else {
        state.in_flight = None;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn report(
    name: &str,
    summaries: &[RequestSummary],
    kv_usage_per_pod: Vec<f64>,
    requests_per_pod: Vec<usize>,
    preemptions: u64,
    makespan: f64,
) -> PolicyReport {
    let prompt: usize = summaries.iter().map(|s| s.prompt_tokens).sum();
    let cached: usize = summaries.iter().map(|s| s.cached_tokens).sum();
    let mut ttfts: Vec<f64> = summaries.iter().map(RequestSummary::ttft).collect();
    ttfts.sort_by(f64::total_cmp);
    PolicyReport {
        policy: name.to_string(),
        requests: summaries.len(),
        hit_rate: if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 },
        ttft_p50_s: percentile(&ttfts, 50.0),
        ttft_p90_s: percentile(&ttfts, 90.0),
        ttft_p99_s: percentile(&ttfts, 99.0),
        kv_usage_per_pod,
        requests_per_pod,
        preemptions,
        makespan_s: makespan,
    }
}
