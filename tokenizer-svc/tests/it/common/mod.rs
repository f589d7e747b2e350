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

/// The fixtures' root (`$KVINDEX_FIXTURES`, else `<repo>/target/fixtures`) when it holds
/// `models/deepseek/tokenizer.json`.
pub fn fixtures() -> Option<PathBuf> {
    kvindex_testkit::env::fixture("models/deepseek/tokenizer.json")?;
    Some(kvindex_testkit::env::fixtures_root())
}

/// `$KVINDEX_PYTHON`, else `<repo>/.venv/bin/python`: a Python with transformers and grpcio.
pub fn python() -> Option<PathBuf> {
    let python =
        std::env::var_os("KVINDEX_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    if python.is_file() {
        Some(python)
    } else {
        missing("Python oracle venv", "run scripts/setup.sh (tokenizer-svc/README.md, Tests) and set KVINDEX_PYTHON")
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

/// Runs a Python driver and panics with its output if it fails.
pub fn run_python(python: &Path, args: &[&str]) {
    kvindex_testkit::run::output_ok(std::process::Command::new(python).args(args));
}

#[allow(unused_imports)] // not every test binary that includes this module starts a server
pub use kvindex_testkit::ports::free_port;

/// Peak memory, start time and children of other processes (the client-template sandbox).
#[allow(unused_imports)] // not every test binary that includes this module watches processes
pub use kvindex_testkit::procfs::{children_of, peak_rss_bytes, started_at};
