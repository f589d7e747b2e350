//! Locating the real assets (PyPI fixtures, the Python oracle venv) shared by integration tests.
//! Missing assets fail the test under CI (`CI` set) and skip it with a note elsewhere.
#![allow(dead_code)]

pub mod trained;

use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crate lives in the workspace").to_path_buf()
}

fn missing(what: &str, hint: &str) -> Option<PathBuf> {
    kvindex_testkit::env::missing(&format!("{what} not found ({hint})"))
}

/// `$KVINDEX_FIXTURES`, else `<repo>/target/fixtures`, holding `models/deepseek/tokenizer.json`.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("KVINDEX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target").join("fixtures"));
    if dir.join("models/deepseek/tokenizer.json").is_file() {
        Some(dir)
    } else {
        missing("fixtures", "run tokenizer-svc/tests/fixtures/fetch.sh and set KVINDEX_FIXTURES")
    }
}

/// `$KVINDEX_PYTHON`, else `<repo>/.venv/bin/python`: a Python with transformers and grpcio.
pub fn python() -> Option<PathBuf> {
    let python =
        std::env::var_os("KVINDEX_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    if python.is_file() {
        Some(python)
    } else {
        missing("Python oracle venv", "see tokenizer-svc/CI.md and set KVINDEX_PYTHON")
    }
}

/// A fresh directory for one test's scratch files.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtok-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

pub fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

/// Runs a Python driver and panics with its stderr if it fails.
pub fn run_python(python: &Path, args: &[&str]) {
    let output = std::process::Command::new(python)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        output.status.success(),
        "{} {:?} failed:\n{}\n{}",
        python.display(),
        args,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[allow(unused_imports)] // not every test binary that includes this module starts a server
pub use kvindex_testkit::ports::free_port;

/// A process's peak resident memory (`VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid,
/// it names one process even when pids wrap around.
pub fn started_at(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Pids of the live children of `parent` (from /proc/<pid>/stat's ppid).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
            ppid == Some(parent) && state != Some("Z")
        })
        .collect()
}
