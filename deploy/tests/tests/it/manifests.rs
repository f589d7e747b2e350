//! The kustomize overlays and the Helm chart render, and every object they produce passes
//! deploy/tests/validate.py (Kubernetes' schemas via kubernetes-validate, the CRD schemas,
//! Envoy's protos and then Envoy itself (`envoy --mode validate`) for the gateway config,
//! selectors, engines and kvindex agreeing with each other, and every kvindex flag against the
//! binaries' `serve --help`; every indexer and router reading the admin token from a Secret of
//! the render, in the overlays as in the chart). The renderers are
//! the real ones: kubectl's built-in kustomize, and Helm's Go engine through helm-python-sdk
//! (deploy/tests/render_chart.py says why and its limits).

use std::process::Command;

use kvindex_deploy_tests::tools::{bin_dir, envoy, kubectl, python, repo_root, run_ok};

const OVERLAYS: [&str; 4] = ["endpoint-picker", "epp-sidecar", "standalone", "vllm"];

/// `kubectl kustomize <dir>` for each dir, validated together (so engines and kvindex are
/// checked against each other); returns the rendered YAML and validate.py's summary line.
fn render_and_validate(dirs: &[&str]) -> String {
    render_and_report(dirs).0
}

fn render_and_report(dirs: &[&str]) -> (String, String) {
    let root = repo_root();
    let mut yaml = String::new();
    for dir in dirs {
        let out = run_ok(Command::new(kubectl()).arg("kustomize").arg(root.join(dir)));
        yaml.push_str("---\n");
        yaml.push_str(&String::from_utf8(out.stdout).expect("utf-8"));
    }
    let dir = dirs.join(" + ");
    let res = kvindex_testkit::run::output_ok_with_stdin(
        Command::new(python())
            .arg(root.join("deploy/tests/validate.py"))
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--envoy")
            .arg(envoy())
            .arg("--require-admin-token")
            .arg("-"),
        yaml.as_bytes(),
        &format!("{dir}: validation"),
    );
    (yaml, String::from_utf8_lossy(&res.stdout).into_owned())
}

#[test]
fn every_overlay_is_tested() {
    let mut found: Vec<String> = std::fs::read_dir(repo_root().join("deploy/kustomize/overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, OVERLAYS, "an overlay was added or removed: update OVERLAYS and its test");
}

#[test]
fn base_renders_and_validates() {
    let y = render_and_validate(&["deploy/kustomize/base"]);
    assert!(y.contains("verbs:\n  - get\n  - list\n  - watch"), "discovery RBAC: {y}");
}

#[test]
fn standalone_renders_and_validates() {
    let y = render_and_validate(&["deploy/kustomize/overlays/standalone", "deploy/kustomize/overlays/vllm"]);
    for needed in [
        "kind: PodDisruptionBudget",
        "kind: NetworkPolicy",
        "path: /healthz",
        "path: /readyz",
        "- --discovery=kubernetes",
        "job_name: kvindex",
    ] {
        assert!(y.contains(needed), "standalone lacks {needed:?}");
    }
    assert!(!y.contains("--ext-proc-addr"), "the standalone router is a proxy, not a picker");
}

#[test]
fn endpoint_picker_renders_and_validates() {
    let (y, report) =
        render_and_report(&["deploy/kustomize/overlays/endpoint-picker", "deploy/kustomize/overlays/vllm"]);
    for needed in [
        "kind: InferencePool",
        "failureMode: FailOpen",
        "--ext-proc-mode=endpoint-picker",
        "name: envoy.load_balancing_policies.override_host",
        "request_body_mode: BUFFERED",
        "receiving_namespaces: {untyped: [\"envoy.lb\"]}",
        "local_reply_config:",
        "clusterIP: None",
        "appProtocol: kubernetes.io/h2c",
    ] {
        assert!(y.contains(needed), "endpoint-picker lacks {needed:?}");
    }
    assert!(report.contains(", 1 Envoy configs valid to Envoy"), "Envoy validated the bootstrap: {report}");
}

#[test]
fn epp_sidecar_renders_and_validates() {
    let (y, report) = render_and_report(&["deploy/kustomize/overlays/epp-sidecar"]);
    for needed in [
        "--ext-proc-mode=prefilter",
        "--zmq-bind=tcp://*:5557",
        "kind: EnvoyFilter",
        "kind: EnvoyExtensionPolicy",
        "- envoy.lb.subset_hint",
        "receiving_namespaces: {untyped: [\"envoy.lb.subset_hint\"]}",
        "forwarding_namespaces:\n                      untyped: [\"envoy.lb.subset_hint\"]",
        "value: tcp://kvindex-events:5557",
        "local_reply_config:",
    ] {
        assert!(y.contains(needed), "epp-sidecar lacks {needed:?}");
    }
    // The standalone bootstrap, and the EnvoyFilter's filters around a stand-in EPP filter.
    assert!(report.contains(", 2 Envoy configs valid to Envoy"), "Envoy validated both: {report}");
}

#[test]
fn vllm_snippet_has_the_exact_flags() {
    let y = render_and_validate(&["deploy/kustomize/overlays/vllm"]);
    for needed in [
        "- --enable-prefix-caching",
        "- --prefix-caching-hash-algo=sha256_cbor",
        "- --enable-prompt-tokens-details",
        "- --kv-events-config",
        r#""replay_endpoint":"tcp://*:5558""#,
        r#""topic":"kv@$(POD_IP):8000@Qwen/Qwen3-0.6B""#,
        "name: PYTHONHASHSEED",
    ] {
        assert!(y.contains(needed), "vllm lacks {needed:?}");
    }
}

#[test]
fn helm_chart_renders_and_validates_for_every_values_file() {
    let root = repo_root();
    let out = run_ok(
        Command::new(python())
            .arg(root.join("deploy/tests/render_chart.py"))
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--envoy")
            .arg(envoy()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let examples = std::fs::read_dir(root.join("deploy/helm/kvindex/examples")).unwrap().count();
    assert!(examples >= 4, "one example per layout expected");
    assert!(
        text.contains(&format!("{} value sets rendered and valid", examples + 4)),
        "not every values file was rendered:\n{text}"
    );
}

#[test]
fn the_validator_rejects_broken_objects() {
    let root = repo_root();
    run_ok(
        Command::new(python())
            .arg(root.join("deploy/tests/validate.py"))
            .arg("--self-test")
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--envoy")
            .arg(envoy()),
    );
}
