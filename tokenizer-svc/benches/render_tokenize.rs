//! Measures what BENCHMARKS.md reports: p50/p99 latency to render and tokenize an ~8k-token chat
//! with the real 129k-vocab DeepSeek tokenizer, throughput with one worker per core, and RSS.
//! Run: KVINDEX_FIXTURES=<dir> cargo bench -p kvindex-tokenizer --bench render_tokenize
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_tokenizer::{ChatRequest, RegistryConfig, TokenizerRegistry};
use serde_json::json;

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

/// A multi-turn chat whose rendered prompt is about `target` tokens.
fn chat_of(registry: &TokenizerRegistry, target: usize) -> (ChatRequest, usize) {
    let mut turns = 1;
    loop {
        let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant."})];
        for t in 0..turns {
            let text: String =
                (0..8).map(|i| format!("[{t}.{i}] {}\n", PARAGRAPHS[(t + i) % PARAGRAPHS.len()])).collect();
            messages.push(json!({"role": "user", "content": text}));
            messages.push(json!({"role": "assistant", "content": format!("Noted part {t}.")}));
        }
        messages.push(json!({"role": "user", "content": "Summarise all parts."}));
        let mut request = ChatRequest::from_messages(messages);
        request.add_generation_prompt = true;
        let n = registry.render_chat("deepseek", &request).expect("render").len();
        if n >= target {
            return (request, n);
        }
        turns += 1;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let Some(fixtures) = std::env::var_os("KVINDEX_FIXTURES") else {
        eprintln!("KVINDEX_FIXTURES is not set: run tokenizer-svc/tests/fixtures/fetch.sh first");
        return;
    };
    let rss_before = rss_kib("VmRSS:");
    let mut config = RegistryConfig::default();
    config.add_model("deepseek", std::path::Path::new(&fixtures).join("models/deepseek")).expect("deepseek model");
    let registry = Arc::new(TokenizerRegistry::new(config));
    let load_started = Instant::now();
    registry.initialize("deepseek").expect("load");
    let load_time = load_started.elapsed();
    let rss_loaded = rss_kib("VmRSS:");

    let (request, tokens) = chat_of(&registry, 8192);
    let text = registry.render_chat_text("deepseek", &request).unwrap();
    for _ in 0..20 {
        registry.render_chat("deepseek", &request).unwrap();
    }

    let iterations = 300;
    let mut render_and_tokenize = Vec::with_capacity(iterations);
    let mut render_only = Vec::with_capacity(iterations);
    let mut tokenize_only = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        std::hint::black_box(registry.render_chat("deepseek", &request).unwrap());
        render_and_tokenize.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(registry.render_chat_text("deepseek", &request).unwrap());
        render_only.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(registry.tokenize("deepseek", &text, false).unwrap());
        tokenize_only.push(t.elapsed());
    }
    for v in [&mut render_and_tokenize, &mut render_only, &mut tokenize_only] {
        v.sort();
    }

    // One worker per core by default; BENCH_WORKERS overrides (e.g. 1 to see scaling).
    let workers = std::env::var("BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Duration::from_secs(10);
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (registry, request, done, stop) = (registry.clone(), request.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(registry.render_chat("deepseek", &request).unwrap());
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(window);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let completed = done.load(Ordering::Relaxed) as f64;

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("model: deepseek (129k vocab), tokenizer load {:.0} ms", ms(load_time));
    println!("chat: {} messages, {} prompt tokens, {} chars", request.messages.len(), tokens, text.chars().count());
    println!(
        "render+tokenize: p50 {:.2} ms  p99 {:.2} ms  ({} iterations, 1 thread)",
        ms(percentile(&render_and_tokenize, 0.5)),
        ms(percentile(&render_and_tokenize, 0.99)),
        iterations
    );
    println!(
        "render only:     p50 {:.2} ms  p99 {:.2} ms",
        ms(percentile(&render_only, 0.5)),
        ms(percentile(&render_only, 0.99))
    );
    println!(
        "tokenize only:   p50 {:.2} ms  p99 {:.2} ms",
        ms(percentile(&tokenize_only, 0.5)),
        ms(percentile(&tokenize_only, 0.99))
    );
    println!(
        "throughput: {:.1} chats/s = {:.0} tokens/s with {} worker threads over {:.0} s",
        completed / elapsed,
        completed * tokens as f64 / elapsed,
        workers,
        elapsed
    );
    println!(
        "RSS: {:.1} MiB before load, {:.1} MiB with the tokenizer loaded, {:.1} MiB peak (VmHWM) after the run",
        rss_before as f64 / 1024.0,
        rss_loaded as f64 / 1024.0,
        rss_kib("VmHWM:") as f64 / 1024.0
    );
}
