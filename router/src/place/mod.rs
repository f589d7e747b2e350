//! The per-request pipeline both front doors share, independent of any protocol, one step per
//! file: the request's target (model, LoRA) → [`tokenize`] → score ([`indexer`], within the
//! deadline, else load only) → [`candidates`] (load now, what each pod holds) → [`cost`] →
//! [`pick`] → a [`Decision`], and the one decision line ([`log`]). Committing a decision marks
//! the request in flight on its pod and asks the indexers for speculative credit ([`record`]),
//! so the next sibling request routed by any replica sees it, and reserves the request there
//! ([`reserve`]), so every replica's cost counts it until its first byte and its end. The doors call [`Router::route`]
//! (or [`Router::rank_by_load`] for a request with no prompt) and [`Router::commit`]; nothing
//! here knows HTTP or ext_proc.

pub mod candidates;
pub mod cost;
pub mod decision;
pub mod indexer;
pub mod log;
pub mod pd;
pub mod pick;
pub mod record;
pub mod rendezvous;
pub mod request;
pub mod reserve;
pub mod tokenize;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_proto::kvindex::v1 as pb;
use kvindex_proto::score_query::ScoreQuery;

use crate::config::{Config, IndexerToken};
use crate::error::{RouteError, StartError};
use crate::metrics as m;
use crate::pods::fleet::{Fleet, InFlight, Pod};
use cost::{CostWeights, Policy};
use decision::{Decision, OverlapOutcome, PodChoice, ScoreOutcome, Timings};
use indexer::IndexerPool;
use pd::Pools;
use record::Recorder;
use request::{Prompt, RouteRequest};
use reserve::Reservations;
use tokenize::{TokenizeError, Tokenizers, Unavailable};

/// What the pipeline needs beyond the pods: the placement rule and the limits.
#[derive(Debug, Clone)]
pub struct RouterSettings {
    pub weights: CostWeights,
    pub policy: Policy,
    pub load_band: f64,
    pub block_size: usize,
    pub max_prompt_tokens: usize,
    /// Most chat messages in one request.
    pub max_messages: usize,
    /// RecordRoute's TTL; zero = RecordRoute off.
    pub speculative_ttl: Duration,
    pub record_route_timeout: Duration,
    /// The indexers' admin token, which RecordRoute needs; `None` = RecordRoute off.
    pub indexer_admin_token: Option<IndexerToken>,
    /// The TTL of each request's reservation on the indexers (shared in-flight load); zero =
    /// no reservations, own counts only.
    pub reservation_ttl: Duration,
    /// Served model names; empty = any.
    pub models: HashSet<String>,
    /// adapter → base model.
    pub loras: HashMap<String, String>,
    /// Whether chat requests may carry their own `chat_template` (`--allow-client-chat-template`).
    pub allow_client_chat_template: bool,
}

impl RouterSettings {
    pub fn from_config(config: &Config) -> RouterSettings {
        RouterSettings {
            weights: config.weights,
            policy: config.policy,
            load_band: config.load_band,
            block_size: config.block_size,
            max_prompt_tokens: config.max_prompt_tokens,
            max_messages: config.max_messages,
            speculative_ttl: config.speculative_ttl,
            record_route_timeout: config.record_route_timeout,
            indexer_admin_token: config.indexer_admin_token.clone(),
            reservation_ttl: config.reservation_ttl,
            models: config.served_models().into_iter().collect(),
            loras: config.loras.iter().cloned().collect(),
            allow_client_chat_template: config.client_chat_templates.is_some(),
        }
    }
}

pub struct Router {
    settings: RouterSettings,
    tokenizers: Tokenizers,
    indexer: IndexerPool,
    fleet: Arc<Fleet>,
    recorder: Recorder,
    /// Each request reserved on the indexers; `None`: off (own counts only).
    reservations: Option<Reservations>,
    next_id: AtomicU64,
    block_size_warned: AtomicBool,
}

/// A prompt whose text has more than `--max-prompt-tokens` × this many bytes is refused before
/// tokenizing (400 `context_length_exceeded`): it cannot fit unless its tokens average more than
/// 16 bytes, which only long runs of one character come near (the byte cap derived from the
/// token limit, documented in docs/ROUTER-CONFIG.md). Chats count the bytes of every string in their
/// messages, tools and documents.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 16;

/// Bytes of text in a JSON value: the sum of its strings' (keys included) lengths.
fn text_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(text_bytes).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| k.len() + text_bytes(v)).sum(),
        _ => 0,
    }
}

/// The checks that need no tokenizer: the message count and the text byte cap.
fn check_size(s: &RouterSettings, prompt: &Prompt) -> Result<(), RouteError> {
    let bytes = match prompt {
        Prompt::Tokens(_) => return Ok(()),
        Prompt::Text(text) => text.len(),
        Prompt::Chat(chat) => {
            if chat.messages.len() > s.max_messages {
                return Err(RouteError::TooManyMessages { count: chat.messages.len(), max: s.max_messages });
            }
            let lists = [&chat.tools, &chat.documents];
            chat.messages.iter().map(text_bytes).sum::<usize>()
                + lists.iter().copied().flatten().flatten().map(text_bytes).sum::<usize>()
        }
    };
    if bytes > s.max_prompt_tokens.saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN) {
        return Err(RouteError::PromptTooManyBytes { bytes, max: s.max_prompt_tokens });
    }
    Ok(())
}

/// Decision quality, once per request: whether the pick reused the most any pod held, and
/// how many cached blocks it gave up for load (`kvindex_router_overlap_*`).
fn record_overlap(decision: &Decision, holder: &PodChoice) {
    let outcome = decision.overlap_outcome(0);
    metrics::counter!(m::OVERLAP_PICKS, "outcome" => outcome.label()).increment(1);
    if matches!(outcome, OverlapOutcome::Best | OverlapOutcome::BelowBest) {
        let given_up = decision.best_cached_blocks.saturating_sub(holder.cached_blocks);
        metrics::counter!(m::BEST_CACHED_BLOCKS).increment(u64::from(decision.best_cached_blocks));
        metrics::histogram!(m::OVERLAP_GIVEN_UP_BLOCKS).record(f64::from(given_up));
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Whom a request is for: the base model that tokenizes and is scored, the LoRA adapter if the
/// model name is one, and the namespace its blocks are keyed under.
struct Target {
    base_model: String,
    lora_name: Option<String>,
    namespace: String,
}

/// What the indexer said, or why it was not asked or did not answer in time.
struct Scores {
    response: Option<pb::ScoreTokensResponse>,
    outcome: ScoreOutcome,
    /// The indexer's block size when it answered with another than ours (it wins).
    block_size: usize,
}

/// When each stage ended, for the timings and `kvindex_router_route_seconds`.
struct Clock {
    start: Instant,
    tokenized: Instant,
    scored: Instant,
    picked: Instant,
}

impl Clock {
    fn timings(&self) -> Timings {
        let stages = [
            ("tokenize", self.tokenized - self.start),
            ("score", self.scored - self.tokenized),
            ("pick", self.picked - self.scored),
            ("total", self.picked - self.start),
        ];
        for (stage, took) in stages {
            metrics::histogram!(m::ROUTE_SECONDS, "stage" => stage).record(took.as_secs_f64());
        }
        Timings {
            tokenize_us: micros(stages[0].1),
            score_us: micros(stages[1].1),
            pick_us: micros(stages[2].1),
            total_us: micros(stages[3].1),
        }
    }
}

impl Router {
    pub fn new(settings: RouterSettings, tokenizers: Tokenizers, indexer: IndexerPool, fleet: Arc<Fleet>) -> Router {
        let wanted = !settings.speculative_ttl.is_zero() || !settings.reservation_ttl.is_zero();
        if wanted && !indexer.is_empty() && settings.indexer_admin_token.is_none() {
            tracing::info!(
                "predict on route and the shared in-flight load (RecordRoute) are off: the indexer takes them \
                 only with its admin token (--indexer-admin-token-file)"
            );
        }
        let recorder = Recorder::new(
            settings.speculative_ttl,
            settings.record_route_timeout,
            settings.indexer_admin_token.clone(),
            indexer.len(),
        );
        let reservations = Reservations::start(
            &indexer,
            settings.indexer_admin_token.as_ref(),
            settings.reservation_ttl,
            settings.record_route_timeout,
        );
        Router {
            settings,
            tokenizers,
            indexer,
            fleet,
            recorder,
            reservations,
            next_id: AtomicU64::new(0),
            block_size_warned: AtomicBool::new(false),
        }
    }

    /// Builds the pipeline from a validated configuration (pods are added separately).
    pub fn from_config(config: &Config, fleet: Arc<Fleet>) -> Result<Router, StartError> {
        let tokenizers = Tokenizers::with_client_templates(
            &config.tokenizers,
            config.tokenizer_endpoint.as_deref(),
            config.client_chat_templates,
        )?;
        let indexer = IndexerPool::with_tls(
            &config.indexers,
            config.score_deadline,
            config.hedge_after,
            config.indexer_retry_after,
            config.indexer_tls.as_ref(),
        )?;
        Ok(Router::new(RouterSettings::from_config(config), tokenizers, indexer, fleet))
    }

    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    pub fn indexer(&self) -> &IndexerPool {
        &self.indexer
    }

    pub fn tokenizers(&self) -> &Tokenizers {
        &self.tokenizers
    }

    pub fn settings(&self) -> &RouterSettings {
        &self.settings
    }

    /// Model names to list in `/v1/models`.
    pub fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = self.settings.models.iter().cloned().collect();
        models.sort();
        models
    }

    /// Places one request.
    pub async fn route(&self, request: &RouteRequest) -> Result<Decision, RouteError> {
        let start = Instant::now();
        let target = self.target(request)?;
        check_size(&self.settings, &request.prompt)?;
        // Shared from here on: the score's attempts, the tie-break and the decision read them.
        let tokens = self.tokenize(request, &target).await?.map(Arc::new);
        let tokenized = Instant::now();
        let pods = candidates::eligible(&self.fleet, request.subset.as_deref())?;
        let pools = pools(&pods)?;
        let scores = self.score(request, &target, &tokens).await;
        let scored = Instant::now();
        let total_blocks = match (&scores.response, &tokens) {
            (Some(r), _) => r.total_blocks,
            (None, Ok(ids)) => (ids.len() / scores.block_size) as u32,
            (None, Err(_)) => 0,
        };
        let key = tie_key(&target.namespace, request, &tokens, scores.block_size);
        let shared = self.shared_load(scores.response.as_ref());
        let field = candidates::gather(&self.fleet, &pods, scores.response.as_ref(), shared, key, scores.block_size);
        let s = &self.settings;
        let pick = pick::pick(&field, pools.as_ref(), total_blocks, &s.weights, s.policy, s.load_band);
        count_kv_cutoff(&pick.ranked);
        let clock = Clock { start, tokenized, scored, picked: Instant::now() };
        Ok(Decision {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            model: request.model.clone(),
            policy: pick.policy,
            prompt_tokens: tokens.as_ref().ok().map(|ids| ids.len()),
            total_blocks,
            block_size: scores.block_size as u32,
            score: scores.outcome,
            ranked: pick.ranked,
            prefill: pick.prefill,
            best_cached_blocks: pick.best_cached_blocks,
            timings: clock.timings(),
            tokens: tokens.ok(),
            lora_name: target.lora_name,
            cache_salt: request.cache_salt.clone(),
            base_model: target.base_model,
        })
    }

    /// Pods by load alone (a request with no prompt to score), best first, within `subset` if
    /// any: the same candidates and rule as [`Router::route`] with nothing cached.
    pub fn rank_by_load(&self, subset: Option<&[String]>) -> Result<Vec<Arc<Pod>>, RouteError> {
        let pods = candidates::eligible(&self.fleet, subset)?;
        let field = candidates::gather(&self.fleet, &pods, None, None, 0, self.settings.block_size);
        let ranked = cost::rank(&field.candidates, 0, &self.settings.weights, Policy::LoadOnly);
        Ok(ranked.into_iter().map(|r| pods[r.index].clone()).collect())
    }

    /// The model check, client templates, and the LoRA adapter a model name may be.
    fn target(&self, request: &RouteRequest) -> Result<Target, RouteError> {
        let s = &self.settings;
        if !s.models.is_empty() && !s.models.contains(&request.model) {
            return Err(RouteError::UnknownModel(request.model.clone()));
        }
        if !s.allow_client_chat_template && matches!(&request.prompt, Prompt::Chat(c) if c.chat_template.is_some()) {
            // Whoever tokenizes (in process, a sidecar, or nobody): a stranger's template is a
            // program, refused unless the operator allowed them (kvindex_tokenizer::client_template).
            return Err(RouteError::ClientTemplateDisabled);
        }
        let (base_model, lora_name) = match s.loras.get(&request.model) {
            Some(base) => (base.clone(), Some(request.model.clone())),
            None => (request.model.clone(), None),
        };
        let namespace = lora_name.as_deref().unwrap_or(&base_model).to_string();
        Ok(Target { base_model, lora_name, namespace })
    }

    /// The prompt's token ids, or why there are none (then placed by load); the client's
    /// mistakes are errors.
    async fn tokenize(
        &self,
        request: &RouteRequest,
        target: &Target,
    ) -> Result<Result<Vec<u32>, Unavailable>, RouteError> {
        let max = self.settings.max_prompt_tokens;
        match self.tokenizers.tokenize(&target.base_model, &request.prompt, max).await {
            Ok(tokens) => Ok(tokens),
            Err(TokenizeError::UnknownModel(m)) => Err(RouteError::UnknownModel(m)),
            Err(TokenizeError::Invalid(message)) => Err(RouteError::InvalidPrompt(message)),
            Err(TokenizeError::OverLimit { counted, max }) => Err(match &request.prompt {
                Prompt::Tokens(_) => RouteError::PromptTooLong { tokens: counted, max },
                _ => RouteError::PromptOverLimit { counted, max },
            }),
        }
    }

    /// ScoreTokens within the deadline; without token ids or an answer in time, fail open
    /// (counted by reason).
    async fn score(
        &self,
        request: &RouteRequest,
        target: &Target,
        tokens: &Result<Arc<Vec<u32>>, Unavailable>,
    ) -> Scores {
        let ours = self.settings.block_size;
        let scores = match tokens {
            Err(unavailable) => Scores {
                response: None,
                outcome: ScoreOutcome::FailOpen { reason: unavailable.label() },
                block_size: ours,
            },
            Ok(ids) => {
                let rest = pb::ScoreTokensRequest {
                    model: target.base_model.clone(),
                    token_ids: Vec::new(),
                    pods: Vec::new(),
                    lora_name: target.lora_name.clone().unwrap_or_default(),
                    cache_salt: request.cache_salt.clone().unwrap_or_default(),
                };
                match self.indexer.score(ScoreQuery::new(rest, ids.clone())).await {
                    Ok((response, indexer)) => {
                        let block_size = self.block_size_of(&response);
                        let outcome = ScoreOutcome::Scored { indexer: indexer.to_string() };
                        Scores { response: Some(response), outcome, block_size }
                    }
                    Err(failure) => Scores {
                        response: None,
                        outcome: ScoreOutcome::FailOpen { reason: failure.label() },
                        block_size: ours,
                    },
                }
            }
        };
        if let ScoreOutcome::FailOpen { reason } = &scores.outcome {
            metrics::counter!(m::FAIL_OPEN, "reason" => *reason).increment(1);
        }
        scores
    }

    /// Every router's reserved load, when this router reserves its own requests and the
    /// indexer answered with it (`kvindex_router_load_view_total`); else `None`: own counts.
    fn shared_load<'a>(&self, response: Option<&'a pb::ScoreTokensResponse>) -> Option<&'a pb::InFlight> {
        let shared = response.and_then(|r| r.in_flight.as_ref()).filter(|_| self.reservations.is_some());
        metrics::counter!(m::LOAD_VIEW, "view" => if shared.is_some() { "shared" } else { "own" }).increment(1);
        shared
    }

    /// The indexer's block size wins over `--block-size` (warned once).
    fn block_size_of(&self, response: &pb::ScoreTokensResponse) -> usize {
        let ours = self.settings.block_size;
        if response.block_size as usize == ours || response.block_size == 0 {
            return ours;
        }
        if !self.block_size_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                router = ours,
                indexer = response.block_size,
                "--block-size differs from the indexer's; using the indexer's"
            );
        }
        response.block_size as usize
    }

    /// Sends the request to `decision.ranked[attempt]` (and its prefill pod): counts it in
    /// flight until the returned guards drop, and records the route for speculative credit.
    pub fn commit(&self, decision: &Decision, attempt: usize) -> Option<Vec<InFlight>> {
        let choice = decision.ranked.get(attempt)?;
        // The pod that computes the prompt's KV cache: the one to credit, whose reuse counts,
        // and where its uncached blocks queue as prefill work.
        let holder = decision.prefill.as_ref().unwrap_or(choice);
        let mut guards = Vec::with_capacity(2);
        let mut reservations = Vec::new();
        for c in std::iter::once(choice).chain(decision.prefill.as_ref()) {
            let pod = c.handle.as_ref()?;
            let prefill_blocks =
                if std::ptr::eq(c, holder) { decision.total_blocks.saturating_sub(c.cached_blocks) } else { 0 };
            guards.push(self.begin(pod, prefill_blocks, &mut reservations));
            metrics::counter!(m::PICKS, "pod" => c.pod.clone(), "role" => c.role.label()).increment(1);
        }
        if attempt == 0 {
            metrics::counter!(m::PROMPT_BLOCKS).increment(u64::from(decision.total_blocks));
            metrics::counter!(m::CACHED_BLOCKS, "kind" => "matched").increment(u64::from(choice.matched_blocks));
            metrics::counter!(m::CACHED_BLOCKS, "kind" => "speculative")
                .increment(u64::from(choice.cached_blocks.saturating_sub(choice.matched_blocks)));
            record_overlap(decision, holder);
        }
        // A pod whose engine picks the rank: no rank can be credited, and crediting one would
        // not raise what every rank holds; its reservations still count its load.
        let credit =
            holder.handle.as_ref().is_none_or(|p| candidates::balancer_ranks(p, holder.load.engines).is_none());
        self.recorder.record(&self.indexer, credit.then_some(decision), &holder.pod, reservations);
        Some(guards)
    }

    /// Counts the request in flight on `pod`, picked by load (no decision to commit: nothing
    /// scored, nothing to credit), and reserves it on the indexers.
    pub fn commit_by_load(&self, pod: &Arc<Pod>) -> InFlight {
        let mut reservations = Vec::new();
        let guard = self.begin(pod, 0, &mut reservations);
        self.recorder.record(&self.indexer, None, &pod.id, reservations);
        guard
    }

    /// Counts a request in flight on `pod` with `prefill_blocks` to compute there, and, when
    /// reservations are on, reserves it (added to `reservations`, to send) and ties the
    /// reservation's releases to the count's.
    fn begin(&self, pod: &Arc<Pod>, prefill_blocks: u32, reservations: &mut Vec<pb::Reservation>) -> InFlight {
        let mut guard = self.fleet.begin(pod, prefill_blocks);
        if let Some(shared) = &self.reservations {
            let (sent, held) = shared.reserve(&pod.id, prefill_blocks);
            reservations.push(sent);
            guard.hold(held);
        }
        guard
    }
}

/// The P/D pools of the eligible pods (`None`: not P/D); a P/D fleet missing either pool has
/// no pods to serve.
fn pools(pods: &[Arc<Pod>]) -> Result<Option<Pools>, RouteError> {
    let roles: Vec<_> = pods.iter().map(|p| p.role).collect();
    let pools = pd::pools(&roles);
    if pools.as_ref().is_some_and(|p| p.decode.is_empty() || p.prefill.is_empty()) {
        return Err(RouteError::NoPods);
    }
    Ok(pools)
}

/// The prompt's rendezvous key: its first block's prefix key, or without token ids, its text.
fn tie_key(
    namespace: &str,
    request: &RouteRequest,
    tokens: &Result<Arc<Vec<u32>>, Unavailable>,
    block_size: usize,
) -> u64 {
    match (tokens, &request.prompt) {
        (Ok(ids), _) => rendezvous::prompt_key(namespace, ids, block_size, request.cache_salt.as_deref()),
        (Err(_), Prompt::Text(text)) => rendezvous::text_key(namespace, text),
        (Err(_), Prompt::Chat(chat)) => {
            let first = chat.messages.first().map(|m| m.to_string()).unwrap_or_default();
            rendezvous::text_key(namespace, &first)
        }
        (Err(_), Prompt::Tokens(_)) => 0,
    }
}

/// Counts a pick that passed over a cheaper pod at or above the KV cutoff.
fn count_kv_cutoff(ranked: &[PodChoice]) {
    if let Some(best) = ranked.first() {
        if ranked.iter().any(|c| c.over_kv_cutoff && c.load.reachable && c.cost < best.cost) {
            metrics::counter!(m::KV_CUTOFF).increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::fleet::Source;
    use crate::pods::spec::{PodSpec, Role};

    /// A router over `ids` with no tokenizer and no indexer: everything it places is by load.
    fn router(ids: &[&str]) -> Router {
        let fleet = Arc::new(Fleet::new(Duration::from_secs(2)));
        for id in ids {
            let spec = PodSpec::new(*id, format!("http://{id}"), Role::Both);
            fleet.upsert(&spec, Source::Static).unwrap();
        }
        let settings = RouterSettings {
            weights: CostWeights::default(),
            policy: Policy::Cost,
            load_band: 1.0,
            block_size: 16,
            max_prompt_tokens: 1000,
            max_messages: 10,
            speculative_ttl: Duration::ZERO,
            record_route_timeout: Duration::from_millis(250),
            indexer_admin_token: None,
            reservation_ttl: Duration::ZERO,
            models: HashSet::new(),
            loras: HashMap::new(),
            allow_client_chat_template: false,
        };
        let indexer = IndexerPool::new(&[], Duration::from_millis(5), Duration::from_millis(2), Duration::from_secs(1));
        Router::new(settings, Tokenizers::new(&[], None).unwrap(), indexer.unwrap(), fleet)
    }

    fn ids(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter().map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn by_load_the_pod_just_given_a_request_goes_behind_and_the_subset_binds() {
        let r = router(&["a:1", "b:1"]);
        let first = r.rank_by_load(None).unwrap();
        assert_eq!(first.len(), 2);
        let _in_flight = r.commit_by_load(&first[0]);
        let again = r.rank_by_load(None).unwrap();
        assert_eq!(ids(&again), [first[1].id.as_str(), first[0].id.as_str()]);
        assert_eq!(ids(&r.rank_by_load(Some(&["b:1".into(), "z:1".into()])).unwrap()), ["b:1"]);
        assert_eq!(r.rank_by_load(Some(&["z:1".into()])).unwrap_err(), RouteError::NoEligiblePods);
        assert_eq!(router(&[]).rank_by_load(None).unwrap_err(), RouteError::NoPods);
    }

    #[tokio::test]
    async fn without_an_indexer_a_request_is_placed_by_load_in_the_same_order() {
        let r = router(&["a:1", "b:1"]);
        let request =
            |prompt| RouteRequest { model: "m".into(), prompt, cache_salt: None, stream: false, subset: None };
        let decision = r.route(&request(Prompt::Tokens(vec![7; 40]))).await.unwrap();
        assert_eq!(decision.score, ScoreOutcome::FailOpen { reason: "no_indexer" });
        assert_eq!((decision.prompt_tokens, decision.total_blocks, decision.best_cached_blocks), (Some(40), 2, 0));
        assert_eq!(decision.ranked.len(), 2);
        // Nothing cached, nothing running: each costs its two uncached blocks.
        assert!(decision.ranked.iter().all(|c| c.cached_blocks == 0 && c.cost == 2.0));
        let text = r.route(&request(Prompt::Text("hello".into()))).await.unwrap();
        assert_eq!(text.score, ScoreOutcome::FailOpen { reason: "no_tokenizer" });
        let subset = RouteRequest { subset: Some(vec!["z:1".into()]), ..request(Prompt::Tokens(vec![7; 40])) };
        assert_eq!(r.route(&subset).await.unwrap_err(), RouteError::NoEligiblePods);
    }
}
