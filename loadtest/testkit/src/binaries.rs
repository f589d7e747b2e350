//! The workspace's binaries for tests and benches that run the real processes: found in the
//! target directory (or named by an environment variable), and built on demand when a crate's
//! tests run alone (`cargo test -p kvindex-router` does not build `kvindex` or `kvindex-sim`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `name` from the target directory: `$<env_var>`, else beside the running executable's
/// profile directory (`target/<profile>/deps/<test>` → `target/<profile>/<name>`), else
/// `$CARGO_TARGET_DIR/debug/<name>`. `None` (with the places looked at) when absent.
pub fn workspace_binary(name: &str, env_var: &str) -> Result<PathBuf, String> {
    let candidates = [
        std::env::var_os(env_var).map(PathBuf::from),
        std::env::current_exe().ok().and_then(|exe| {
            let dir = exe.parent()?;
            let dir = if dir.ends_with("deps") { dir.parent()? } else { dir };
            Some(dir.join(name))
        }),
        std::env::var_os("CARGO_TARGET_DIR").map(|dir| PathBuf::from(dir).join("debug").join(name)),
    ];
    candidates.iter().flatten().find(|path| path.is_file()).cloned().ok_or_else(|| {
        format!(
            "no {name} binary among {:?} (build the workspace, or set {env_var})",
            candidates.iter().flatten().collect::<Vec<_>>()
        )
    })
}

/// The package that builds each workspace binary a test may need.
const PACKAGE_OF: &[(&str, &str)] = &[
    ("kvindex", "kvindex-server"),
    ("kvindex-sim", "kvindex-loadtest"),
    ("kvindex-policies", "kvindex-loadtest"),
    ("kvindex-router", "kvindex-router"),
    ("kvindex-tokenizer", "kvindex-tokenizer"),
];

/// For tests: the binary, built on demand when it is not there yet (a crate's tests run alone,
/// `cargo test -p kvindex-router`, do not build the other crates' binaries). Panics with the
/// places looked at and the build's error when it can be neither found nor built: a test that
/// needs a binary fails loudly rather than skipping.
pub fn required_binary(name: &str, env_var: &str) -> PathBuf {
    match workspace_binary(name, env_var) {
        Ok(path) => path,
        Err(missing) => match build_binary(name) {
            Ok(path) => path,
            Err(build) => panic!("{missing}; building it failed: {build}"),
        },
    }
}

/// `cargo build --bin <name>` into the target and profile directory the running test lives in.
fn build_binary(name: &str) -> Result<PathBuf, String> {
    let package = PACKAGE_OF
        .iter()
        .find(|(bin, _)| *bin == name)
        .map(|(_, package)| *package)
        .ok_or_else(|| format!("{name} is not a workspace binary this helper knows how to build"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let profile_dir = exe.parent().map(|d| if d.ends_with("deps") { d.parent().unwrap_or(d) } else { d });
    let profile_dir = profile_dir.ok_or("the test executable has no directory")?;
    let target_dir = profile_dir.parent().ok_or("the profile directory has no parent")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => return Err("the profile directory has no name".into()),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building {name} (package {package}, profile {profile}) for this test");
    let status = Command::new(cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package, "--bin", name, "--profile", &profile])
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    let path = profile_dir.join(name);
    match (status.success(), path.is_file()) {
        (true, true) => Ok(path),
        (true, false) => Err(format!("cargo built {name} but {} is not there", path.display())),
        (false, _) => Err(format!("cargo build -p {package} --bin {name} exited with {status}")),
    }
}
