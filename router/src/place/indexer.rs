//! `ScoreTokens` against one or more `kvindex serve` replicas, within a deadline.
//!
//! The index only improves a placement, so it never holds a request up: the preferred endpoint
//! (the last one that answered) is asked first; an endpoint that errors hands over to the next
//! at once, and one that is merely slow gets the next asked beside it after the hedge delay;
//! whatever has not answered by the deadline is abandoned and the request is placed by load
//! only. An endpoint that fails, or misses the deadline several times in a row, is taken out of
//! rotation and probed in the background until it answers again, so a hung indexer (stopped,
//! not dead) costs a few deadlines, not one per request, while one slow answer under a burst
//! does not cost the index for a whole probe interval. Connections are opened at start for the same reason: a cold
//! HTTP/2 handshake does not fit in a few milliseconds.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use kvindex_proto::kvindex::v1 as pb;
use kvindex_proto::score_query::{self, ScoreQuery, WholeRequests};
use parking_lot::Mutex;
use pb::indexer_client::IndexerClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::IndexerTls;

use crate::error::StartError;
use crate::metrics as m;

/// Why no score came back; the request is then placed by load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreFailure {
    /// No `--indexer` configured.
    NoIndexer,
    /// Every endpoint failed recently and is being skipped.
    AllDown,
    /// No answer within the deadline.
    Timeout,
    /// Every endpoint tried answered with an error.
    Error,
}

impl ScoreFailure {
    pub fn label(self) -> &'static str {
        match self {
            ScoreFailure::NoIndexer => "no_indexer",
            ScoreFailure::AllDown => "indexer_down",
            ScoreFailure::Timeout => "timeout",
            ScoreFailure::Error => "indexer_error",
        }
    }
}

/// How long a background probe may take (it holds up no request).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Missed deadlines in a row that take an endpoint out of rotation.
const TIMEOUTS_BEFORE_DOWN: u32 = 3;

struct IndexerEndpoint {
    addr: String,
    /// The one HTTP/2 connection to it (reconnected by tonic when it breaks), every call's.
    channel: Channel,
    client: IndexerClient<Channel>,
    /// Out of rotation until a probe succeeds.
    down: AtomicBool,
    /// Deadlines missed since the last answer.
    timeouts: AtomicU32,
    probing: Mutex<bool>,
}

impl IndexerEndpoint {
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// One cheap call (an empty prompt) that succeeds only if the indexer serves.
    async fn probe(&self) -> bool {
        let mut call = tonic::Request::new(pb::ScoreTokensRequest::default());
        call.set_timeout(PROBE_TIMEOUT);
        matches!(tokio::time::timeout(PROBE_TIMEOUT, self.client.clone().score_tokens(call)).await, Ok(Ok(_)))
    }
}

impl IndexerTls {
    /// tonic's client TLS: trust only the configured CA, present the identity if any.
    fn client_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

/// The indexer endpoints of `--indexer`, in order.
pub struct IndexerPool {
    endpoints: Vec<Arc<IndexerEndpoint>>,
    deadline: Duration,
    hedge_after: Duration,
    retry_after: Duration,
    preferred: AtomicUsize,
}

impl IndexerPool {
    pub fn new(
        addrs: &[String],
        deadline: Duration,
        hedge_after: Duration,
        retry_after: Duration,
    ) -> Result<IndexerPool, StartError> {
        Self::with_tls(addrs, deadline, hedge_after, retry_after, None)
    }

    /// The pool, talking TLS (mTLS with a client identity) to every indexer when `tls` is set.
    pub fn with_tls(
        addrs: &[String],
        deadline: Duration,
        hedge_after: Duration,
        retry_after: Duration,
        tls: Option<&IndexerTls>,
    ) -> Result<IndexerPool, StartError> {
        let endpoints = addrs
            .iter()
            .map(|addr| {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
                    .map_err(|e| StartError::setting(format!("--indexer {addr}"), e))?;
                if let Some(tls) = tls {
                    endpoint = endpoint
                        .tls_config(tls.client_config())
                        .map_err(|e| StartError::setting(format!("--indexer {addr}"), e))?;
                }
                let channel = endpoint.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect_lazy();
                Ok(Arc::new(IndexerEndpoint {
                    addr: addr.clone(),
                    client: IndexerClient::new(channel.clone()),
                    channel,
                    down: AtomicBool::new(false),
                    timeouts: AtomicU32::new(0),
                    probing: Mutex::new(false),
                }))
            })
            .collect::<Result<Vec<_>, StartError>>()?;
        Ok(IndexerPool { endpoints, deadline, hedge_after, retry_after, preferred: AtomicUsize::new(0) })
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Every endpoint's client, in `--indexer` order (the release queues, one per endpoint).
    pub fn clients(&self) -> Vec<IndexerClient<Channel>> {
        self.endpoints.iter().map(|e| e.client.clone()).collect()
    }

    /// The endpoints in rotation (not failed or timing out), by their position in `--indexer`,
    /// with their clients: where a pick is recorded and reserved.
    pub fn live_clients(&self) -> Vec<(usize, IndexerClient<Channel>)> {
        self.endpoints.iter().enumerate().filter(|(_, e)| !e.is_down()).map(|(i, e)| (i, e.client.clone())).collect()
    }

    /// How many endpoints `--indexer` lists.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Opens every connection now (in the background), so the first request does not pay a
    /// handshake inside its deadline. Needs a tokio runtime.
    pub fn warm_up(&self) {
        for endpoint in &self.endpoints {
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                if !endpoint.probe().await {
                    tracing::warn!(indexer = %endpoint.addr, "indexer not answering at start");
                }
            });
        }
    }

    /// Counts a missed deadline; several in a row take the endpoint out of rotation.
    fn missed_deadline(&self, index: usize) {
        let endpoint = &self.endpoints[index];
        if endpoint.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_BEFORE_DOWN {
            self.mark_down(index, "timeout");
        } else {
            metrics::counter!(m::SCORE_ATTEMPTS, "endpoint" => endpoint.addr.clone(), "outcome" => "timeout")
                .increment(1);
        }
    }

    /// Takes an endpoint out of rotation and probes it every `retry_after` until it answers.
    fn mark_down(&self, index: usize, outcome: &'static str) {
        let endpoint = self.endpoints[index].clone();
        metrics::counter!(m::SCORE_ATTEMPTS, "endpoint" => endpoint.addr.clone(), "outcome" => outcome).increment(1);
        endpoint.down.store(true, Ordering::Relaxed);
        {
            let mut probing = endpoint.probing.lock();
            if *probing {
                return;
            }
            *probing = true;
        }
        tracing::warn!(indexer = %endpoint.addr, outcome, "indexer out of rotation; probing until it answers");
        let retry_after = self.retry_after;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(retry_after).await;
                if endpoint.probe().await {
                    break;
                }
            }
            *endpoint.probing.lock() = false;
            endpoint.timeouts.store(0, Ordering::Relaxed);
            endpoint.down.store(false, Ordering::Relaxed);
            tracing::info!(indexer = %endpoint.addr, "indexer answering again");
        });
    }

    /// Scores `query` within the deadline. `Ok` carries the endpoint's address too. Each attempt
    /// runs on the caller's task (no task of its own to schedule and wake) and shares the
    /// query's token ids.
    pub async fn score(&self, query: ScoreQuery) -> Result<(pb::ScoreTokensResponse, &str), ScoreFailure> {
        if self.endpoints.is_empty() {
            return Err(ScoreFailure::NoIndexer);
        }
        let start = Instant::now();
        let deadline_at = tokio::time::Instant::from_std(start + self.deadline);
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let order: Vec<usize> = (0..n).map(|k| (first + k) % n).filter(|&i| !self.endpoints[i].is_down()).collect();
        if order.is_empty() {
            return Err(ScoreFailure::AllDown);
        }
        let mut attempts = FuturesUnordered::new();
        let launch = |attempts: &mut FuturesUnordered<_>, index: usize| {
            // The request's body handed over whole: the message and the end of the stream in
            // one DATA frame (see `WholeRequests`).
            let channel = WholeRequests(self.endpoints[index].channel.clone());
            let mut call = tonic::Request::new(query.clone());
            call.set_timeout(self.deadline);
            attempts
                .push(async move { (index, score_query::score_tokens(channel, call).await.map(|r| r.into_inner())) });
        };
        launch(&mut attempts, order[0]);
        let mut next = 1;
        let far = deadline_at + Duration::from_secs(3600);
        let hedge = tokio::time::sleep_until(if next < order.len() {
            tokio::time::Instant::from_std(start + self.hedge_after)
        } else {
            far
        });
        tokio::pin!(hedge);
        let mut in_flight = vec![order[0]];
        let mut hard_error = false;
        loop {
            tokio::select! {
                answered = attempts.next() => {
                    match answered {
                        Some((index, Ok(response))) => {
                            let endpoint = &self.endpoints[index];
                            endpoint.timeouts.store(0, Ordering::Relaxed);
                            self.preferred.store(index, Ordering::Relaxed);
                            metrics::counter!(m::SCORE_ATTEMPTS, "endpoint" => endpoint.addr.clone(), "outcome" => "ok").increment(1);
                            return Ok((response, endpoint.addr.as_str()));
                        }
                        Some((index, Err(status))) => {
                            in_flight.retain(|&i| i != index);
                            // The server enforcing our grpc-timeout is a slow answer, not a
                            // broken indexer (e.g. catching up after a pause).
                            if matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) {
                                self.missed_deadline(index);
                            } else {
                                hard_error = true;
                                self.mark_down(index, "error");
                            }
                        }
                        None => {}
                    }
                    if next < order.len() {
                        launch(&mut attempts, order[next]);
                        in_flight.push(order[next]);
                        next += 1;
                    } else if attempts.is_empty() {
                        return Err(if hard_error { ScoreFailure::Error } else { ScoreFailure::Timeout });
                    }
                }
                _ = &mut hedge, if next < order.len() => {
                    launch(&mut attempts, order[next]);
                    in_flight.push(order[next]);
                    next += 1;
                    hedge.as_mut().reset(if next < order.len() {
                        tokio::time::Instant::now() + self.hedge_after.max(Duration::from_micros(100))
                    } else {
                        far
                    });
                }
                _ = tokio::time::sleep_until(deadline_at) => {
                    for index in in_flight {
                        self.missed_deadline(index);
                    }
                    return Err(ScoreFailure::Timeout);
                }
            }
        }
    }
}
