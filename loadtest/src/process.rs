//! Child processes of the workspace's binaries for tests and benchmarks that run the real
//! thing on loopback: a `kvindex-sim` fleet (its pods read from the JSON lines it prints), and
//! `kvindex-router` replicas (their addresses read from `KVINDEX_ROUTER_LISTENING`), on the
//! testkit's [`ChildProcess`] (killed and reaped on drop).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

pub use kvindex_testkit::binaries::{required_binary, workspace_binary};
pub use kvindex_testkit::process::{ChildProcess, START_DEADLINE};

/// One pod of a running `kvindex-sim`, as it reported itself.
#[derive(Debug, Clone)]
pub struct SimPod {
    /// The pod id the indexer reports (`127.0.0.1:<http port>`).
    pub pod_id: String,
    /// `host:port` of its HTTP API.
    pub http: String,
    /// Its replay ROUTER endpoint, if any.
    pub replay: Option<String>,
}

impl SimPod {
    /// `<pod-id>=http://<http>`, the router's `--pod` syntax.
    pub fn router_spec(&self) -> String {
        format!("{}=http://{}", self.pod_id, self.http)
    }
}

/// A `kvindex-sim` process and its pods.
pub struct SimFleet {
    pub process: ChildProcess,
    pub pods: Vec<SimPod>,
}

impl SimFleet {
    /// Starts `binary --pods <n> <args…>` and reads its n pod lines.
    pub fn start(binary: &Path, pods: usize, args: &[&str]) -> Result<SimFleet, String> {
        let process = ChildProcess::spawn(Command::new(binary).arg("--pods").arg(pods.to_string()).args(args))?;
        let mut found = Vec::with_capacity(pods);
        while found.len() < pods {
            let line = process.next_line(START_DEADLINE)?;
            let Ok(pod) = serde_json::from_str::<Value>(&line) else { continue };
            let text = |key: &str| pod[key].as_str().map(str::to_string);
            found.push(SimPod {
                pod_id: text("pod_id").ok_or_else(|| format!("pod line without pod_id: {line}"))?,
                http: text("http").ok_or_else(|| format!("pod line without http: {line}"))?,
                replay: text("replay"),
            });
        }
        Ok(SimFleet { process, pods: found })
    }
}

/// A `kvindex-router serve` process.
pub struct RouterProcess {
    pub process: ChildProcess,
    /// `host:port` of `--http-addr`.
    pub http: String,
    /// `host:port` of `--admin-addr`, when given.
    pub admin: Option<String>,
    /// `host:port` of `--metrics-addr`, when given.
    pub metrics: Option<String>,
    /// `host:port` of `--probe-addr`, when given.
    pub probe: Option<String>,
}

impl RouterProcess {
    /// Starts `binary serve --http-addr 127.0.0.1:0 <args…>` and reads its addresses.
    pub fn start(binary: &Path, args: &[String]) -> Result<RouterProcess, String> {
        let process =
            ChildProcess::spawn(Command::new(binary).args(["serve", "--http-addr", "127.0.0.1:0"]).args(args))?;
        let addrs = process.listening("KVINDEX_ROUTER_LISTENING ")?;
        let http = addrs.get("http").cloned().ok_or("KVINDEX_ROUTER_LISTENING without http=")?;
        let named = |name: &str| addrs.get(name).cloned();
        Ok(RouterProcess { process, http, admin: named("admin"), metrics: named("metrics"), probe: named("probe") })
    }
}
