//! A small fake Kubernetes API server for tests (feature `fake-api`): on loopback, it serves
//! `GET /api/v1/namespaces/<ns>/pods?labelSelector=…` as a PodList and `…&watch=true` as a
//! stream of JSON lines (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`), the way the
//! API server does. Tests drive it: apply or delete pods (watchers are told), change pods
//! while no watch is open (a later re-list must notice), expire watches (410 Gone), fail lists.
//! Real HTTP, real kube client on the other side; only the cluster is pretend.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;

#[derive(Default)]
struct Inner {
    namespace: String,
    pods: BTreeMap<String, Value>,
    resource_version: u64,
    watchers: Vec<mpsc::UnboundedSender<String>>,
    /// Every event sent, by resourceVersion: a watch from version v first gets those after v
    /// (the API server's guarantee that closes the gap between a list and its watch).
    history: Vec<(u64, String)>,
    /// Query strings of every request, for assertions (`labelSelector`).
    requests: Vec<BTreeMap<String, String>>,
    /// Lists still to answer with 500.
    failing_lists: u32,
    lists: u32,
    watches: u32,
}

/// The fake API server; dropping it does not stop it (tests end with the runtime).
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Mutex<Inner>>,
    addr: SocketAddr,
}

impl FakeApiServer {
    /// Serves namespace `namespace` on a free loopback port.
    pub async fn start(namespace: &str) -> FakeApiServer {
        let inner =
            Arc::new(Mutex::new(Inner { namespace: namespace.to_string(), resource_version: 1, ..Inner::default() }));
        let app = axum::Router::new().route("/api/v1/namespaces/{ns}/pods", get(pods)).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake API server");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApiServer { inner, addr }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds or replaces a pod object (see [`pod`]) and tells open watches.
    pub fn apply(&self, mut object: Value) {
        let mut inner = self.inner.lock();
        let name = object["metadata"]["name"].as_str().expect("a pod has a name").to_string();
        inner.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
        object["metadata"]["namespace"] = json!(inner.namespace.clone());
        let kind = if inner.pods.contains_key(&name) { "MODIFIED" } else { "ADDED" };
        inner.pods.insert(name, object.clone());
        inner.send(json!({"type": kind, "object": object}));
    }

    /// Deletes a pod and tells open watches.
    pub fn delete(&self, name: &str) {
        let mut inner = self.inner.lock();
        if let Some(mut object) = inner.pods.remove(name) {
            inner.resource_version += 1;
            object["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
            inner.send(json!({"type": "DELETED", "object": object}));
        }
    }

    /// Deletes a pod without telling anyone (as if the event was lost while a watch was down).
    pub fn delete_silently(&self, name: &str) {
        let mut inner = self.inner.lock();
        inner.pods.remove(name);
        inner.resource_version += 1;
        // Compacted away: no watch can replay it.
        inner.history.clear();
    }

    /// Sends a BOOKMARK with the current resourceVersion.
    pub fn bookmark(&self) {
        let mut inner = self.inner.lock();
        let rv = inner.resource_version.to_string();
        inner.send(json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}}));
    }

    /// Sends a raw line to open watches (malformed data).
    pub fn send_raw(&self, line: &str) {
        self.inner.lock().send_line(line.to_string());
    }

    /// Ends every open watch with `410 Gone` (resourceVersion too old): clients must re-list.
    pub fn expire_watches(&self) {
        let mut inner = self.inner.lock();
        inner.send(json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}}));
        inner.watchers.clear();
    }

    /// Answers the next `n` lists with 500.
    pub fn fail_lists(&self, n: u32) {
        self.inner.lock().failing_lists = n;
    }

    /// Lists and watches served so far.
    pub fn counts(&self) -> (u32, u32) {
        let inner = self.inner.lock();
        (inner.lists, inner.watches)
    }

    /// Query parameters of every request so far.
    pub fn requests(&self) -> Vec<BTreeMap<String, String>> {
        self.inner.lock().requests.clone()
    }

    /// Watches open now.
    pub fn open_watches(&self) -> usize {
        self.inner.lock().watchers.iter().filter(|w| !w.is_closed()).count()
    }
}

impl Inner {
    fn send(&mut self, event: Value) {
        let line = event.to_string();
        if event["type"] != "BOOKMARK" && event["type"] != "ERROR" {
            self.history.push((self.resource_version, line.clone()));
        }
        self.send_line(line);
    }

    fn send_line(&mut self, line: String) {
        self.watchers.retain(|w| w.send(format!("{line}\n")).is_ok());
    }
}

async fn pods(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(ns): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut inner = inner.lock();
    inner.requests.push(query.clone());
    if ns != inner.namespace {
        return (StatusCode::NOT_FOUND, "no such namespace").into_response();
    }
    if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
        inner.watches += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        let from: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        for (_, line) in inner.history.iter().filter(|(rv, _)| *rv > from) {
            let _ = tx.send(format!("{line}\n"));
        }
        inner.watchers.push(tx);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx))
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .expect("a valid response");
    }
    inner.lists += 1;
    if inner.failing_lists > 0 {
        inner.failing_lists -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "etcd is having a bad day").into_response();
    }
    let items: Vec<Value> = inner.pods.values().cloned().collect();
    let list = json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": items,
    });
    (StatusCode::OK, [("content-type", "application/json")], list.to_string()).into_response()
}

/// A pod object: `phase` (e.g. `Running`), `ready` (the Ready condition), `ip` and
/// annotations, labelled `llm-d.ai/inference-serving=true`.
pub fn pod(name: &str, phase: &str, ready: bool, ip: Option<&str>, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> =
        annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let mut status = json!({
        "phase": phase,
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
    }
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "labels": {"llm-d.ai/inference-serving": "true"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": status,
    })
}
