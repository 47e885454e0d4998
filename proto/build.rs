//! Generates the tonic/prost code for every `.proto` under `proto/`, plus one file
//! descriptor set that the gRPC reflection service serves.
use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // A vendored protoc, so a fresh machine needs no system package.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single-threaded when this runs.
    std::env::set_var("PROTOC", protoc);

    let root = PathBuf::from("proto");
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Every service and client checks a request's repeated fields on the wire
        // before decoding it (src/guard.rs).
        .codec_path("crate::guard::GuardedCodec")
        .file_descriptor_set_path(out_dir.join("mesh_descriptor.bin"))
        .compile_protos(&files, &[root])?;
    Ok(())
}
