//! Chat templates sent with requests (`chat_template` in an OpenAI body or in llm-d's
//! `RenderChatCompletion`) are programs written by whoever sends the request. minijinja's fuel
//! counts instructions, not bytes, and not the work inside one filter call: a 50-byte
//! `{{ 'x'*100000000 }}` allocates 100 MB in one instruction (and gigabytes once tokenized), a
//! string doubled forty times needs forty, and `(range(100000)*100000)|join` loops 10^10 times
//! inside a single filter. Nothing in process can stop those without stopping the process.
//!
//! So this module decides what happens to them:
//!
//! * [`ClientTemplates::Refused`] (the default): the request fails with
//!   [`Rejection::Disabled`] (gRPC `INVALID_ARGUMENT`, HTTP 400 at the router), counted.
//! * [`ClientTemplates::Sandboxed`]: each render runs in a short-lived child process (this same
//!   executable, started with [`WORKER_ARG`]) that the kernel bounds: `RLIMIT_DATA` (memory),
//!   `RLIMIT_CPU`, no core files, killed with its parent (`PR_SET_PDEATHSIG`). The parent reads
//!   its answer only up to the output budget, kills it at the wall-clock deadline, and kills
//!   every running one when the server shuts down ([`Sandbox::shutdown`]). The child renders
//!   with [`CLIENT_TEMPLATE_FUEL`] into a buffer that refuses to pass the output budget. At
//!   most `concurrency` children run at once; a request that finds none free within its
//!   deadline is `busy`.
//! * [`ClientTemplates::Trusted`]: rendered in process like the model's own templates, for
//!   library callers whose templates are their own (test sweeps, offline tools); never for
//!   templates from the network.
//!
//! The model's own templates (its directory's `tokenizer_config.json` / `chat_template.jinja`)
//! never come here: they render in process exactly as before. Every rejection is counted in
//! `kvindex_tokenizer_client_template_rejected_total{reason}`.
//!
//! Linux only (`prctl`, `RLIMIT_DATA` counting anonymous mappings, kernel 4.7+).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use minijinja::value::Value;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::{Result, TokenizerError};
pub use crate::rejection::Rejection;
use crate::template_env::{BoundedRenderError, ChatTemplate, CLIENT_TEMPLATE_FUEL};

/// The first argument that turns an executable into a template worker (see
/// [`run_worker_if_requested`]). Not a user-facing subcommand.
pub const WORKER_ARG: &str = "__kvindex-render-chat-template";

/// Counter of client templates not rendered, by `reason` ([`Rejection::label`]).
pub const REJECTED_METRIC: &str = "kvindex_tokenizer_client_template_rejected_total";

/// The sandbox's metrics, for the services that run it (the tokenizer and the router describe
/// them; docs/METRICS.md is held to this table).
pub const METRICS: &[kvindex_metric_defs::Metric] = &[kvindex_metric_defs::Metric {
    name: REJECTED_METRIC,
    kind: kvindex_metric_defs::Kind::Counter,
    labels: &["reason"],
    unit: None,
    help: "Client chat templates not rendered, by reason",
}];

/// Default wall-clock budget of one client template render (spawn included).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default budget for the rendered prompt, in bytes (the router's default body limit).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 << 20;
/// Default memory (`RLIMIT_DATA`) of one render process: room for a 16 MiB conversation
/// decoded twice (JSON and template values) and its output.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
/// Default number of render processes at once (so at most 4 × 512 MiB).
pub const DEFAULT_CONCURRENCY: usize = 4;

/// Room in the worker's answer beyond the rendered text (its status line).
const HEADER_ROOM: usize = 64 << 10;

/// Builds the rejection error and counts it.
pub(crate) fn reject(template: &str, reason: Rejection, detail: impl Into<String>) -> TokenizerError {
    metrics::counter!(REJECTED_METRIC, "reason" => reason.label()).increment(1);
    TokenizerError::ClientTemplateRejected { template: template.to_string(), reason, detail: detail.into() }
}

/// The refusal when client templates are off.
pub(crate) fn disabled(template: &str) -> TokenizerError {
    reject(
        template,
        Rejection::Disabled,
        "chat_template in requests is not accepted by this server, which renders only the model's own \
         chat template (operators can allow client templates with --allow-client-chat-template)",
    )
}

/// What happens to a chat template that comes with a request.
#[derive(Debug, Clone, Default)]
pub enum ClientTemplates {
    /// Refused with [`Rejection::Disabled`] (the default).
    #[default]
    Refused,
    /// Rendered in a bounded child process.
    Sandboxed(Arc<Sandbox>),
    /// Rendered in process, unbounded: only for templates the library caller itself trusts.
    Trusted,
}

/// The budgets of one sandboxed render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall clock from the request to the answer: waiting for a slot, starting the process,
    /// rendering. The process is killed when it runs out.
    pub timeout: Duration,
    /// Largest rendered prompt, in bytes.
    pub max_output_bytes: usize,
    /// The render process's `RLIMIT_DATA` (heap and other private mappings), in bytes.
    pub memory_bytes: u64,
    /// Render processes at once.
    pub concurrency: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            concurrency: DEFAULT_CONCURRENCY,
        }
    }
}

impl SandboxLimits {
    /// Every budget must allow something.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|(flag, message)| TokenizerError::Config(format!("{flag}: {message}")))
    }

    /// The first budget that allows nothing, as (the flag that sets it, why).
    fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.timeout.is_zero() {
            return Err(("--client-chat-template-timeout-ms", "must be at least 1"));
        }
        if self.max_output_bytes == 0 {
            return Err(("--client-chat-template-max-output-bytes", "must be at least 1"));
        }
        if self.memory_bytes < 16 << 20 {
            return Err(("--client-chat-template-memory-mib", "must be at least 16"));
        }
        if self.concurrency == 0 {
            return Err(("--client-chat-template-concurrency", "must be at least 1"));
        }
        Ok(())
    }
}

/// The client-template flags of `kvindex-tokenizer serve` and `kvindex-router serve`, one
/// declaration flattened into both.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientTemplateArgs {
    /// Accept `chat_template` in requests, rendered in a bounded child process within the
    /// --client-chat-template-* budgets. Off: such requests are refused (gRPC
    /// INVALID_ARGUMENT, HTTP 400).
    #[arg(long)]
    pub allow_client_chat_template: bool,
    /// Wall-clock budget of one client template render.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT.as_millis() as u64, value_name = "MS")]
    pub client_chat_template_timeout_ms: u64,
    /// Largest prompt a client template may render, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTPUT_BYTES, value_name = "BYTES")]
    pub client_chat_template_max_output_bytes: usize,
    /// Memory (RLIMIT_DATA) of one client template render process, in MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BYTES >> 20, value_name = "MIB")]
    pub client_chat_template_memory_mib: u64,
    /// Client template render processes at once.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_name = "N")]
    pub client_chat_template_concurrency: usize,
}

impl ClientTemplateArgs {
    /// The validated budgets when client templates are allowed, `None` when they are refused;
    /// a budget that allows nothing is `Err((its flag, why))`.
    pub fn limits(&self) -> Result<Option<SandboxLimits>, (&'static str, &'static str)> {
        let limits = SandboxLimits {
            timeout: Duration::from_millis(self.client_chat_template_timeout_ms),
            max_output_bytes: self.client_chat_template_max_output_bytes,
            memory_bytes: self.client_chat_template_memory_mib.saturating_mul(1 << 20),
            concurrency: self.client_chat_template_concurrency,
        };
        limits.check()?;
        Ok(self.allow_client_chat_template.then_some(limits))
    }
}

/// Renders client templates in child processes; share it as `Arc<Sandbox>`.
pub struct Sandbox {
    program: PathBuf,
    limits: SandboxLimits,
    /// Render processes running (≤ `limits.concurrency`).
    busy: Mutex<usize>,
    freed: Condvar,
    /// Running render processes, so [`Sandbox::shutdown`] can kill them.
    live: Mutex<Vec<(u64, Arc<Mutex<Child>>)>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("program", &self.program).field("limits", &self.limits).finish()
    }
}

/// What the parent sends the worker on its stdin (MessagePack: floats cross unchanged).
#[derive(Serialize, Deserialize)]
struct Job {
    name: String,
    source: String,
    context: Map<String, Json>,
    max_output_bytes: usize,
    fuel: u64,
}

/// Frees a render slot when dropped.
struct Slot<'a>(&'a Sandbox);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock() -= 1;
        self.0.freed.notify_one();
    }
}

impl Sandbox {
    /// A sandbox whose render processes are `program WORKER_ARG ...`; `program`'s `main` must
    /// start with [`run_worker_if_requested`] (both `kvindex-tokenizer` and `kvindex-router` do).
    pub fn new(program: impl Into<PathBuf>, limits: SandboxLimits) -> Result<Arc<Sandbox>> {
        limits.validate()?;
        Ok(Arc::new(Sandbox {
            program: program.into(),
            limits,
            busy: Mutex::new(0),
            freed: Condvar::new(),
            live: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }))
    }

    /// A sandbox running the current executable as its worker.
    pub fn for_current_exe(limits: SandboxLimits) -> Result<Arc<Sandbox>> {
        let exe = std::env::current_exe().map_err(|e| {
            TokenizerError::Config(format!("cannot find this executable to render client templates: {e}"))
        })?;
        Self::new(exe, limits)
    }

    pub fn limits(&self) -> SandboxLimits {
        self.limits
    }

    /// Renders a trivial template through a worker, so a broken set-up fails at start-up
    /// rather than on the first request.
    pub fn check(&self) -> Result<()> {
        match self.render("startup-check", "{{ 'ok' }}", &Map::new()) {
            Ok(text) if text == "ok" => Ok(()),
            Ok(text) => Err(TokenizerError::Config(format!("the template worker answered {text:?} instead of \"ok\""))),
            Err(e) => Err(TokenizerError::Config(format!("the template worker does not work: {e}"))),
        }
    }

    /// Refuses new renders and kills the running ones (they fail with
    /// [`Rejection::ShuttingDown`]), so a shutdown never waits for a hostile template.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.freed.notify_all();
        for (_, child) in self.live.lock().iter() {
            let _ = child.lock().kill();
        }
    }

    fn acquire(&self, template: &str, deadline: Instant) -> Result<Slot<'_>> {
        let mut busy = self.busy.lock();
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(reject(template, Rejection::ShuttingDown, "the server is shutting down"));
            }
            if *busy < self.limits.concurrency {
                *busy += 1;
                return Ok(Slot(self));
            }
            if self.freed.wait_until(&mut busy, deadline).timed_out() {
                return Err(reject(
                    template,
                    Rejection::Busy,
                    format!("all {} client template renderers stayed busy", self.limits.concurrency),
                ));
            }
        }
    }

    /// Renders `source` with `context` as its globals in a worker process, within the limits.
    /// `template` names it in errors (e.g. `Qwen3-8B/request`).
    pub fn render(&self, template: &str, source: &str, context: &Map<String, Json>) -> Result<String> {
        let limits = self.limits;
        let deadline = Instant::now() + limits.timeout;
        let _slot = self.acquire(template, deadline)?;
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(error = %e, "{what}");
            reject(template, Rejection::Unavailable, format!("{what}: {e}"))
        };
        let job = Job {
            name: template.to_string(),
            source: source.to_string(),
            context: context.clone(),
            max_output_bytes: limits.max_output_bytes,
            fuel: CLIENT_TEMPLATE_FUEL,
        };
        let input = rmp_serde::to_vec_named(&job).map_err(|e| unavailable("cannot encode the render job", &e))?;
        // RLIMIT_CPU is whole seconds: a backstop behind the deadline, which kills first.
        let cpu_seconds = limits.timeout.as_secs() + 2;
        let mut child = Command::new(&self.program)
            .arg(WORKER_ARG)
            .arg(limits.memory_bytes.to_string())
            .arg(cpu_seconds.to_string())
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| unavailable("cannot start the template worker", &e))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(reject(template, Rejection::Unavailable, "the template worker has no pipes"));
        };
        let child = Arc::new(Mutex::new(child));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.live.lock().push((id, child.clone()));
        if self.closed.load(Ordering::SeqCst) {
            let _ = child.lock().kill(); // shutdown() may have walked `live` before the push
        }

        // The worker reads its whole job before it writes anything, so one thread can write
        // the job and then read the answer (at most the budget and one byte more).
        let cap = limits.max_output_bytes + HEADER_ROOM;
        let (tx, rx) = mpsc::channel();
        let io = std::thread::Builder::new().name("kvtok-template-io".into()).spawn(move || {
            let _ = stdin.write_all(&input);
            drop(stdin);
            let mut answer = Vec::new();
            let read = stdout.take(cap as u64 + 1).read_to_end(&mut answer);
            let _ = tx.send(read.map(|_| answer));
        });
        let answer = match io {
            Ok(_) => rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the template I/O thread");
                None
            }
        };
        let timed_out = answer.is_none();
        let over_budget = answer.as_ref().is_some_and(|a| a.as_ref().is_ok_and(|a| a.len() > cap));
        let status = {
            let mut child = child.lock();
            if timed_out || over_budget {
                let _ = child.kill();
            }
            child.wait()
        };
        self.live.lock().retain(|(live, _)| *live != id);
        let status = status.map_err(|e| unavailable("cannot wait for the template worker", &e))?;

        let time = || {
            reject(
                template,
                Rejection::TimeLimit,
                format!("rendering took longer than {} ms", limits.timeout.as_millis()),
            )
        };
        let output = || {
            reject(
                template,
                Rejection::OutputLimit,
                format!("the rendered prompt is larger than {} bytes", limits.max_output_bytes),
            )
        };
        if status.success() {
            if over_budget {
                return Err(output());
            }
            return match answer {
                Some(Ok(answer)) => parse_answer(template, &answer, &limits),
                Some(Err(e)) => Err(unavailable("cannot read the template worker's answer", &e)),
                None => Err(time()),
            };
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(reject(template, Rejection::ShuttingDown, "the server is shutting down"));
        }
        if timed_out {
            return Err(time());
        }
        if over_budget {
            return Err(output());
        }
        Err(match status.signal() {
            Some(libc::SIGXCPU) | Some(libc::SIGKILL) => {
                reject(template, Rejection::TimeLimit, format!("rendering used more than {cpu_seconds} s of CPU"))
            }
            Some(libc::SIGABRT) => reject(
                template,
                Rejection::MemoryLimit,
                format!("rendering needed more than {} MiB of memory", limits.memory_bytes >> 20),
            ),
            Some(signal) => reject(template, Rejection::Crashed, format!("the renderer died (signal {signal})")),
            None => reject(template, Rejection::Crashed, format!("the renderer exited with {status}")),
        })
    }
}

/// The worker's answer: `ok\n<text>`, or `error\t<kind>\t<line>\n<reason>`.
fn parse_answer(template: &str, answer: &[u8], limits: &SandboxLimits) -> Result<String> {
    let newline = answer.iter().position(|&b| b == b'\n').unwrap_or(answer.len());
    let (head, body) = (&answer[..newline], answer.get(newline + 1..).unwrap_or_default());
    let head = std::str::from_utf8(head).unwrap_or_default();
    let body = String::from_utf8_lossy(body);
    let mut fields = head.split('\t');
    match (fields.next(), fields.next(), fields.next()) {
        (Some("ok"), None, None) => Ok(body.into_owned()),
        (Some("error"), Some("template"), Some(line)) => Err(TokenizerError::Template {
            template: template.to_string(),
            line: line.parse().ok(),
            reason: body.into_owned(),
        }),
        (Some("error"), Some("output"), _) => Err(reject(
            template,
            Rejection::OutputLimit,
            format!("the rendered prompt is larger than {} bytes", limits.max_output_bytes),
        )),
        (Some("error"), Some("fuel"), _) => Err(reject(
            template,
            Rejection::TimeLimit,
            format!("rendering ran out of its instruction budget ({CLIENT_TEMPLATE_FUEL} steps)"),
        )),
        _ => {
            tracing::warn!(head, "the template worker answered outside its protocol");
            Err(reject(template, Rejection::Unavailable, "the template worker answered outside its protocol"))
        }
    }
}

/// Call first thing in `main` of every executable a [`Sandbox`] may run: when the process was
/// started as a template worker it renders its one job and returns the exit code to return
/// from `main`; otherwise `None` and `main` goes on.
pub fn run_worker_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(WORKER_ARG)) {
        return None;
    }
    Some(worker(args.collect()))
}

fn worker(args: Vec<OsString>) -> ExitCode {
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.to_str()?.parse().ok()).collect();
    let [memory_bytes, cpu_seconds, parent] = numbers[..] else {
        eprintln!("{WORKER_ARG}: expected <memory-bytes> <cpu-seconds> <parent-pid>");
        return ExitCode::from(2);
    };
    // SAFETY: plain system calls on this process, before any thread is started.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if u64::try_from(libc::getppid()).ok() != Some(parent) {
            return ExitCode::from(3); // the parent is already gone
        }
        let limit = |resource, soft: u64, hard: u64| {
            let rlim = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
            libc::setrlimit(resource, &rlim) == 0
        };
        let limited = limit(libc::RLIMIT_CORE, 0, 0)
            && limit(libc::RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)
            && limit(libc::RLIMIT_DATA, memory_bytes, memory_bytes);
        if !limited {
            return ExitCode::from(4);
        }
    }
    let mut input = Vec::new();
    if std::io::stdin().lock().read_to_end(&mut input).is_err() {
        return ExitCode::from(5);
    }
    let answer = match rmp_serde::from_slice::<Job>(&input) {
        Ok(job) => {
            drop(input);
            render_job(job)
        }
        Err(_) => "error\tinput\t-\n".to_string(),
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(answer.as_bytes()).and_then(|_| out.flush()).is_err() {
        return ExitCode::from(6);
    }
    ExitCode::SUCCESS
}

fn render_job(job: Job) -> String {
    let rendered = ChatTemplate::compile_with_fuel(&job.name, &job.source, job.fuel)
        .map_err(BoundedRenderError::Template)
        .and_then(|template| template.render_bounded(Value::from_serialize(&job.context), job.max_output_bytes));
    match rendered {
        Ok(text) => format!("ok\n{text}"),
        Err(BoundedRenderError::OutputLimit) => "error\toutput\t-\n".to_string(),
        Err(BoundedRenderError::OutOfFuel) => "error\tfuel\t-\n".to_string(),
        Err(BoundedRenderError::Template(TokenizerError::Template { line, reason, .. })) => {
            format!("error\ttemplate\t{}\n{reason}", line.map(|l| l.to_string()).unwrap_or("-".into()))
        }
        Err(BoundedRenderError::Template(other)) => format!("error\ttemplate\t-\n{other}"),
    }
}
