//! No crate ties its files into an import circle that is larger than it was: each circle found
//! is printed, and the number of files inside circles per crate may only go down (the
//! baseline below is lowered as circles are broken; a crate at 0 must stay at 0). Counted
//! twice: through re-exports to the defining files, and as the text reads (a path through a
//! `pub use` is an edge to the file that re-exports, the file a reader opens).

use std::path::Path;

use kvindex_deploy_tests::imports::ImportGraph;

/// Files inside import circles, per crate, as measured when the check was added (2026-12-03;
/// each was since taken to 0).
const BASELINE: &[(&str, usize)] = &[
    ("proto/src", 0),
    ("indexer/src", 0),
    ("indexer/zmtp/src", 0),
    ("indexer/discovery/src", 0),
    ("indexer/server/src", 0),
    ("router/src", 0),
    ("tokenizer-svc/src", 0),
    ("loadtest/src", 0),
];

/// Files inside import circles as the text reads, per crate (a path through a `pub use` is an
/// edge to the re-exporting file). Every crate is at 0 since 2026-12-06.
const BASELINE_AS_WRITTEN: &[(&str, usize)] = &[
    ("proto/src", 0),
    ("indexer/src", 0),
    ("indexer/zmtp/src", 0),
    ("indexer/discovery/src", 0),
    ("indexer/server/src", 0),
    ("router/src", 0),
    ("tokenizer-svc/src", 0),
    ("loadtest/src", 0),
];

#[test]
fn import_circles_do_not_grow() {
    check(BASELINE, ImportGraph::of_crate);
}

#[test]
fn import_circles_as_written_do_not_grow() {
    check(BASELINE_AS_WRITTEN, ImportGraph::of_crate_as_written);
}

fn check(baseline: &[(&str, usize)], read: fn(&Path) -> ImportGraph) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut report = Vec::new();
    let mut grew = Vec::new();
    for &(dir, baseline) in baseline {
        let src = root.join(dir);
        assert!(src.is_dir(), "{} is not a directory", src.display());
        let graph = read(&src);
        let circles = graph.circles();
        let files: usize = circles.iter().map(Vec::len).sum();
        report.push(format!("{dir}: {files} files in {} circles (baseline {baseline})", circles.len()));
        for circle in &circles {
            let names: Vec<String> =
                circle.iter().map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string()).collect();
            report.push(format!("  {}", names.join(" ")));
        }
        if files > baseline {
            grew.push(format!("{dir}: {files} > {baseline}"));
        }
    }
    println!("{}", report.join("\n"));
    assert!(grew.is_empty(), "import circles grew: {grew:?}\n{}", report.join("\n"));
}

#[test]
fn the_graph_sees_a_real_edge() {
    // The check must be able to fail: the server's apply worker names the telemetry table.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../indexer/server/src");
    let graph = ImportGraph::of_crate(&src);
    let index = |name: &str| graph.files.iter().position(|f| f.ends_with(name)).unwrap_or_else(|| panic!("{name}"));
    assert!(graph.edges.contains(&(index("write/worker/mod.rs"), index("telemetry.rs"))));
}
