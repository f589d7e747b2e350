//! The router's indexer client over TLS and mTLS (`--indexer-tls-*`), against a real
//! `kvindex serve` that requires client certificates (`--tls-client-ca`), with certificates
//! made at test time: with its certificate the router's requests are scored; without one the
//! indexer refuses the handshake and the router fails open (placed by load, still answered).

use std::path::PathBuf;

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;

/// `ca.pem`, `server.{pem,key}` (localhost, 127.0.0.1), `client.{pem,key}` in a fresh dir.
fn pki() -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("kvindex-router-tls-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "kvindex test CA");
    std::fs::write(dir.join("ca.pem"), ca_params.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    for (name, sans) in [("server", vec!["localhost", "127.0.0.1"]), ("client", vec!["router.kvindex.test"])] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans.into_iter().map(String::from).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        std::fs::write(dir.join(format!("{name}.pem")), params.signed_by(&key, &issuer).unwrap().pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    dir
}

/// The score stage's outcome for one token-id prompt, as `/route` explains it.
async fn score_outcome(router: &str) -> String {
    let prompt = json!({"model": "m", "prompt": (0..48).collect::<Vec<u32>>(), "max_tokens": 2});
    let explained = post(router, "/route/v1/completions", &prompt).await;
    assert_eq!(explained.status, 200, "{:?}", explained.body);
    let decision = explained.json();
    match decision["score"]["outcome"].as_str() {
        Some("scored") => "scored".to_string(),
        _ => decision["score"]["reason"].as_str().unwrap_or("?").to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_scores_over_mtls_and_fails_open_without_a_certificate() {
    let bins = bins();
    let dir = pki();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let mut kv = Serve::new(&bins.kvindex)
        .loopback()
        .args(["--block-size", "16"])
        .args(["--tls-cert", &path("server.pem"), "--tls-key", &path("server.key")])
        .args(["--tls-client-ca", &path("ca.pem")])
        .start()
        .unwrap();
    let grpc = kv.grpc.clone();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let base =
        ["--indexer", &grpc, "--pod", &pod.spec(), "--model", "m", "--score-deadline-ms", "2000"].map(String::from);
    let tls = ["--indexer-tls-ca", &path("ca.pem"), "--indexer-tls-domain", "localhost"].map(String::from);
    let identity =
        ["--indexer-tls-cert", &path("client.pem"), "--indexer-tls-key", &path("client.key")].map(String::from);

    let with_cert = router(&bins, &[&base[..], &tls[..], &identity[..]].concat());
    wait_for("a score over mTLS", DEADLINE, || {
        let router = with_cert.http.clone();
        async move { (score_outcome(&router).await == "scored").then_some(()) }
    })
    .await;

    let without_cert = router(&bins, &[&base[..], &tls[..]].concat());
    for _ in 0..3 {
        assert_ne!(score_outcome(&without_cert.http).await, "scored", "no client certificate, no score");
    }
    let reply = post(&without_cert.http, "/v1/completions", &json!({"model": "m", "prompt": [1, 2, 3]})).await;
    assert_eq!(reply.status, 200, "fails open: {:?}", reply.body);
    assert_eq!(score_outcome(&with_cert.http).await, "scored");
    kv.process.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
