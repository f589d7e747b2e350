//! TLS and mTLS on `kvindex serve`'s gRPC and HTTP listeners, against the real
//! binary with certificates made at test time (a CA, a server certificate for `localhost` /
//! 127.0.0.1, a client certificate that CA signed, and one from a foreign CA). The gRPC client
//! is grpcio, the HTTP client a plain rustls connection: a real handshake each time. Under mTLS
//! a client without a certificate, or with a foreign one, is refused and counted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const MODEL: &str = "m";

/// PEM files of one test: `ca.pem`, `server.{pem,key}`, `client.{pem,key}`, `rogue.{pem,key}`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("kvindex-tls-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Distinct names: a leaf named like its issuer looks self-signed to BoringSSL (grpcio).
        ca_params.distinguished_name.push(DnType::CommonName, "kvindex test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |name: &str, sans: Vec<String>, issuer: &Issuer<'_, KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(sans).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            let cert = params.signed_by(&key, issuer).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        };
        leaf("server", vec!["localhost".into(), "127.0.0.1".into()], &issuer);
        leaf("client", vec!["router.kvindex.test".into()], &issuer);
        let rogue_key = KeyPair::generate().unwrap();
        let mut rogue_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        rogue_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        rogue_params.distinguished_name.push(DnType::CommonName, "kvindex test CA");
        let rogue_issuer = Issuer::new(rogue_params, rogue_key);
        leaf("rogue", vec!["router.kvindex.test".into()], &rogue_issuer);
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path).unwrap().map(Result::unwrap).collect()
}

/// One HTTPS/1.1 GET over rustls trusting `ca`, presenting `client` (cert, key) if given:
/// (status, body), or the error that ended the exchange.
fn https_get(addr: &str, path: &str, ca: &Path, client: Option<(&Path, &Path)>) -> Result<(u16, String), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(ca) {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder.with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_file(key).unwrap()),
        None => Ok(builder.with_no_client_auth()),
    }
    .unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap();
    let mut sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let read = tls.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse::<u16>().ok());
    match (status, read) {
        (Some(status), _) => Ok((status, text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string()))),
        (None, Err(e)) => Err(e.to_string()),
        (None, Ok(_)) => Err(format!("no HTTP answer: {text:?}")),
    }
}

/// Sum of the samples of `name` with all of `labels`, read over mTLS.
fn tls_metric(server: &ServeProcess, pki: &Pki, name: &str, labels: &[&str]) -> f64 {
    let client = (pki.dir.join("client.pem"), pki.dir.join("client.key"));
    let (_, body) = https_get(&server.http, "/metrics", &pki.dir.join("ca.pem"), Some((&client.0, &client.1))).unwrap();
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|kv| l.contains(kv)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `kvindex serve` with mTLS on its listeners (the test CA's server certificate, clients
/// that CA signed), a central SUB, and `extra` flags.
fn mtls_server(pki: &Pki, extra: &[&str]) -> ServeProcess {
    let (cert, key, ca) = (pki.path("server.pem"), pki.path("server.key"), pki.path("ca.pem"));
    let mut args = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"];
    args.extend(["--tls-cert", &cert, "--tls-key", &key, "--tls-client-ca", &ca]);
    args.extend(extra);
    kvindex_serve().args(&args).start().expect("kvindex serve")
}

#[test]
fn mtls_on_grpc_and_http_refuses_clients_without_a_trusted_certificate() {
    let Some(py) = python() else { return };
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let server = mtls_server(&pki, &[]);
    let ca_path = pki.dir.join("ca.pem");
    let (client_pem, client_key) = (pki.dir.join("client.pem"), pki.dir.join("client.key"));
    let (rogue_pem, rogue_key) = (pki.dir.join("rogue.pem"), pki.dir.join("rogue.key"));

    // HTTP: the trusted client gets answers; no certificate, a foreign one, or plain HTTP do not.
    let ok = https_get(&server.http, "/healthz", &ca_path, Some((&client_pem, &client_key)));
    assert_eq!(ok, Ok((200, "ok\n".to_string())));
    let no_cert = https_get(&server.http, "/healthz", &ca_path, None);
    assert!(no_cert.is_err(), "{no_cert:?}");
    let rogue = https_get(&server.http, "/healthz", &ca_path, Some((&rogue_pem, &rogue_key)));
    assert!(rogue.is_err(), "{rogue:?}");
    let mut plain = TcpStream::connect(&server.http).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "plain HTTP on a TLS port: {:?}", String::from_utf8_lossy(&answer));

    // gRPC through grpcio: the trusted client scores; one without a certificate cannot.
    let mut peer = Peer::start(&py);
    let tls = json!({"op": "grpc_tls", "addr": server.grpc, "ca": ca, "cert": pki.path("client.pem"), "key": pki.path("client.key")});
    assert_eq!(peer.cmd(tls)["ready"], true);
    let zmq = server.zmq.clone().unwrap();
    let topic = format!("kv@pod-a@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": zmq, "topic": topic}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    wait_until("pod-a's blocks scored over mTLS", 20, || {
        (peer.score_pod(MODEL, &chain(0, 4), "pod-a").0 == 4).then_some(())
    });
    assert_eq!(peer.check(&["a"], MODEL)["violations"], json!([]));

    let mut anonymous = Peer::start(&py);
    let r = anonymous.cmd(json!({"op": "grpc_tls", "addr": server.grpc, "ca": ca, "timeout": 3}));
    assert_eq!(r["ready"], false, "{r}");
    let r = anonymous.try_cmd(json!({"op": "score", "model": MODEL, "tokens": chain(0, 4)}));
    assert_eq!(r["code"], "UNAVAILABLE", "{r}");

    // Every refusal was counted, per listener.
    wait_until("the refused handshakes counted", 20, || {
        let http = tls_metric(&server, &pki, "kvindex_tls_handshake_failures_total", &["listener=\"http\""]);
        let grpc = tls_metric(&server, &pki, "kvindex_tls_handshake_failures_total", &["listener=\"grpc\""]);
        (http >= 3.0 && grpc >= 1.0).then_some(())
    });
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a"), (4, "EXACT".to_string()));
}

/// TLS without client certificates: any client that trusts the server's CA is served; the
/// metrics listener speaks TLS too.
#[test]
fn tls_without_client_certificates() {
    let Some(py) = python() else { return };
    let pki = Pki::new();
    let (cert, key, ca) = (pki.path("server.pem"), pki.path("server.key"), pki.path("ca.pem"));
    let args = [
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let server = kvindex_serve().args(args).start().expect("kvindex serve");
    let ca_path = pki.dir.join("ca.pem");
    assert_eq!(https_get(&server.http, "/healthz", &ca_path, None), Ok((200, "ok\n".to_string())));
    let metrics = server.metrics.clone().unwrap();
    let (status, body) = https_get(&metrics, "/metrics", &ca_path, None).unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("kvindex_"), "{body}");
    let mut peer = Peer::start(&py);
    assert_eq!(peer.cmd(json!({"op": "grpc_tls", "addr": server.grpc, "ca": ca}))["ready"], true);
    assert_eq!(peer.cmd(json!({"op": "health"}))["serving"], true);
}

/// Bad TLS settings are config errors naming their key, before anything listens.
#[test]
fn tls_config_errors_name_the_key() {
    let pki = Pki::new();
    let (cert, key, ca) = (pki.path("server.pem"), pki.path("server.key"), pki.path("ca.pem"));
    let other_key = pki.path("client.key");
    for (args, key_name) in [
        (vec!["--tls-cert", cert.as_str()], "tls_key"),
        (vec!["--tls-client-ca", ca.as_str()], "tls_client_ca"),
        (vec!["--tls-cert", ca.as_str(), "--tls-key", ca.as_str()], "tls_key"),
        (vec!["--tls-cert", key.as_str(), "--tls-key", key.as_str()], "tls_cert"),
        (vec!["--tls-cert", cert.as_str(), "--tls-key", other_key.as_str()], "tls_key"),
        (vec!["--tls-cert", "/nonexistent.pem", "--tls-key", key.as_str()], "tls_cert"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvindex"))
            .arg("serve")
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("config error: {key_name}")), "{args:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("KVINDEX_LISTENING"));
    }
}

/// A sibling behind mTLS exports its index only to a replica that presents a certificate its CA
/// signed and the replicas' admin token (`--bootstrap-tls-*`, `--admin-token-file`), and
/// `kvindex compare` reaches it with the same files. A replica without a client certificate is
/// refused at the handshake: a clear error, counted, and a cold start.
#[test]
fn bootstrap_and_compare_over_mtls() {
    let Some(py) = python() else { return };
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let (client_cert, client_key) = (pki.path("client.pem"), pki.path("client.key"));
    let token = admin_token_file();
    let token = token.to_str().unwrap();
    let sibling = mtls_server(&pki, &["--admin-token-file", token]);
    let mut peer = Peer::start(&py);
    let grpc = json!({"op": "grpc_tls", "addr": sibling.grpc, "ca": ca, "cert": client_cert, "key": client_key});
    assert_eq!(peer.cmd(grpc)["ready"], true);
    let topic = format!("kv@pod-a@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": sibling.zmq.clone().unwrap(), "topic": topic}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    wait_until("pod-a indexed on the sibling", 20, || {
        (peer.score_pod(MODEL, &chain(0, 4), "pod-a").0 == 4).then_some(())
    });

    // The sibling's certificate names localhost; the replica dials it by IP.
    let from = sibling.grpc.replace("127.0.0.1", "localhost");
    let replica = |identity: bool| {
        let mut args = vec![
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--admin-token-file",
            token,
            "--bootstrap-from",
            &from,
            "--bootstrap-tls-ca",
            &ca,
            // No stream here claims pod-a's record: /readyz stops waiting for it after this.
            "--bootstrap-timeout-ms",
            "3000",
        ];
        if identity {
            args.extend(["--bootstrap-tls-cert", &client_cert, "--bootstrap-tls-key", &client_key]);
        }
        kvindex_serve().args(&args).until_ready().start().expect("kvindex serve ready")
    };
    let bootstraps = |server: &ServeProcess, outcome: &str| {
        http_metric(&server.http, "kvindex_bootstrap_total", &[&format!("outcome=\"{outcome}\"")])
    };
    let trusted = replica(true);
    assert_eq!(bootstraps(&trusted, "loaded"), 1.0);
    assert_eq!(tls_metric(&sibling, &pki, "kvindex_sibling_exports_total", &["outcome=\"ok\""]), 1.0);
    let anonymous = replica(false);
    assert_eq!(bootstraps(&anonymous, "loaded"), 0.0);
    assert_eq!(bootstraps(&anonymous, "unreachable"), 1.0, "refused at the handshake");
    assert_eq!(tls_metric(&sibling, &pki, "kvindex_sibling_exports_total", &["outcome=\"ok\""]), 1.0);

    let compare = |tls: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvindex"))
            .args(["compare", &from, &from])
            .args(tls)
            .output()
            .unwrap()
    };
    let out = compare(&["--tls-ca", &ca, "--tls-cert", &client_cert, "--tls-key", &client_key]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 pods, 1 agree, 0 differ"), "{stdout}");
    let out = compare(&["--tls-ca", &ca]);
    assert_eq!(out.status.code(), Some(2), "no client certificate: {}", String::from_utf8_lossy(&out.stderr));
}
