//! The router's rooms read only what they may: `upstream.rs` is HTTP and
//! knows nothing of the router (the caller commits and retries), the pipeline (`place/`) knows
//! no door and no upstream, the pods know no pipeline and no door, and the configuration is a
//! leaf the runtime reads. The circle check cannot see these: a one-way edge in the wrong
//! direction makes no circle.

use std::path::Path;

use kvindex_deploy_tests::imports::ImportGraph;

/// (room of the importing file, rooms it must not name). A room is a directory under
/// `router/src` or a top-level file.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("upstream.rs", &["config", "pods", "place", "doors", "error.rs", "serve.rs"]),
    ("place", &["doors", "upstream.rs", "serve.rs"]),
    ("pods", &["place", "doors", "serve.rs"]),
    ("config", &["doors", "upstream.rs", "serve.rs", "error.rs"]),
];

fn room(relative: &Path) -> String {
    relative.iter().next().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

#[test]
fn each_router_room_names_only_what_it_may() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../router/src");
    let graph = ImportGraph::of_crate(&src);
    let relative = |i: usize| graph.files[i].strip_prefix(&src).unwrap_or(&graph.files[i]).to_path_buf();
    let mut wrong = Vec::new();
    for &(from, to) in &graph.edges {
        let (a, b) = (relative(from), relative(to));
        let (room_a, room_b) = (room(&a), room(&b));
        if FORBIDDEN.iter().any(|(r, banned)| *r == room_a && banned.contains(&room_b.as_str())) {
            wrong.push(format!("{} -> {}", a.display(), b.display()));
        }
    }
    assert!(wrong.is_empty(), "router files naming a room they must not: {wrong:#?}");
    // The check can fail: the endpoint picker does name the pipeline.
    let index = |name: &str| graph.files.iter().position(|f| f.ends_with(name)).unwrap_or_else(|| panic!("{name}"));
    assert!(graph.edges.contains(&(index("doors/ext_proc/stream.rs"), index("place/mod.rs"))));
}
