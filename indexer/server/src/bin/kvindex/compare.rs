//! `kvindex compare <a> <b>`: do two running replicas hold the same for every pod? Each is
//! asked for its per-pod digests (`kvindex.v1.Replica/PodDigests`); pods whose digests differ
//! because one replica is a moment behind are asked again (`--attempts`), and what still
//! differs is printed with both sides' blocks and stream cursors. Exit status as diff's: 0 when
//! every pod agrees, 1 when some differ, 2 when a replica cannot be asked.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kvindex_server::config::sibling::SiblingTls;
use kvindex_server::persist::sibling_check::{ask, compare, PodComparison, Verdict};

#[derive(Args)]
pub struct CompareArgs {
    /// One replica's gRPC address (host:port).
    pub a: String,
    /// The other's.
    pub b: String,
    /// PEM CA that signed the replicas' certificates: talk TLS.
    #[arg(long, value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for mTLS (with --tls-key).
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the replicas' certificates carry (default: each address's host).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// Times to ask again while pods differ only because one replica is behind the other.
    #[arg(long, default_value_t = 10)]
    pub attempts: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Compares; `Ok(true)` when every pod agrees.
pub fn run(args: &CompareArgs) -> anyhow::Result<bool> {
    let tls = match &args.tls_ca {
        Some(ca) => {
            let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            Some(SiblingTls::read(ca, identity, args.tls_domain.clone()).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let compared = runtime.block_on(async {
        let mut attempt = 0;
        loop {
            let (a, b) = tokio::join!(ask(&args.a, tls.as_ref(), None), ask(&args.b, tls.as_ref(), None));
            let (a, b) = (a?, b?);
            let compared = compare(&a.pods, &b.pods);
            let moving = compared.iter().any(|c| matches!(c.verdict, Verdict::Behind | Verdict::Unsettled));
            attempt += 1;
            if !moving || attempt > args.attempts {
                return Ok::<_, anyhow::Error>(compared);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })?;
    let agree = compared.iter().all(|c| c.verdict == Verdict::Agree);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(args, &compared))?);
    } else {
        print!("{}", table(args, &compared));
    }
    Ok(agree)
}

fn json(args: &CompareArgs, compared: &[PodComparison]) -> serde_json::Value {
    let side = |d: &Option<kvindex_proto::kvindex::v1::PodDigest>| {
        d.as_ref().map(|d| {
            serde_json::json!({
                "blocks": d.blocks,
                "cursor": d.has_cursor.then_some(d.cursor),
                "digest": format!("{:016x}", d.digest),
                "settled": d.settled,
                "state": d.state,
            })
        })
    };
    let pods: Vec<serde_json::Value> = compared
        .iter()
        .map(|c| serde_json::json!({"pod": c.pod, "verdict": c.verdict.label(), "a": side(&c.a), "b": side(&c.b)}))
        .collect();
    let differing = compared.iter().filter(|c| c.verdict != Verdict::Agree).count();
    serde_json::json!({"a": args.a, "b": args.b, "pods": pods, "differing": differing, "agree": differing == 0})
}

fn table(args: &CompareArgs, compared: &[PodComparison]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let differing: Vec<&PodComparison> = compared.iter().filter(|c| c.verdict != Verdict::Agree).collect();
    let blocks = |d: &Option<kvindex_proto::kvindex::v1::PodDigest>| {
        d.as_ref().map_or("-".to_string(), |d| d.blocks.to_string())
    };
    let cursor = |d: &Option<kvindex_proto::kvindex::v1::PodDigest>| {
        d.as_ref().and_then(|d| d.has_cursor.then_some(d.cursor)).map_or("-".to_string(), |c| c.to_string())
    };
    if !differing.is_empty() {
        let _ = writeln!(out, "{:<28} {:<10} {:>21} {:>23}", "pod", "verdict", "blocks a/b", "cursor a/b");
        for c in &differing {
            let b = format!("{}/{}", blocks(&c.a), blocks(&c.b));
            let s = format!("{}/{}", cursor(&c.a), cursor(&c.b));
            let _ = writeln!(out, "{:<28} {:<10} {:>21} {:>23}", c.pod, c.verdict.label(), b, s);
        }
    }
    let _ = writeln!(
        out,
        "{} and {}: {} pods, {} agree, {} differ",
        args.a,
        args.b,
        compared.len(),
        compared.len() - differing.len(),
        differing.len()
    );
    out
}
