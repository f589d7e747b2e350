//! The per-request pipeline both front doors share, independent of HTTP: tokenize → score
//! (within the deadline, else load only) → load → rank by cost → a [`Decision`]. Committing a
//! decision marks the request in flight on its pod and asks the indexer for speculative credit
//! (RecordRoute), so the next sibling request routed by any replica sees it.

pub mod cost;
pub mod decision;
pub mod indexer;
pub mod pd;
pub mod rendezvous;
pub mod request;
pub mod tokenize;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_proto::kvindex::v1 as pb;

use crate::config::{Config, IndexerToken};
use crate::metrics as m;
use crate::place::decision::{Decision, OverlapOutcome, PodChoice, ScoreOutcome, Timings};
use crate::place::indexer::IndexerPool;
use crate::place::request::{Prompt, RouteRequest};
use crate::place::tokenize::{TokenizeError, Tokenizers};
use crate::pods::fleet::{Fleet, InFlight, Pod};
use cost::{Candidate, CostWeights, Policy};

/// Why a request cannot be placed. Each maps to one OpenAI error status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the model `{}` does not exist", crate::place::request::echo(.0))]
    UnknownModel(String),
    #[error("{0}")]
    InvalidPrompt(String),
    #[error("the prompt has {tokens} tokens, more than the maximum of {max}")]
    PromptTooLong { tokens: usize, max: usize },
    /// Tokenization stopped once the count passed the limit.
    #[error("the prompt has more than the maximum of {max} tokens ({counted} counted before tokenization stopped)")]
    PromptOverLimit { counted: usize, max: usize },
    /// Refused before tokenizing: more text than `max` tokens can hold (see [`MAX_PROMPT_BYTES_PER_TOKEN`]).
    #[error("the prompt has {bytes} bytes of text, more than the maximum of {max} tokens can hold")]
    PromptTooManyBytes { bytes: usize, max: usize },
    #[error("the chat has {count} messages, more than the maximum of {max}")]
    TooManyMessages { count: usize, max: usize },
    #[error("no pods are available")]
    NoPods,
    #[error("none of the allowed pods is known to this router")]
    NoEligiblePods,
    #[error(
        "chat_template in requests is not accepted by this router, which renders only the model's own chat \
         template (operators can allow client templates with --allow-client-chat-template)"
    )]
    ClientTemplateDisabled,
}

impl RouteError {
    /// The `kvindex_router_request_errors_total` reason.
    pub fn label(&self) -> &'static str {
        match self {
            RouteError::UnknownModel(_) => "unknown_model",
            RouteError::InvalidPrompt(_) => "invalid_prompt",
            RouteError::PromptTooLong { .. }
            | RouteError::PromptOverLimit { .. }
            | RouteError::PromptTooManyBytes { .. } => "prompt_too_long",
            RouteError::TooManyMessages { .. } => "too_many_messages",
            RouteError::NoPods => "no_pods",
            RouteError::NoEligiblePods => "no_eligible_pods",
            RouteError::ClientTemplateDisabled => "client_chat_template_disabled",
        }
    }
}

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
    next_id: AtomicU64,
    block_size_warned: AtomicBool,
    /// RecordRoute calls in flight (bounded: a slow indexer must not pile them up).
    recording: Arc<AtomicUsize>,
    /// Whether a RecordRoute refused for its token was logged already (once is enough: every
    /// pick would log it).
    denied_logged: Arc<AtomicBool>,
}

/// A prompt whose text has more than `--max-prompt-tokens` × this many bytes is refused before
/// tokenizing (400 `context_length_exceeded`): it cannot fit unless its tokens average more than
/// 16 bytes, which only long runs of one character come near (the byte cap derived from the
/// token limit, documented in router/README.md). Chats count the bytes of every string in their
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

/// Most RecordRoute calls in flight at once; past it a pick is not recorded (counted).
const MAX_RECORDING: usize = 1024;

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

fn state_label(state: i32) -> Option<&'static str> {
    match pb::SourceState::try_from(state).ok()? {
        pb::SourceState::Exact => Some("EXACT"),
        pb::SourceState::Degraded => Some("DEGRADED"),
        pb::SourceState::Stale => Some("STALE"),
        pb::SourceState::Unspecified => None,
    }
}

impl Router {
    pub fn new(settings: RouterSettings, tokenizers: Tokenizers, indexer: IndexerPool, fleet: Arc<Fleet>) -> Router {
        if !settings.speculative_ttl.is_zero() && !indexer.is_empty() && settings.indexer_admin_token.is_none() {
            tracing::info!(
                "predict on route (RecordRoute) is off: the indexer takes it only with its admin token \
                 (--indexer-admin-token-file)"
            );
        }
        Router {
            settings,
            tokenizers,
            indexer,
            fleet,
            next_id: AtomicU64::new(0),
            block_size_warned: AtomicBool::new(false),
            recording: Arc::new(AtomicUsize::new(0)),
            denied_logged: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Builds the pipeline from a validated configuration (pods are added separately).
    pub fn from_config(config: &Config, fleet: Arc<Fleet>) -> Result<Router, String> {
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

        check_size(s, &request.prompt)?;
        let tokens = match self.tokenizers.tokenize(&base_model, &request.prompt, s.max_prompt_tokens).await {
            Ok(tokens) => tokens,
            Err(TokenizeError::UnknownModel(m)) => return Err(RouteError::UnknownModel(m)),
            Err(TokenizeError::Invalid(message)) => return Err(RouteError::InvalidPrompt(message)),
            Err(TokenizeError::OverLimit { counted, max }) => {
                return Err(match &request.prompt {
                    Prompt::Tokens(_) => RouteError::PromptTooLong { tokens: counted, max },
                    _ => RouteError::PromptOverLimit { counted, max },
                })
            }
        };
        let tokenized = Instant::now();

        let pods: Vec<Arc<Pod>> = match &request.subset {
            None => self.fleet.snapshot(),
            Some(allowed) => allowed.iter().filter_map(|id| self.fleet.get(id)).collect(),
        };
        if pods.is_empty() {
            return Err(if request.subset.is_some() && !self.fleet.is_empty() {
                RouteError::NoEligiblePods
            } else {
                RouteError::NoPods
            });
        }
        let roles: Vec<_> = pods.iter().map(|p| p.role).collect();
        let pools = pd::pools(&roles);
        if pools.as_ref().is_some_and(|p| p.decode.is_empty() || p.prefill.is_empty()) {
            return Err(RouteError::NoPods);
        }

        let mut block_size = s.block_size;
        let (scores, score) = match &tokens {
            Err(unavailable) => (None, ScoreOutcome::FailOpen { reason: unavailable.label() }),
            Ok(ids) => {
                let query = pb::ScoreTokensRequest {
                    model: base_model.clone(),
                    token_ids: ids.clone(),
                    pods: Vec::new(),
                    lora_name: lora_name.clone().unwrap_or_default(),
                    cache_salt: request.cache_salt.clone().unwrap_or_default(),
                };
                match self.indexer.score(query).await {
                    Ok((response, indexer)) => {
                        if response.block_size as usize != s.block_size && response.block_size > 0 {
                            if !self.block_size_warned.swap(true, Ordering::Relaxed) {
                                tracing::warn!(
                                    router = s.block_size,
                                    indexer = response.block_size,
                                    "--block-size differs from the indexer's; using the indexer's"
                                );
                            }
                            block_size = response.block_size as usize;
                        }
                        (Some(response), ScoreOutcome::Scored { indexer: indexer.to_string() })
                    }
                    Err(failure) => (None, ScoreOutcome::FailOpen { reason: failure.label() }),
                }
            }
        };
        if let ScoreOutcome::FailOpen { reason } = &score {
            metrics::counter!(m::FAIL_OPEN, "reason" => *reason).increment(1);
        }
        let scored = Instant::now();

        let total_blocks = match (&scores, &tokens) {
            (Some(r), _) => r.total_blocks,
            (None, Ok(ids)) => (ids.len() / block_size) as u32,
            (None, Err(_)) => 0,
        };
        let by_pod: HashMap<&str, &pb::PodScore> =
            scores.iter().flat_map(|r| r.scores.iter()).map(|p| (p.pod.as_str(), p)).collect();
        let key = match (&tokens, &request.prompt) {
            (Ok(ids), _) => rendezvous::prompt_key(&namespace, ids, block_size, request.cache_salt.as_deref()),
            (Err(_), Prompt::Text(text)) => rendezvous::text_key(&namespace, text),
            (Err(_), Prompt::Chat(chat)) => {
                let first = chat.messages.first().map(|m| m.to_string()).unwrap_or_default();
                rendezvous::text_key(&namespace, &first)
            }
            (Err(_), Prompt::Tokens(_)) => 0,
        };
        let now = Instant::now();
        let stale = self.fleet.stale_after();
        let mut choices: Vec<PodChoice> = Vec::with_capacity(pods.len());
        let mut candidates: Vec<Candidate> = Vec::with_capacity(pods.len());
        for pod in &pods {
            let load = pod.load(now, stale);
            let found = by_pod.get(pod.id.as_str());
            let matched = found.map_or(0, |p| p.matched_blocks);
            let speculative = found.map_or(0, |p| p.speculative_blocks);
            candidates.push(Candidate {
                matched_blocks: matched,
                speculative_blocks: speculative,
                running: load.load - load.waiting.unwrap_or(0.0),
                waiting: load.waiting.unwrap_or(0.0),
                kv_usage: load.kv_usage,
                kv_blocks: load.kv_blocks,
                reachable: load.reachable,
                last_picked: pod.last_picked(),
                rendezvous: rendezvous::weight(key, &pod.id),
            });
            choices.push(PodChoice {
                pod: pod.id.clone(),
                role: pod.role,
                matched_blocks: matched,
                speculative_blocks: speculative,
                cached_blocks: 0,
                source_state: found.and_then(|p| state_label(p.state)),
                cost: 0.0,
                kv_weight: 0.0,
                kv_cost: 0.0,
                over_kv_cutoff: false,
                in_band: false,
                load,
                handle: Some(pod.clone()),
            });
        }
        let rank_pool = |indices: &[usize], policy: Policy| -> Vec<PodChoice> {
            let pool: Vec<Candidate> = indices.iter().map(|&i| candidates[i]).collect();
            cost::rank(&pool, total_blocks, &s.weights, policy)
                .into_iter()
                .map(|r| {
                    let mut choice = choices[indices[r.index]].clone();
                    choice.cached_blocks = r.cached_blocks;
                    choice.cost = r.cost;
                    choice.kv_weight = r.kv_weight;
                    choice.kv_cost = r.kv_cost;
                    choice.over_kv_cutoff = r.over_kv_cutoff;
                    choice.in_band = r.in_band;
                    choice
                })
                .collect()
        };
        let all: Vec<usize> = (0..pods.len()).collect();
        let (ranked, prefill, policy) = match &pools {
            None => (rank_pool(&all, s.policy), None, s.policy.label()),
            Some(p) => {
                let prefill = rank_pool(&p.prefill, Policy::LoadBand { band: s.load_band }).into_iter().next();
                (rank_pool(&p.decode, Policy::LoadOnly), prefill, "pd")
            }
        };
        // The best reuse on offer: over the pool that computes the prompt, its reachable pods
        // (all of them when none is).
        let holders: &[usize] = pools.as_ref().map_or(&all, |p| &p.prefill);
        let cached = |i: &usize| candidates[*i].matched_blocks.max(candidates[*i].speculative_blocks).min(total_blocks);
        let best_cached_blocks = holders
            .iter()
            .filter(|&&i| candidates[i].reachable)
            .map(cached)
            .max()
            .or_else(|| holders.iter().map(cached).max())
            .unwrap_or(0);
        if let Some(best) = ranked.first() {
            if ranked.iter().any(|c| c.over_kv_cutoff && c.load.reachable && c.cost < best.cost) {
                metrics::counter!(m::KV_CUTOFF).increment(1);
            }
        }
        let picked = Instant::now();
        let timings = Timings {
            tokenize_us: micros(tokenized - start),
            score_us: micros(scored - tokenized),
            pick_us: micros(picked - scored),
            total_us: micros(picked - start),
        };
        metrics::histogram!(m::ROUTE_SECONDS, "stage" => "tokenize").record((tokenized - start).as_secs_f64());
        metrics::histogram!(m::ROUTE_SECONDS, "stage" => "score").record((scored - tokenized).as_secs_f64());
        metrics::histogram!(m::ROUTE_SECONDS, "stage" => "pick").record((picked - scored).as_secs_f64());
        metrics::histogram!(m::ROUTE_SECONDS, "stage" => "total").record((picked - start).as_secs_f64());
        Ok(Decision {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            model: request.model.clone(),
            policy,
            prompt_tokens: tokens.as_ref().ok().map(Vec::len),
            total_blocks,
            block_size: block_size as u32,
            score,
            ranked,
            prefill,
            best_cached_blocks,
            timings,
            tokens: tokens.ok().map(Arc::new),
            lora_name,
            cache_salt: request.cache_salt.clone(),
            base_model,
        })
    }

    /// Sends the request to `decision.ranked[attempt]` (and its prefill pod): counts it in
    /// flight until the returned guards drop, and records the route for speculative credit.
    pub fn commit(&self, decision: &Decision, attempt: usize) -> Option<Vec<InFlight>> {
        let choice = decision.ranked.get(attempt)?;
        let mut guards = Vec::with_capacity(2);
        for c in std::iter::once(choice).chain(decision.prefill.as_ref()) {
            let pod = c.handle.as_ref()?;
            guards.push(self.fleet.begin(pod));
            metrics::counter!(m::PICKS, "pod" => c.pod.clone(), "role" => c.role.label()).increment(1);
        }
        // The pod that computes the prompt's KV cache: the one to credit, and whose reuse counts.
        let holder = decision.prefill.as_ref().unwrap_or(choice);
        if attempt == 0 {
            metrics::counter!(m::PROMPT_BLOCKS).increment(u64::from(decision.total_blocks));
            metrics::counter!(m::CACHED_BLOCKS, "kind" => "matched").increment(u64::from(choice.matched_blocks));
            metrics::counter!(m::CACHED_BLOCKS, "kind" => "speculative")
                .increment(u64::from(choice.cached_blocks.saturating_sub(choice.matched_blocks)));
            record_overlap(decision, holder);
        }
        self.record_route(decision, &holder.pod);
        Some(guards)
    }

    /// Asks the indexer to credit `pod` with the prompt's blocks for the speculative TTL
    /// (RecordRoute), in the background: the request never waits for it, and a failure only
    /// costs the prediction (counted in `kvindex_router_record_route_total`).
    fn record_route(&self, decision: &Decision, pod: &str) {
        let ttl = self.settings.speculative_ttl;
        let Some(token) = &self.settings.indexer_admin_token else { return };
        if ttl.is_zero() || decision.total_blocks == 0 {
            return;
        }
        // Placed by load only: the indexer did not answer in time, so don't queue more on it.
        let (Some(tokens), ScoreOutcome::Scored { .. }) = (&decision.tokens, &decision.score) else { return };
        let Some(mut client) = self.indexer.preferred_client() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.recording.fetch_add(1, Ordering::AcqRel) >= MAX_RECORDING {
            self.recording.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(m::RECORD_ROUTE, "outcome" => "overloaded").increment(1);
            return;
        }
        let request = pb::RecordRouteRequest {
            pod: pod.to_string(),
            model: decision.base_model.clone(),
            token_ids: tokens.as_ref().clone(),
            lora_name: decision.lora_name.clone().unwrap_or_default(),
            cache_salt: decision.cache_salt.clone().unwrap_or_default(),
            ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
        };
        let timeout = self.settings.record_route_timeout;
        let recording = self.recording.clone();
        let (authorization, denied_logged) = (token.authorization(), self.denied_logged.clone());
        runtime.spawn(async move {
            let mut call = tonic::Request::new(request);
            call.set_timeout(timeout);
            call.metadata_mut().insert("authorization", authorization);
            let outcome = match tokio::time::timeout(timeout, client.record_route(call)).await {
                Ok(Ok(_)) => "ok",
                Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => "timeout",
                Ok(Err(status))
                    if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
                {
                    if !denied_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            code = ?status.code(),
                            message = status.message(),
                            "the indexer refuses RecordRoute: check --indexer-admin-token-file against its admin_token_file \
                             (logged once; counted in kvindex_router_record_route_total{{outcome=\"denied\"}})"
                        );
                    }
                    "denied"
                }
                Ok(Err(status)) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "RecordRoute refused");
                    "error"
                }
                Err(_) => "timeout",
            };
            recording.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(m::RECORD_ROUTE, "outcome" => outcome).increment(1);
        });
    }
}
