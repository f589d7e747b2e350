//! The admin token in the kustomize overlays: they ship a placeholder Secret (kustomize cannot
//! make a random one, as the chart does), which both binaries must refuse by name rather than
//! run with a token everyone can read; and the replacement deploy/README.md gives ("The admin
//! token") must take its place in a render. That every layout wires the token at all is
//! validate.py's `--require-admin-token`, run on every overlay (manifests.rs) and chart render.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvindex_deploy_tests::tools::{bin_dir, kubectl, python, repo_root, run_ok};

/// `kubectl kustomize <dir>`, as text.
fn kustomize(dir: &Path) -> String {
    String::from_utf8(run_ok(Command::new(kubectl()).arg("kustomize").arg(dir)).stdout).expect("utf-8")
}

/// The `token:` value of the rendered Secret kvindex-admin-token (stringData or base64 data).
fn rendered_token(yaml: &str) -> String {
    let script = "import base64, sys, yaml\n\
                  s = next(d for d in yaml.safe_load_all(sys.stdin) if d and d['kind'] == 'Secret'\n\
                           and d['metadata']['name'] == 'kvindex-admin-token')\n\
                  print((s.get('stringData') or {}).get('token') or base64.b64decode(s['data']['token']).decode())";
    let out = kvindex_testkit::run::output_ok_with_stdin(
        Command::new(python()).args(["-c", script]),
        yaml.as_bytes(),
        "the rendered admin-token Secret",
    );
    String::from_utf8(out.stdout).expect("utf-8").trim().to_string()
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvindex-deploy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `command` until it exits (it must, within a generous deadline) and returns its stderr.
fn refused(mut command: Command) -> String {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{command:?} started with the placeholder token instead of refusing it");
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{command:?} exited 0 with the placeholder token");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn both_binaries_refuse_the_shipped_placeholder_by_name() {
    let token = rendered_token(&kustomize(&repo_root().join("deploy/kustomize/admin-token")));
    let dir = scratch_dir("placeholder");
    let file = dir.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let bins = bin_dir();

    let mut indexer = Command::new(bins.join("kvindex"));
    indexer.args(["serve", "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--admin-token-file"]).arg(&file);
    let mut router = Command::new(bins.join("kvindex-router"));
    router
        .args(["serve", "--http-addr=127.0.0.1:0", "--pod=a=http://127.0.0.1:9", "--indexer-admin-token-file"])
        .arg(&file);
    for (who, command) in [("kvindex serve", indexer), ("kvindex-router", router)] {
        let said = refused(command);
        assert!(
            said.contains("placeholder") && said.contains("Secret kvindex-admin-token") && !said.contains(&token),
            "{who} must refuse the placeholder by name, without printing it: {said}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_documented_replacement_takes_the_placeholders_place() {
    // deploy/README.md, "The admin token": an overlay of the operator's own, over ours.
    let dir = scratch_dir("replacement");
    let mine = "0pD9x2Lr7WqK4vNc8sTj3hYb6mFz1aGe";
    std::fs::write(dir.join("admin-token"), mine).unwrap();
    // kustomize takes relative paths only: up to / and down to the layout.
    let layout = repo_root().join("deploy/kustomize/overlays/standalone");
    let up = "../".repeat(dir.components().count() - 1);
    let layout = format!("{up}{}", layout.strip_prefix("/").unwrap().display());
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "resources:\n- {layout}\nsecretGenerator:\n- name: kvindex-admin-token\n  behavior: replace\n  files:\n  \
             - token=admin-token\ngeneratorOptions:\n  disableNameSuffixHash: true\n"
        ),
    )
    .unwrap();
    let yaml = kustomize(&dir);
    assert_eq!(rendered_token(&yaml), mine, "the operator's token replaced the placeholder");
    assert!(!yaml.contains("REPLACE-ME"), "the placeholder is gone from the render");
    kvindex_testkit::run::output_ok_with_stdin(
        Command::new(python()).arg(repo_root().join("deploy/tests/validate.py")).args(["--require-admin-token", "-"]),
        yaml.as_bytes(),
        "the operator's overlay",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
