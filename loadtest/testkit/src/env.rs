//! What the tests need from the machine beyond the build: the test venv's Python (with the
//! independent peers: pyzmq, msgspec, grpcio, transformers, ...) and the fixtures
//! `scripts/setup.sh` installs (`source scripts/env.sh` exports both). A test whose
//! prerequisite is missing is skipped with a message on a developer's machine and fails under
//! `CI`, where `.ci/run` installs everything: CI never passes by skipping.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Whether this is a CI run (`CI` set), where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// A missing prerequisite: panics with `message` under CI, else prints `SKIPPED: message` and
/// gives `None` for the test to return on.
pub fn missing<T>(message: &str) -> Option<T> {
    assert!(!in_ci(), "{message}");
    eprintln!("SKIPPED: {message}");
    None
}

/// `$KVINDEX_PYTHON` when it imports every one of `modules`, else [`missing`].
pub fn python_with(modules: &[&str]) -> Option<PathBuf> {
    let python = std::env::var_os("KVINDEX_PYTHON").map(PathBuf::from);
    let usable = python.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", &format!("import {}", modules.join(", "))])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if usable {
        return python;
    }
    missing(&format!(
        "KVINDEX_PYTHON ({python:?}) cannot import {}: run `bash scripts/setup.sh` and `source scripts/env.sh`",
        modules.join(", ")
    ))
}

/// Where the fixtures live: `$KVINDEX_FIXTURES`, else the workspace's `target/fixtures` (the
/// default of `tokenizer-svc/tests/fixtures/fetch.sh`).
pub fn fixtures_root() -> PathBuf {
    std::env::var_os("KVINDEX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/fixtures")))
}

/// `<fixtures_root>/<relative>` when it exists (tokenizer files and the like), else [`missing`].
pub fn fixture(relative: &str) -> Option<PathBuf> {
    let path = fixtures_root().join(relative);
    if path.exists() {
        return Some(path);
    }
    missing(&format!(
        "no fixture {relative} under {}: run `bash scripts/setup.sh` and `source scripts/env.sh` (it sets \
         $KVINDEX_FIXTURES)",
        fixtures_root().display()
    ))
}

/// The DeepSeek tokenizer directory (129k vocabulary and chat template) `scripts/setup.sh`
/// lays out under `$KVINDEX_FIXTURES/models/deepseek`, else [`missing`].
pub fn deepseek_tokenizer() -> Option<PathBuf> {
    fixture("models/deepseek/tokenizer.json").and_then(|file| file.parent().map(PathBuf::from))
}
