//! Compiles every `.proto` under this crate with a vendored `protoc`, so a fresh machine
//! needs no system protobuf compiler, and writes one descriptor set for gRPC reflection.
use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; tonic-prost-build reads PROTOC from the env.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let mut protos = Vec::new();
    for top in ["kvindex", "tokenization", "indexer"] {
        collect(&root.join(top), &mut protos);
    }
    protos.sort();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("descriptor.bin"))
        .compile_protos(&protos, std::slice::from_ref(&root))?;
    // The directories too: cargo rescans a directory for any change, so a `.proto` added by a
    // merge or a checkout (whose file time can be older than the last build) is compiled.
    for top in ["kvindex", "tokenization", "indexer"] {
        println!("cargo:rerun-if-changed={}", root.join(top).display());
    }
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
