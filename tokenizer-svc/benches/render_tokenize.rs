//! Measures what BENCHMARKS.md reports, with the real 129k-vocab DeepSeek tokenizer on an ~8k-token
//! chat: p50/p99 latency to render and tokenize it in full (prefix cache off: the "before"), the
//! first time it is seen and its next turn with the prefix cache (incremental tokenization), an
//! exact repeat; throughput with one worker per core (and the cache's lock contention as the
//! scaling from 1 to N workers); RSS. A plain bench binary rather than criterion, for p99.
//! Run: KVINDEX_FIXTURES=<dir> cargo bench -p kvindex-tokenizer --bench render_tokenize
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_tokenizer::{ChatRequest, RegistryConfig, TokenizerRegistry};
use serde_json::{json, Value as Json};

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

const PARAGRAPHS: [&str; 4] = [
    "The prefix cache stores key/value blocks of previously seen prompts so that a new request sharing the same beginning can skip recomputing attention for those tokens.",
    "Unicode matters too: naïve café façade, Ελληνικά, русский текст, 中文分词测试, 日本語のテキスト, 한국어 문장, العربية, and emoji 🚀🔥👩‍💻 all tokenize into several byte-level pieces.",
    "Numbers such as 3.14159, 2026-11-29, 1,234,567 and 0xDEADBEEF are split by the digit rule of the pre-tokenizer into groups of at most three digits.",
    "    def f(x):\n        return x * 2  # indented code and\ttabs\n",
];

fn request_of(messages: Vec<Json>) -> ChatRequest {
    let mut request = ChatRequest::from_messages(messages);
    request.add_generation_prompt = true;
    request
}

/// The messages of a multi-turn chat whose rendered prompt is about `target` tokens; `tag`
/// makes the system prompt (so the whole prompt) unique.
fn chat_of(registry: &TokenizerRegistry, target: usize, tag: &str) -> (Vec<Json>, usize) {
    let mut turns = 1;
    loop {
        let mut messages = vec![json!({"role": "system", "content": format!("You are a careful assistant.{tag}")})];
        for t in 0..turns {
            let text: String =
                (0..8).map(|i| format!("[{t}.{i}] {}\n", PARAGRAPHS[(t + i) % PARAGRAPHS.len()])).collect();
            messages.push(json!({"role": "user", "content": text}));
            messages.push(json!({"role": "assistant", "content": format!("Noted part {t}.")}));
        }
        messages.push(json!({"role": "user", "content": "Summarise all parts."}));
        let n = registry.render_chat("deepseek", &request_of(messages.clone())).expect("render").len();
        if n >= target {
            return (messages, n);
        }
        turns += 1;
    }
}

/// The next turn of `history` (which ends with a user message): the model's answer and a new
/// question, distinct per `i` (about 100 new tokens).
fn next_turn(history: &[Json], i: u64) -> ChatRequest {
    let mut messages = history.to_vec();
    messages.push(json!({"role": "assistant", "content": format!(
        "Summary {i}: the parts describe prefix caching, unicode handling, digit splitting and code. {}",
        PARAGRAPHS[(i % 4) as usize]
    )}));
    messages.push(
        json!({"role": "user", "content": format!("Question {i}: which part matters most for routing, and why?")}),
    );
    request_of(messages)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nanoseconds this thread has spent on a CPU (Linux schedstat): unlike wall time, not inflated
/// when other processes on a shared box pre-empt the benchmark.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// Wall-clock latencies of `iterations` calls (sorted) and the mean CPU time per call.
struct Timing {
    samples: Vec<Duration>,
    cpu_mean: Option<Duration>,
}

fn time(iterations: u64, mut f: impl FnMut(u64)) -> Timing {
    let cpu_before = thread_cpu_ns();
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect();
    let cpu_mean = cpu_before
        .zip(thread_cpu_ns())
        .map(|(before, after)| Duration::from_nanos((after - before) / iterations.max(1)));
    samples.sort();
    Timing { samples, cpu_mean }
}

/// Prints wall p50/p99 and mean CPU per call; returns the wall p50 and the CPU mean.
fn report(name: &str, timing: &Timing) -> (Duration, Duration) {
    let samples = &timing.samples;
    let p50 = percentile(samples, 0.5);
    println!(
        "{name:<36} p50 {:>7.3} ms  p99 {:>7.3} ms  cpu/call {:>7.3} ms  ({} iterations, 1 thread)",
        ms(p50),
        ms(percentile(samples, 0.99)),
        timing.cpu_mean.map_or(f64::NAN, ms),
        samples.len()
    );
    (p50, timing.cpu_mean.unwrap_or_default())
}

/// Calls per second from `workers` threads calling `work(worker, i)` for `window`, and the mean
/// CPU time per call (on a shared box the first depends on what else runs, the second much less;
/// lock contention would show as CPU per call growing with the number of workers).
struct Rate {
    per_second: f64,
    cpu_per_call: Duration,
}

fn throughput(workers: usize, window: Duration, work: impl Fn(usize, u64) + Send + Sync + 'static) -> Rate {
    let work = Arc::new(work);
    let done = Arc::new(AtomicU64::new(0));
    let cpu = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (work, done, cpu, stop) = (work.clone(), done.clone(), cpu.clone(), stop.clone());
            std::thread::spawn(move || {
                let cpu_before = thread_cpu_ns().unwrap_or(0);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    work(w, i);
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                cpu.fetch_add(thread_cpu_ns().unwrap_or(0) - cpu_before, Ordering::Relaxed);
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(window);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let calls = done.load(Ordering::Relaxed);
    Rate {
        per_second: calls as f64 / started.elapsed().as_secs_f64(),
        cpu_per_call: Duration::from_nanos(cpu.load(Ordering::Relaxed) / calls.max(1)),
    }
}

fn registry(fixtures: &std::path::Path, prefix_cache_bytes: usize) -> Arc<TokenizerRegistry> {
    let mut config = RegistryConfig { prefix_cache_bytes, ..Default::default() };
    config.add_model("deepseek", fixtures.join("models/deepseek")).expect("deepseek model");
    Arc::new(TokenizerRegistry::new(config))
}

fn main() {
    let Some(fixtures) = std::env::var_os("KVINDEX_FIXTURES") else {
        eprintln!("KVINDEX_FIXTURES is not set: run tokenizer-svc/tests/fixtures/fetch.sh first");
        return;
    };
    let fixtures = std::path::PathBuf::from(fixtures);
    let rss_before = rss_kib("VmRSS:");
    let full = registry(&fixtures, 0);
    let load_started = Instant::now();
    full.initialize("deepseek").expect("load");
    let load_time = load_started.elapsed();
    let rss_loaded = rss_kib("VmRSS:");
    let cached = registry(&fixtures, RegistryConfig::default().prefix_cache_bytes);
    cached.initialize("deepseek").expect("load");

    let (history, tokens) = chat_of(&full, 8192, "");
    let base = request_of(history.clone());
    let text = full.render_chat_text("deepseek", &base).unwrap();
    let next_tokens = full.render_chat("deepseek", &next_turn(&history, 0)).unwrap().len();
    for _ in 0..20 {
        full.render_chat("deepseek", &base).unwrap();
    }
    let iterations = 300;

    println!("model: deepseek (129k vocab), tokenizer load {:.0} ms", ms(load_time));
    println!(
        "chat: {} messages, {tokens} prompt tokens, {} chars; next turn: {next_tokens} tokens",
        history.len(),
        text.chars().count()
    );
    let before = report(
        "full render+tokenize (cache off)",
        &time(iterations, |_| {
            std::hint::black_box(full.render_chat("deepseek", &base).unwrap());
        }),
    );
    let full_turns: Vec<ChatRequest> = (0..iterations).map(|i| next_turn(&history, 2_000_000 + i)).collect();
    report(
        "full next turn (cache off)",
        &time(iterations, |i| {
            std::hint::black_box(full.render_chat("deepseek", &full_turns[i as usize]).unwrap());
        }),
    );
    // First sight: every chat is new (unique system prompt), so nothing can be reused.
    let fresh: Vec<ChatRequest> = (0..iterations / 3)
        .map(|i| {
            let mut messages = history.clone();
            messages[0] = json!({"role": "system", "content": format!("You are a careful assistant #{i}.")});
            request_of(messages)
        })
        .collect();
    let first_seen = report(
        "first seen (cache on, miss)",
        &time(fresh.len() as u64, |i| {
            std::hint::black_box(cached.render_chat("deepseek", &fresh[i as usize]).unwrap());
        }),
    );
    cached.render_chat("deepseek", &base).unwrap();
    let turns: Vec<ChatRequest> = (0..iterations).map(|i| next_turn(&history, i)).collect();
    let incremental = report(
        "next turn (cache on, incremental)",
        &time(iterations, |i| {
            std::hint::black_box(cached.render_chat("deepseek", &turns[i as usize]).unwrap());
        }),
    );
    // The same without rendering: new next-turn texts (never seen) through the ids path.
    let texts: Vec<String> = (0..iterations)
        .map(|i| cached.render_chat_text("deepseek", &next_turn(&history, 1_000_000 + i)).unwrap())
        .collect();
    report(
        "next turn, tokenize only (cache on)",
        &time(iterations, |i| {
            std::hint::black_box(cached.render_completion("deepseek", &texts[i as usize]).unwrap());
        }),
    );
    report(
        "exact repeat (cache on)",
        &time(iterations, |_| {
            std::hint::black_box(cached.render_chat("deepseek", &base).unwrap());
        }),
    );
    report(
        "render only",
        &time(iterations, |i| {
            std::hint::black_box(cached.render_chat_text("deepseek", &turns[i as usize]).unwrap());
        }),
    );
    report(
        "tokenize only, full (offsets)",
        &time(iterations, |_| {
            std::hint::black_box(full.tokenize("deepseek", &text, false).unwrap());
        }),
    );
    println!(
        "next turn: {:.1}x faster than full (cpu/call: {:.1}x); first seen costs {:.2}x full (cpu/call: {:.2}x)",
        ms(before.0) / ms(incremental.0),
        ms(before.1) / ms(incremental.1),
        ms(first_seen.0) / ms(before.0),
        ms(first_seen.1) / ms(before.1),
    );
    let stats = cached.prefix_cache_stats();
    println!(
        "prefix cache: {} hits, {} misses, {} tokens reused, {} tokenized, {} nodes, {:.1} MiB",
        stats.hits,
        stats.misses,
        stats.tokens_reused,
        stats.tokens_tokenized,
        stats.nodes,
        stats.bytes as f64 / (1 << 20) as f64
    );

    // One worker per core by default; BENCH_WORKERS overrides (e.g. 1 to see scaling).
    let workers = std::env::var("BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
    let window = Duration::from_secs(10);
    let histories: Arc<Vec<Vec<Json>>> =
        Arc::new((0..workers).map(|w| chat_of(&full, 8192, &format!(" Worker {w}.")).0).collect());
    for h in histories.iter() {
        cached.render_chat("deepseek", &request_of(h.clone())).unwrap();
    }
    let (r, h) = (full.clone(), histories.clone());
    let full_rate = throughput(workers, window, move |w, _| {
        std::hint::black_box(r.render_chat("deepseek", &request_of(h[w].clone())).unwrap());
    });
    let (r, h) = (cached.clone(), histories.clone());
    let next_rate = throughput(workers, window, move |w, i| {
        std::hint::black_box(r.render_chat("deepseek", &next_turn(&h[w], i)).unwrap());
    });
    let (r, h) = (cached.clone(), histories.clone());
    let requests: Vec<ChatRequest> = h.iter().map(|m| request_of(m.clone())).collect();
    let repeat_rate = throughput(workers, window, move |w, _| {
        std::hint::black_box(r.render_chat("deepseek", &requests[w]).unwrap());
    });
    // The cache alone (no rendering, nothing new to tokenize): where shard locks would contend.
    let (r, h) = (cached.clone(), histories.clone());
    let texts: Vec<String> =
        h.iter().map(|m| r.render_chat_text("deepseek", &request_of(m.clone())).unwrap()).collect();
    let cache_rate = throughput(workers, window, move |w, _| {
        std::hint::black_box(r.render_completion("deepseek", &texts[w]).unwrap());
    });
    println!("throughput, {workers} worker threads x {:.0} s:", window.as_secs_f64());
    for (name, rate) in [
        ("full (cache off)", full_rate),
        ("next turn (cache on)", next_rate),
        ("exact repeat (cache on)", repeat_rate),
        ("cache only (repeat, no rendering)", cache_rate),
    ] {
        println!("  {name:<34} {:>7.0} calls/s  cpu/call {:>7.3} ms", rate.per_second, ms(rate.cpu_per_call));
    }
    println!(
        "RSS: {:.1} MiB before load, {:.1} MiB with the tokenizer loaded, {:.1} MiB peak (VmHWM) after the run",
        rss_before as f64 / 1024.0,
        rss_loaded as f64 / 1024.0,
        rss_kib("VmHWM:") as f64 / 1024.0
    );
}
