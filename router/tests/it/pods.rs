//! Where pods come from: a JSON file re-read when it changes (a broken rewrite keeps the
//! current pods), and registration on the admin address only (never the public port); each
//! source changes only its own pods, and none can touch pods from the command line.

use std::path::PathBuf;

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use serde_json::json;

fn write(path: &PathBuf, text: &str) {
    let partial = path.with_extension("tmp");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

async fn ids(router: &str) -> Vec<String> {
    let pods = get(router, "/debug/pods").await.json();
    pods["pods"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap().to_string()).collect()
}

async fn served_by(router: &str) -> String {
    let reply = post(router, "/v1/completions", &json!({"model": "m", "prompt": [1, 2, 3]})).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["pod"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_from_a_watched_file_and_from_registration() {
    let bins = bins();
    let pods = [
        FakePod::start(Script::Echo("p0".into())).await,
        FakePod::start(Script::Echo("p1".into())).await,
        FakePod::start(Script::Echo("p2".into())).await,
        FakePod::start(Script::Echo("static".into())).await,
    ];
    let entry = |i: usize| json!({"id": pods[i].addr, "url": format!("http://{}", pods[i].addr)});
    let file = std::env::temp_dir().join(format!("kvindex-router-pods-{}.json", std::process::id()));
    write(&file, &json!([entry(0)]).to_string());
    let args = [
        "--pods-file",
        file.to_str().unwrap(),
        "--pods-file-interval-ms",
        "20",
        "--admin-addr",
        "127.0.0.1:0",
        "--pod",
        &pods[3].spec(),
    ]
    .map(String::from);
    let router = router(&bins, &args);
    let admin = router.admin.clone().expect("admin address");
    let (public, p) = (router.http.clone(), |i: usize| pods[i].addr.clone());
    assert_eq!(ids(&public).await.len(), 2);

    // The file changes: its pods follow.
    write(&file, &json!([entry(1)]).to_string());
    wait_for("the rewritten file to apply", DEADLINE, || async {
        let now = ids(&public).await;
        (now.contains(&p(1)) && !now.contains(&p(0))).then_some(())
    })
    .await;
    // A broken rewrite changes nothing.
    write(&file, "[{\"id\": ");
    wait_for("the broken file to be noticed", DEADLINE, || async {
        (metric(&public, "kvindex_router_pod_changes_total", &["op=\"error\""]).await >= 1.0).then_some(())
    })
    .await;
    let mut expected = vec![p(1), p(3)];
    expected.sort();
    assert_eq!(ids(&public).await, expected);

    // Registration: admin address only.
    let registration = json!({"id": p(2), "url": format!("http://{}", p(2)), "role": "both"});
    assert_eq!(post(&public, "/pods", &registration).await.status, 404, "not on the public port");
    let registered = post(&admin, "/pods", &registration).await;
    assert_eq!(registered.status, 200, "{:?}", registered.body);
    assert!(ids(&public).await.contains(&p(2)));
    for bad in [
        json!({"id": "x", "url": "https://x:1"}),
        json!({"id": "", "url": "http://x:1"}),
        json!({"url": "http://x:1"}),
        json!({"id": p(3), "url": "http://elsewhere:1"}),
    ] {
        let refused = post(&admin, "/pods", &bad).await;
        assert_eq!(refused.status, 400, "{bad}");
        assert!(refused.json()["error"].is_string());
    }
    assert_eq!(request(&admin, "DELETE", &format!("/pods/{}", p(1)), None, &[]).await.status, 400, "the file owns it");
    assert_eq!(
        request(&admin, "DELETE", &format!("/pods/{}", p(3)), None, &[]).await.status,
        400,
        "the command line owns it"
    );
    let removed = request(&admin, "DELETE", &format!("/pods/{}", p(2)), None, &[]).await;
    assert_eq!(removed.json()["removed"], true);
    assert_eq!(ids(&public).await, expected);
    for _ in 0..6 {
        assert!(["p1", "static"].contains(&served_by(&public).await.as_str()));
    }
    let _ = std::fs::remove_file(&file);
}

/// `--metrics-addr`: `/metrics` and `/debug/pods` answer only on the metrics listener; the public
/// and admin ports keep health and readiness (and their own routes) and answer 404 for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_debug_on_their_own_listener() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let args = ["--pod", &pod.spec(), "--admin-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"].map(String::from);
    let router = router(&bins, &args);
    let metrics = router.metrics.clone().expect("metrics= in KVINDEX_ROUTER_LISTENING");
    let admin = router.admin.clone().expect("admin address");
    for path in ["/metrics", "/debug/pods"] {
        assert_eq!(get(&metrics, path).await.status, 200, "{path} on --metrics-addr");
        for other in [&router.http, &admin] {
            assert_eq!(get(other, path).await.status, 404, "{path} on {other}");
        }
    }
    assert_eq!(ids(&metrics).await, vec![pod.addr.to_string()]);
    for addr in [&router.http, &admin, &metrics] {
        assert_eq!(get(addr, "/healthz").await.status, 200, "{addr}");
    }
    assert_eq!(served_by(&router.http).await, "p");
}
