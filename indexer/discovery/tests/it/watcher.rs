//! The watcher shell against a fake API server on loopback (real HTTP, real kube client):
//! the first list, watch events, bookmarks, a watch that expires (410 Gone) and the re-list
//! that removes pods deleted meanwhile, a failing list retried, and malformed data counted
//! without stopping the watch.

use std::collections::BTreeMap;
use std::time::Duration;

use kvindex_discovery::fake_api::{pod, FakeApiServer};
use kvindex_discovery::settings::{DEFAULT_LABEL_SELECTOR, DP_SIZE_ANNOTATION};
use kvindex_discovery::watcher::{self, ApiServer, WatchConfig};
use kvindex_discovery::{Change, DiscoveredPod, Outcome, Settings};
use tokio::sync::{mpsc, watch};

/// A running watcher and what it told its consumer (also used by `engine_probe.rs`).
pub struct Watching {
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    pub held: BTreeMap<String, DiscoveredPod>,
    pub rejections: Vec<&'static str>,
    pub syncs: u32,
    _stop: watch::Sender<bool>,
}

impl Watching {
    pub async fn start(api: &FakeApiServer, settings: Settings) -> Watching {
        let config = WatchConfig {
            namespace: "inference".into(),
            label_selector: DEFAULT_LABEL_SELECTOR.into(),
            api_server: ApiServer::Url(api.url()),
            settings,
        };
        let client = watcher::client(&config.api_server).await.unwrap();
        let (tx, outcomes) = mpsc::unbounded_channel();
        let (stop, stopping) = watch::channel(false);
        tokio::spawn(watcher::run(
            client,
            config,
            move |outcome| {
                let _ = tx.send(outcome);
                async {}
            },
            stopping,
        ));
        Watching { outcomes, held: BTreeMap::new(), rejections: Vec::new(), syncs: 0, _stop: stop }
    }

    /// Applies outcomes until `done` holds of the consumer's view, or fails after 20 s.
    pub async fn until(&mut self, what: &str, done: impl Fn(&Watching) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done(self) {
            let outcome = tokio::time::timeout_at(deadline, self.outcomes.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; holding {:?}", self.held.keys()))
                .expect("the watcher stopped");
            for change in outcome.changes {
                match change {
                    Change::Add(p) => assert!(self.held.insert(p.pod_id(), p).is_none(), "added twice"),
                    Change::Remove(p) => assert!(self.held.remove(&p.pod_id()).is_some(), "removed unheld"),
                }
            }
            self.rejections.extend(outcome.rejections.iter().map(|r| r.reason));
            self.syncs += u32::from(outcome.synced);
        }
    }

    pub fn ids(&self) -> Vec<&str> {
        self.held.keys().map(String::as_str).collect()
    }
}

#[tokio::test]
async fn lists_then_follows_pods_through_ready_not_ready_ip_change_and_delete() {
    let api = FakeApiServer::start("inference").await;
    api.apply(pod("vllm-a", "Running", true, Some("10.0.0.1"), &[]));
    api.apply(pod("vllm-b", "Running", false, Some("10.0.0.2"), &[]));
    let mut w = Watching::start(&api, Settings::default()).await;
    w.until("the first list", |w| w.syncs == 1).await;
    assert_eq!(w.ids(), ["10.0.0.1:8000"]);
    let selector = api.requests().iter().filter_map(|q| q.get("labelSelector").cloned()).collect::<Vec<_>>();
    assert!(!selector.is_empty() && selector.iter().all(|s| s == DEFAULT_LABEL_SELECTOR), "{selector:?}");

    api.apply(pod("vllm-b", "Running", true, Some("10.0.0.2"), &[(DP_SIZE_ANNOTATION, "2")]));
    w.until("b ready", |w| w.held.contains_key("10.0.0.2:8000")).await;
    assert_eq!(w.held["10.0.0.2:8000"].dp_size, 2);
    api.bookmark();
    api.apply(pod("vllm-a", "Running", false, Some("10.0.0.1"), &[]));
    w.until("a not ready", |w| !w.held.contains_key("10.0.0.1:8000")).await;
    api.apply(pod("vllm-a", "Running", true, Some("10.0.0.9"), &[]));
    w.until("a back on a new IP", |w| w.held.contains_key("10.0.0.9:8000")).await;
    api.delete("vllm-b");
    w.until("b deleted", |w| w.ids() == ["10.0.0.9:8000"]).await;
}

#[tokio::test]
async fn an_expired_watch_re_lists_and_drops_pods_deleted_meanwhile() {
    let api = FakeApiServer::start("inference").await;
    api.apply(pod("vllm-a", "Running", true, Some("10.0.0.1"), &[]));
    api.apply(pod("vllm-b", "Running", true, Some("10.0.0.2"), &[]));
    let mut w = Watching::start(&api, Settings::default()).await;
    w.until("the first list", |w| w.syncs == 1 && w.held.len() == 2).await;
    // Wait for the watch to be open, so the expiry reaches it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.open_watches() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no watch opened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    api.delete_silently("vllm-b");
    api.expire_watches();
    w.until("the re-list", |w| w.syncs == 2).await;
    assert_eq!(w.ids(), ["10.0.0.1:8000"], "b, missing from the re-list, was removed");
    assert!(api.counts().0 >= 2, "listed again");
}

#[tokio::test]
async fn a_failing_list_is_retried_and_bad_data_is_rejected_without_stopping_the_watch() {
    let api = FakeApiServer::start("inference").await;
    api.fail_lists(1);
    api.apply(pod("vllm-a", "Running", true, Some("10.0.0.1"), &[]));
    let mut w = Watching::start(&api, Settings::default()).await;
    w.until("the list after a failure", |w| w.syncs == 1).await;
    assert_eq!(w.ids(), ["10.0.0.1:8000"]);
    api.apply(pod("vllm-c", "Running", true, None, &[]));
    api.apply(pod("vllm-d", "Running", true, Some("10.0.0.4"), &[(DP_SIZE_ANNOTATION, "many")]));
    w.until("two rejections", |w| w.rejections.len() >= 2).await;
    assert_eq!(w.rejections[..2], ["missing_ip", "bad_dp_size"]);
    // A line that is not a watch event: kube drops the watch and re-lists; nothing panics.
    api.send_raw("{\"type\": \"ADDED\", \"object\": 17}");
    api.apply(pod("vllm-e", "Running", true, Some("10.0.0.5"), &[]));
    w.until("e after the malformed line", |w| w.held.contains_key("10.0.0.5:8000")).await;
    assert!(w.held.contains_key("10.0.0.1:8000"));
}
