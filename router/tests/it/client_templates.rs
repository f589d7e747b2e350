//! Chat templates sent with requests through the router's OpenAI front: refused by
//! default (400, counted, nothing forwarded) whoever would tokenize them; with
//! `--allow-client-chat-template`, rendered in a bounded child process of the router, so each
//! bomb is a 400 within its budget while the router's memory stays flat, a real template still
//! places the request, and SIGTERM stops the router in the middle of a render. Also: an
//! unknown model's name is echoed bounded and escaped.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use kvindex_testkit::procfs::{children_of, peak_rss_bytes, started_at};
use serde_json::{json, Value};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn chat(template: Option<&str>) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Hello there"}]});
    if let Some(template) = template {
        body["chat_template"] = json!(template);
    }
    body
}

fn error_of(reply: &Reply) -> (String, Value) {
    let body = reply.json();
    (body["error"]["message"].as_str().unwrap_or_default().to_string(), body["error"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_templates_are_refused_by_default_and_model_names_are_echoed_bounded() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = router(&bins, &["--pod", &pod.spec(), "--model", "m"].map(String::from));
    let addr = router.http.clone();

    let refused = post(&addr, "/v1/chat/completions", &chat(Some("{{ 'x'*100000000 }}"))).await;
    assert_eq!(refused.status, 400, "{}", String::from_utf8_lossy(&refused.body));
    let (message, error) = error_of(&refused);
    assert_eq!(error["code"], "client_chat_template_disabled");
    assert_eq!(error["param"], "chat_template");
    assert!(message.contains("--allow-client-chat-template"), "{message}");
    assert!(pod.posts().is_empty(), "a refused request is not forwarded");
    let explained = post(&addr, "/route/v1/chat/completions", &chat(Some("{{ 'hi' }}"))).await;
    assert_eq!(explained.status, 400, "the explain endpoint refuses too");
    assert_eq!(post(&addr, "/v1/chat/completions", &chat(None)).await.status, 200, "a chat without one is served");
    assert_eq!(
        metric(&addr, "kvindex_router_request_errors_total", &["reason=\"client_chat_template_disabled\""]).await,
        2.0
    );

    let long = "m".repeat(1 << 20);
    let unknown = post(&addr, "/v1/completions", &json!({"model": long, "prompt": [1, 2]})).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.len() < 1024, "a 1 MiB model name came back in a {}-byte body", unknown.body.len());
    let (message, _) = error_of(&unknown);
    assert!(message.contains(&"m".repeat(200)) && message.contains("(1048576 bytes)"), "{message}");
    let forged = post(&addr, "/v1/completions", &json!({"model": "x\nERROR forged\u{1b}[2J", "prompt": [1]})).await;
    let (message, _) = error_of(&forged);
    assert!(message.contains("x\\nERROR forged\\u{1b}[2J") && !message.contains('\n'), "{message:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_client_templates_render_within_their_budget_and_sigterm_still_stops_the_router() {
    let bins = bins();
    let Some(deepseek) = deepseek_dir() else { return };
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let base = ["--pod".to_string(), pod.spec(), "--tokenizer".into(), format!("m={}", deepseek.display())];
    let budgets = [
        "--allow-client-chat-template",
        "--client-chat-template-timeout-ms",
        "2000",
        "--client-chat-template-max-output-bytes",
        "1048576",
        "--client-chat-template-memory-mib",
        "64",
    ];
    let mut args = base.to_vec();
    args.extend(budgets.map(String::from));
    let router = router(&bins, &args);
    let addr = router.http.clone();

    let own = post(&addr, "/route/v1/chat/completions", &chat(None)).await.json();
    let theirs = post(&addr, "/route/v1/chat/completions", &chat(Some(CHATML))).await.json();
    assert!(theirs["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{theirs}");
    assert_ne!(theirs["prompt_tokens"], own["prompt_tokens"], "their template, not the model's, was rendered");
    assert_eq!(post(&addr, "/v1/chat/completions", &chat(Some(CHATML))).await.status, 200);
    let peak_before = peak_rss_bytes(router.process.pid());

    let bombs = [
        ("{{ 'x'*100000000 }}", "more than 64 MiB"),
        ("{{ 'x'*10000000 }}", "larger than 1048576 bytes"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "m/request"),
        ("{% for i in range(100000000000) %}x{% endfor %}", "range has too many elements"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
            "more than 64 MiB",
        ),
        ("{{ -1 in (range(100000)|list)*100000 }}", "longer than 2000 ms"),
    ];
    for (template, expected) in bombs {
        let started = Instant::now();
        let reply = post(&addr, "/v1/chat/completions", &chat(Some(template))).await;
        assert_eq!(reply.status, 400, "{template}: {}", String::from_utf8_lossy(&reply.body));
        let (message, _) = error_of(&reply);
        assert!(message.contains(expected), "{template}: {message}");
        assert!(started.elapsed() < Duration::from_secs(5), "{template} took {:?}", started.elapsed());
    }
    let grown = peak_rss_bytes(router.process.pid()).saturating_sub(peak_before);
    assert!(grown < 32 << 20, "the router's peak memory grew by {} MiB", grown >> 20);
    for (reason, n) in [("output_limit", 1.0), ("time_limit", 2.0), ("memory_limit", 2.0)] {
        let label = format!("reason=\"{reason}\"");
        assert_eq!(metric(&addr, "kvindex_tokenizer_client_template_rejected_total", &[&label]).await, n, "{reason}");
    }
    assert_eq!(pod.posts().len(), 1, "only the good chat was forwarded");

    // A render that would run for a minute: SIGTERM must end it, and the router, in time.
    let mut args = base.to_vec();
    args.extend(["--allow-client-chat-template", "--client-chat-template-timeout-ms", "60000"].map(String::from));
    let mut slow = support::router(&bins, &args);
    let slow_addr = slow.http.clone();
    // Serving means the start-up check's render process is gone: the next child is ours.
    assert_eq!(get(&slow_addr, "/healthz").await.status, 200);
    let call = tokio::spawn(async move {
        post(&slow_addr, "/v1/chat/completions", &chat(Some("{{ -1 in (range(100000)|list)*100000 }}"))).await
    });
    let pid = slow.process.pid();
    let deadline = Instant::now() + DEADLINE;
    let (worker, born) = loop {
        if let Some((&worker, Some(born))) = children_of(pid).first().map(|w| (w, started_at(*w))) {
            break (worker, born);
        }
        assert!(Instant::now() < deadline, "no render process started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let sent = Instant::now();
    slow.process.signal("TERM").unwrap();
    let exit = loop {
        if let Some(exit) = slow.process.try_wait() {
            break exit;
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "still running 10 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(exit.success(), "{exit:?}");
    assert_ne!(started_at(worker), Some(born), "the render process {worker} outlived the router");
    call.abort();
}
