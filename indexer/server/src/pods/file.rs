//! The watched pods file (`pods_file`): its `[[pods]]` are registered with origin
//! `pods_file`, and it is polled for changes: new and changed pods are registered, pods that
//! disappeared are unregistered. A bad file is counted and ignored (the previous content stays
//! in force). Static, like the config file: the API cannot replace its pods.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::config::pod::parse_pods_file;
use crate::config::pod::PodConfig;
use crate::shutdown::Shutdown;
use crate::telemetry as m;

use super::lifecycle::Pods;
use super::precedence;

/// The registry origin of the pods file's pods.
const ORIGIN: &str = "pods_file";

/// Polls `path`'s mtime every `period` and applies its content on change until `shutdown`;
/// `startup_done` is told once the first content is registered.
pub async fn watch(
    pods: Pods,
    path: PathBuf,
    period: Duration,
    startup_done: tokio::sync::oneshot::Sender<()>,
    mut shutdown: Shutdown,
) {
    let mut last: Option<(SystemTime, u64)> = None;
    let mut startup_done = Some(startup_done);
    loop {
        let stamp = std::fs::metadata(&path).ok().map(|md| (md.modified().unwrap_or(SystemTime::UNIX_EPOCH), md.len()));
        if stamp != last {
            last = stamp;
            match std::fs::read_to_string(&path) {
                Ok(text) => match parse_pods_file(&path, &text) {
                    Ok(wanted) => apply(&pods, wanted, startup_done.is_some()).await,
                    Err(e) => {
                        metrics::counter!(m::CONFIG_ERRORS, "source" => ORIGIN).increment(1);
                        tracing::error!(path = %path.display(), error = %e, "pods file rejected; previous content kept");
                    }
                },
                Err(e) => {
                    metrics::counter!(m::CONFIG_ERRORS, "source" => ORIGIN).increment(1);
                    tracing::warn!(path = %path.display(), error = %e, "pods file unreadable");
                }
            }
        }
        if let Some(tx) = startup_done.take() {
            let _ = tx.send(());
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.recv() => return,
        }
    }
}

async fn apply(pods: &Pods, wanted: Vec<PodConfig>, startup: bool) {
    let wanted: HashMap<String, PodConfig> = wanted.into_iter().map(|p| (p.id.clone(), p)).collect();
    let current = pods.registry().ids_with_origin(ORIGIN);
    for id in current {
        if !wanted.contains_key(&id) {
            pods.unregister(&id, ORIGIN).await;
        }
    }
    for (_, p) in wanted {
        let existing = pods.registry().origin_of(&p.id);
        if let Some(origin) = existing.filter(|_| !precedence::may_replace(ORIGIN, existing)) {
            // The shared precedence rule: the command line and config file outrank the file.
            metrics::counter!(m::CONTROL_DENIED, "api" => ORIGIN, "reason" => "operator_pod").increment(1);
            tracing::warn!(pod = %crate::write::transport::escape(&p.id), origin, "pods file entry names a pod configured on the command line or in the config file; left as configured");
            continue;
        }
        let unchanged = pods.registry().get(&p.id).is_some_and(|r| r.cfg == p && r.origin == ORIGIN);
        if !unchanged {
            if let Err(e) = pods.register(p, ORIGIN, startup).await {
                tracing::error!(error = %e, "pods file entry rejected");
            }
        }
    }
}
