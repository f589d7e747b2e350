//! The indexer service's wings read as the data flows: a KV event comes in through `write/`
//! (sockets, sources, the stream table, the apply worker) into the index, and `read/` answers
//! from the index; `persist/` and `pods/` sit beside them, `config/` and the leaves below. So
//! no file names a room on a floor above its own (the read plane never names the write plane,
//! the stream table names no worker, the configuration names nothing of the service), except
//! the few edges listed in `UPWARD`. The circle check cannot see these: a one-way edge in the
//! wrong direction makes no circle.

use std::path::Path;

use kvindex_deploy_tests::imports::ImportGraph;

/// The floors, top (where the service is put together) to bottom (what everything reads). A
/// file's floor is that of the longest entry its path under `indexer/server/src` starts with.
const FLOORS: &[&[&str]] = &[
    // The assembly: the service (`bind`, `run`) and the replayed index's server.
    &["lib.rs", "server.rs", "dump_server.rs"],
    // The read plane: gRPC, HTTP, TLS, the routers' shared in-flight load.
    &["read/"],
    // Why the service could not start (it names the listeners' and the snapshot dir's errors).
    &["error.rs"],
    // What outlives the process or comes from another replica: snapshots, dumps, siblings.
    &["persist/"],
    // Which pods exist: declarations (config, pods file, discovery, registration) and their
    // lifecycle, which dials the per-pod sources.
    &["pods/"],
    // The write plane, in flow order: the apply worker drives the stream table with what the
    // sources read from the ZeroMQ transport.
    &["write/worker/"],
    &["write/replay.rs"],
    &["write/context.rs"],
    &["write/sources/"],
    &["write/table/"],
    &["write/transport.rs", "write/mod.rs"],
    // The data the write plane reads or hands over: the registry, the snapshot records' pool,
    // the restored records, the recorder and the dump's records.
    &[
        "pods/registry.rs",
        "pods/precedence.rs",
        "persist/snapshot/pool.rs",
        "persist/snapshot/restored.rs",
        "persist/dump/recorder.rs",
        "persist/dump/mod.rs",
    ],
    // The leaves every part shares: messages and their queue, the index handle, states.
    &[
        "queue/",
        "protocols.rs",
        "index_handle.rs",
        "status.rs",
        "source_series.rs",
        "persist/snapshot/format.rs",
        "readiness.rs",
        "clock.rs",
        "shutdown.rs",
        "telemetry.rs",
        "test_events.rs",
    ],
    // The settings, a leaf.
    &["config/"],
];

/// Known edges against the flow (importing file, imported file), each with its reason; they
/// are let through both checks. The list may only shrink.
const UPWARD: &[(&str, &str)] = &[];

/// (room of the importing file, rooms it must not name), by path prefix: what the flow order
/// implies, said outright.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("read/", &["write/"]),
    ("write/table/", &["write/worker/", "write/context.rs", "write/replay.rs", "write/sources/"]),
    ("config/", &["read/", "write/", "persist/", "pods/", "queue/", "server.rs", "error.rs"]),
];

fn floor(relative: &str) -> usize {
    let mut best: Option<(usize, usize)> = None;
    for (floor, rooms) in FLOORS.iter().enumerate() {
        for room in rooms.iter().filter(|r| relative == **r || (r.ends_with('/') && relative.starts_with(**r))) {
            if best.is_none_or(|(_, len)| room.len() > len) {
                best = Some((floor, room.len()));
            }
        }
    }
    best.unwrap_or_else(|| panic!("{relative} is on no floor: add it to FLOORS")).0
}

fn relative_files(graph: &ImportGraph, src: &Path) -> Vec<String> {
    graph.files.iter().map(|f| f.strip_prefix(src).unwrap_or(f).to_string_lossy().replace('\\', "/")).collect()
}

#[test]
fn each_server_file_names_only_its_floor_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../indexer/server/src");
    let graph = ImportGraph::of_crate(&src);
    let files = relative_files(&graph, &src);
    let (mut upward, mut forbidden, mut used) = (Vec::new(), Vec::new(), Vec::new());
    for &(from, to) in &graph.edges {
        let (a, b) = (files[from].as_str(), files[to].as_str());
        // Floor 0 is the top: an edge to a smaller floor number runs up.
        let known = UPWARD.iter().find(|(x, y)| *x == a && *y == b);
        if let Some(edge) = known {
            used.push(*edge);
            continue;
        }
        if floor(b) < floor(a) {
            upward.push(format!("{a} -> {b}"));
        }
        if FORBIDDEN.iter().any(|(room, banned)| a.starts_with(room) && banned.iter().any(|r| b.starts_with(r))) {
            forbidden.push(format!("{a} -> {b}"));
        }
    }
    assert!(forbidden.is_empty(), "server files naming a room they must not: {forbidden:#?}");
    assert!(upward.is_empty(), "server files naming a floor above their own (flow order in FLOORS): {upward:#?}");
    let stale: Vec<_> = UPWARD.iter().filter(|e| !used.contains(e)).collect();
    assert!(stale.is_empty(), "UPWARD lists edges that are gone, remove them: {stale:#?}");
}

#[test]
fn the_server_room_check_sees_a_real_edge() {
    // The check can fail: the apply worker does name the stream table, a floor below it.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../indexer/server/src");
    let graph = ImportGraph::of_crate(&src);
    let files = relative_files(&graph, &src);
    let index = |name: &str| files.iter().position(|f| f == name).unwrap_or_else(|| panic!("{name}"));
    assert!(graph.edges.contains(&(index("write/worker/mod.rs"), index("write/table/mod.rs"))));
    assert!(floor("write/worker/mod.rs") < floor("write/table/mod.rs"));
    assert!(floor("read/grpc/score.rs") < floor("write/worker/mod.rs"));
    assert!(floor("persist/snapshot/pool.rs") > floor("write/worker/live.rs"));
}
