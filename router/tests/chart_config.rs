//! The Helm chart's rendered configuration is one the mesh accepts: the
//! `mesh.toml` (and `views.toml`) of every golden file in `deploy/helm/golden/`
//! (the chart rendered with each value set of `deploy/helm/values/`, kept current
//! by `deploy/check.sh`) parses with the mesh's own types, uses no deprecated
//! spelling, and its decision settings validate.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use mesh_router::config::MeshConfig;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy/helm/golden")
}

/// The text of the block scalar `  <key>: |` of a ConfigMap's data, unindented.
/// The golden files are written by `helm template`, which indents data entries
/// by two spaces and their block contents by four.
fn data_block(yaml: &str, key: &str) -> Option<String> {
    let header = format!("  {key}: |");
    let mut lines = yaml.lines().skip_while(|l| *l != header);
    lines.next()?;
    let mut out = String::new();
    for l in lines {
        if let Some(body) = l.strip_prefix("    ") {
            out.push_str(body);
        } else if l.trim().is_empty() {
            // a blank line inside the block
        } else {
            break;
        }
        out.push('\n');
    }
    Some(out)
}

#[test]
fn every_golden_mesh_toml_is_accepted_by_the_mesh() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "golden files: {files:?}");
    let mut failures = Vec::new();
    let mut views_checked = 0;
    for f in &files {
        let yaml = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let Some(text) = data_block(&yaml, "mesh.toml") else {
            failures.push(format!("{name}: no mesh.toml in its ConfigMap"));
            continue;
        };
        match MeshConfig::from_toml(&text) {
            Ok(cfg) => {
                if !cfg.deprecations.is_empty() {
                    failures.push(format!(
                        "{name}: deprecated spellings {:?}",
                        cfg.deprecations
                    ));
                }
                if let Err(e) = cfg.decisions.validate() {
                    failures.push(format!("{name}: [decisions]: {e}"));
                }
            }
            Err(e) => failures.push(format!("{name}: mesh.toml does not parse: {e}\n{text}")),
        }
        if let Some(views) = data_block(&yaml, "views.toml") {
            views_checked += 1;
            if let Err(e) = mesh_feature_store::ViewsConfig::from_toml_str(&views) {
                failures.push(format!("{name}: views.toml does not parse: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(views_checked >= 1, "no golden file ships a views.toml");
}

#[test]
fn the_block_reader_finds_what_the_chart_writes() {
    let yaml = "data:\n  mesh.toml: |\n    [server]\n    \n    compute_threads = 2\n  views.toml: |\n    [[views]]\n---\nkind: X\n";
    assert_eq!(
        data_block(yaml, "mesh.toml").unwrap(),
        "[server]\n\ncompute_threads = 2\n"
    );
    assert_eq!(data_block(yaml, "views.toml").unwrap(), "[[views]]\n");
    assert!(data_block(yaml, "other.toml").is_none());
    // A wrong key would be refused, so the test above can fail.
    assert!(MeshConfig::from_toml("[server]\ngrpc_prot = 1\n").is_err());
}
