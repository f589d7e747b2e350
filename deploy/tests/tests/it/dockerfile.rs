//! The image (deploy/Dockerfile) cannot be built here (no Docker engine on the machine), so its
//! structure is held to the rules instead: multi-stage, the final stage from a slim runtime
//! base with no compiler, cargo or -dev packages, the three binaries copied from the build
//! stage, and a numeric non-root USER so `runAsNonRoot` admission can verify it. The image this
//! project does build (deploy/image/build.sh, buildah) comes from deploy/image/Containerfile,
//! held here to the Dockerfile's final stage, so that both images are the same to a pod.

use kvindex_deploy_tests::tools::repo_root;

struct Stage {
    from: String,
    lines: Vec<String>,
}

/// Instructions per stage, continuation lines joined.
fn stages(text: &str) -> Vec<Stage> {
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        cur.push_str(t.trim_end_matches('\\'));
        cur.push(' ');
        if !t.ends_with('\\') {
            joined.push(std::mem::take(&mut cur));
        }
    }
    let mut out: Vec<Stage> = Vec::new();
    for ins in joined {
        if let Some(rest) = ins.strip_prefix("FROM ") {
            out.push(Stage { from: rest.trim().to_string(), lines: Vec::new() });
        } else if let Some(stage) = out.last_mut() {
            stage.lines.push(ins.trim().to_string());
        }
    }
    out
}

#[test]
fn final_stage_is_minimal_and_non_root() {
    let text = std::fs::read_to_string(repo_root().join("deploy/Dockerfile")).expect("read deploy/Dockerfile");
    let st = stages(&text);
    assert!(st.len() >= 2, "not multi-stage");
    let build = &st[0];
    assert!(build.from.contains("rust:"), "the build stage should start from a Rust image: {}", build.from);
    assert!(build.lines.iter().any(|l| l.contains("cargo build --release --locked")), "no locked release build");
    let last = st.last().unwrap();
    assert!(last.from.contains("-slim"), "final stage is not a slim base: {}", last.from);
    assert_no_build_tools(last);
    let users: Vec<&String> = last.lines.iter().filter(|l| l.starts_with("USER ")).collect();
    let user = users.last().expect("final stage has no USER");
    let uid = user.trim_start_matches("USER ").split(':').next().unwrap().trim();
    assert!(uid.parse::<u32>().is_ok_and(|u| u != 0), "USER must be a numeric non-root uid: {user}");
    let copy = last.lines.iter().find(|l| l.starts_with("COPY --from=build")).expect("no COPY --from=build");
    for bin in ["kvindex", "kvindex-router", "kvindex-tokenizer"] {
        assert!(copy.split_whitespace().any(|w| w.ends_with(&format!("/{bin}"))), "{bin} not copied: {copy}");
    }
    let apt = last.lines.iter().filter(|l| l.contains("apt-get install")).collect::<Vec<_>>();
    assert!(
        apt.iter().all(|l| l.contains("--no-install-recommends") && l.contains("rm -rf /var/lib/apt/lists")),
        "apt without cleanup: {apt:?}"
    );
}

fn assert_no_build_tools(stage: &Stage) {
    for l in &stage.lines {
        let lower = l.to_ascii_lowercase();
        for banned in ["cargo", "rustc", "rustup", "gcc", "g++", "clang", "build-essential", "make ", "-dev "] {
            assert!(!lower.contains(banned), "final stage has build tooling ({banned}): {l}");
        }
    }
}

/// What a pod sees of an image's configuration: user, workdir, ports, entrypoint, command.
fn runtime_config(stage: &Stage) -> Vec<&String> {
    let keys = ["USER ", "WORKDIR ", "EXPOSE ", "ENTRYPOINT ", "CMD "];
    stage.lines.iter().filter(|l| keys.iter().any(|k| l.starts_with(k))).collect()
}

#[test]
fn the_buildah_containerfile_is_the_dockerfiles_final_stage() {
    let read = |p: &str| std::fs::read_to_string(repo_root().join(p)).unwrap_or_else(|e| panic!("read {p}: {e}"));
    let docker = stages(&read("deploy/Dockerfile"));
    let buildah = stages(&read("deploy/image/Containerfile"));
    let (runtime, image) = (docker.last().unwrap(), &buildah[..]);
    assert_eq!(image.len(), 1, "the Containerfile is one stage on the base build.sh gives it");
    let image = &image[0];
    assert_eq!(image.from, "${BASE}", "the base is build.sh's (debootstrap's or --base)");
    assert_no_build_tools(image);
    assert_eq!(runtime_config(image), runtime_config(runtime), "user, workdir, ports, entrypoint or command differ");
    let state_dir = "mkdir -p /var/lib/kvindex && chown 65532:65532 /var/lib/kvindex";
    for (name, stage) in [("Dockerfile", runtime), ("Containerfile", image)] {
        assert!(stage.lines.iter().any(|l| l.contains(state_dir)), "{name}: no {state_dir:?}");
        let copy = stage.lines.iter().find(|l| l.starts_with("COPY ")).unwrap_or_else(|| panic!("{name}: no COPY"));
        let words: Vec<&str> = copy.split_whitespace().collect();
        assert_eq!(words.last(), Some(&"/usr/local/bin/"), "{name}: binaries not copied to /usr/local/bin/: {copy}");
        for bin in ["kvindex", "kvindex-router", "kvindex-tokenizer"] {
            assert!(words.iter().any(|w| w.rsplit('/').next() == Some(bin)), "{name}: {bin} not copied: {copy}");
        }
    }
}

#[test]
fn the_rule_check_sees_a_root_image() {
    let bad = "FROM rust:1 AS build\nRUN cargo build --release --locked\nFROM debian:bookworm-slim\nRUN apt-get install -y gcc\nUSER 0\n";
    let st = stages(bad);
    assert_eq!(st.len(), 2);
    assert!(st[1].lines.iter().any(|l| l.contains("gcc")));
    assert!(st[1].lines.iter().any(|l| l == "USER 0"));
}
