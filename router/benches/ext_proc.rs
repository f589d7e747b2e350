//! Router overhead through the ext_proc endpoint picker: from the first request body byte sent
//! on a `Process` stream to the destination received (headers answer), for the next turn of
//! ~8k-token chats, beside the library pipeline (`Router::route`, what the proxy runs) in the
//! same process and window. Real DeepSeek 129k tokenizer and chat template, a real
//! `kvindex serve` on loopback whose index holds the conversations (served by `kvindex-sim`
//! pods), the ext_proc server on loopback driven by a tonic client as Envoy would.
//! Conversations alternate between the two doors, so both see the same warm state.
//!
//! ```sh
//! source scripts/env.sh
//! cargo build --release -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim
//! cargo bench -p kvindex-router --bench ext_proc    # CHATS=24 TURNS=4 SCORE_DEADLINE_MS=5 to change
//! ```

mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_request, HttpBody, HttpHeaders, ProcessingRequest};
use kvindex_router::config::ext_proc::Mode;
use kvindex_router::doors::ext_proc as extproc;
use kvindex_router::place::request::{self, Endpoint};
use serde_json::json;
use support::{chat, env_usize, pct, World, MODEL};

fn message(request: processing_request::Request) -> ProcessingRequest {
    ProcessingRequest { request: Some(request), ..Default::default() }
}

/// One request phase through ext_proc; returns the time from the first body byte sent to the
/// destination received.
async fn through_ext_proc(client: &mut ExternalProcessorClient<tonic::transport::Channel>, body: &[u8]) -> Duration {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let headers = HeaderMap {
        headers: [(":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json")]
            .iter()
            .map(|(k, v)| HeaderValue { key: k.to_string(), value: String::new(), raw_value: v.as_bytes().to_vec() })
            .collect(),
    };
    tx.send(message(processing_request::Request::RequestHeaders(HttpHeaders {
        headers: Some(headers),
        ..Default::default()
    })))
    .await
    .unwrap();
    let mut answers =
        client.process(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("Process").into_inner();
    // Envoy forwards the body in its own chunks (16 KiB here).
    let chunks: Vec<&[u8]> = body.chunks(16 << 10).collect();
    let start = Instant::now();
    for (i, chunk) in chunks.iter().enumerate() {
        let end_of_stream = i + 1 == chunks.len();
        tx.send(message(processing_request::Request::RequestBody(HttpBody {
            body: chunk.to_vec(),
            end_of_stream,
            ..Default::default()
        })))
        .await
        .unwrap();
    }
    let first = answers.message().await.expect("answer").expect("headers answer");
    let took = start.elapsed();
    assert!(first.dynamic_metadata.is_some(), "a destination");
    drop(tx);
    while let Ok(Some(_)) = answers.message().await {}
    took
}

fn main() {
    let Some((dir, kvindex, sim)) = support::locate() else { return };
    let (chats, turns) = (env_usize("CHATS", 24), env_usize("TURNS", 4));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        // The proxy's default; a debug build on a loaded box needs more (SCORE_DEADLINE_MS).
        let deadline = Duration::from_millis(env_usize("SCORE_DEADLINE_MS", 5) as u64);
        let world = World::start(&dir, &kvindex, &sim, deadline).await;
        let router = world.router.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let picker = extproc::Settings {
            mode: Mode::EndpointPicker,
            max_body_bytes: 16 << 20,
            max_buffered_bytes: 1 << 30,
            fallbacks: 2,
            load_band: 1.0,
            request_timeout: Duration::from_secs(30),
        };
        tokio::spawn(extproc::serve(router.clone(), picker, listener, None, std::future::pending()));
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut client = ExternalProcessorClient::new(channel);

        let (mut library, mut ext_proc, mut tokens, mut matched) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for seed in 0..3 {
            let body = json!({"model": MODEL, "messages": chat(10_000 + seed, 27_000)}).to_string();
            let _ = through_ext_proc(&mut client, body.as_bytes()).await;
        }
        for seed in 0..chats {
            let mut messages = chat(seed, 27_000);
            for turn in 0..turns {
                world.serve_turn(seed, &mut messages, turn).await;
                let next_turn = json!({"model": MODEL, "messages": messages}).to_string();
                if seed % 2 == 0 {
                    let start = Instant::now();
                    let parsed = request::parse(Endpoint::ChatCompletions, next_turn.as_bytes()).unwrap();
                    let decision = router.route(&parsed).await.expect("route");
                    library.push(start.elapsed().as_secs_f64() * 1000.0);
                    tokens.push(decision.prompt_tokens.unwrap_or(0) as f64);
                    matched.push(decision.ranked.first().map_or(0.0, |c| f64::from(c.matched_blocks)));
                } else {
                    ext_proc.push(through_ext_proc(&mut client, next_turn.as_bytes()).await.as_secs_f64() * 1000.0);
                }
            }
        }
        println!(
            "next turn of chats of {:.0} tokens (median; {:.0} blocks matched), DeepSeek 129k tokenizer, kvindex serve on loopback",
            pct(&mut tokens, 0.5),
            pct(&mut matched, 0.5)
        );
        for (name, samples) in
            [("library (parse + route)", &mut library), ("ext_proc (body in → destination)", &mut ext_proc)]
        {
            println!(
                "{name:<34} n={:<4} p50 {:.3} ms p99 {:.3} ms",
                samples.len(),
                pct(samples, 0.5),
                pct(samples, 0.99)
            );
        }
    });
}
