//! Versions behave as documented: with `latest = 2`, a broken newest version fails
//! to load and never unloads a serving one; once it is fixed, the policy's window
//! moves on. Reference weights: tests/data/fraud-mlp.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;
use common::{add_version, root};

use std::path::Path;

use mesh_model_actor::{ActorSystem, Batch, ModelRepository};

/// The example fraud_mlp model (its policy: `latest = 2`) with the given versions.
fn repo_with(dst: &Path, versions: &[u64]) {
    let src = root().join("examples/models/fraud_mlp");
    let toml = std::fs::read_to_string(src.join("model.toml")).unwrap();
    assert!(
        toml.contains("latest = 2"),
        "the example's version policy moved"
    );
    std::fs::create_dir_all(dst.join("fraud_mlp")).unwrap();
    std::fs::write(dst.join("fraud_mlp/model.toml"), toml).unwrap();
    for v in versions {
        add_version(dst, *v);
    }
}

fn served(repo: &ModelRepository) -> Vec<u64> {
    repo.model("fraud_mlp")
        .unwrap()
        .versions
        .keys()
        .copied()
        .collect()
}

async fn answers(repo: &ModelRepository, version: u64) {
    let h = repo.get("fraud_mlp", Some(version)).unwrap();
    let out = h
        .infer(
            Batch {
                rows: 1,
                cols: 32,
                data: vec![0.1; 32],
            },
            None,
        )
        .await
        .unwrap();
    assert!(
        (0.0..=1.0).contains(&out.data[0]),
        "v{version}: {:?}",
        out.data
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_newest_version_never_unloads_a_serving_one() {
    let dir = tempfile::tempdir().unwrap();
    repo_with(dir.path(), &[1, 2]);
    let repo = ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap();
    repo.load_all().await.unwrap();
    assert_eq!(served(&repo), vec![1, 2]);

    // v3 arrives broken: its load fails, and v1 (which the policy would drop to
    // make room for v3) keeps serving next to v2.
    let v3 = dir.path().join("fraud_mlp/3");
    std::fs::create_dir_all(&v3).unwrap();
    std::fs::write(v3.join("model.safetensors"), b"not safetensors").unwrap();
    let e = repo.load("fraud_mlp").await.unwrap_err().to_string();
    assert!(e.contains('3'), "{e}");
    assert_eq!(served(&repo), vec![1, 2]);
    assert_eq!(repo.get("fraud_mlp", None).unwrap().version, 2);
    answers(&repo, 1).await;
    answers(&repo, 2).await;
    let index = repo.index();
    let state = |v: u64| {
        index
            .iter()
            .find(|e| e.version == v)
            .map(|e| (e.state, e.reason.clone()))
            .unwrap()
    };
    assert_eq!(state(1).0, "READY");
    assert_eq!(state(2).0, "READY");
    assert_eq!(state(3).0, "UNAVAILABLE");
    assert!(!state(3).1.is_empty(), "the index says why v3 failed");

    // Loading again with v3 still broken changes nothing.
    repo.load("fraud_mlp").await.unwrap_err();
    assert_eq!(served(&repo), vec![1, 2]);

    // v3 fixed: the window moves to v2, v3 and v1 is unloaded.
    add_version(dir.path(), 3);
    assert_eq!(repo.load("fraud_mlp").await.unwrap(), vec![2, 3]);
    assert_eq!(served(&repo), vec![2, 3]);
    assert_eq!(repo.get("fraud_mlp", None).unwrap().version, 3);
    assert!(repo.get("fraud_mlp", Some(1)).is_err());
    answers(&repo, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_version_at_start_serves_the_ones_that_load() {
    // Nothing served yet: v2 broken, v1 fine -> v1 serves, the error is reported.
    let dir = tempfile::tempdir().unwrap();
    repo_with(dir.path(), &[1]);
    let v2 = dir.path().join("fraud_mlp/2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::write(v2.join("model.safetensors"), b"broken").unwrap();
    let repo = ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap();
    assert!(repo.load("fraud_mlp").await.is_err());
    assert_eq!(served(&repo), vec![1]);
    answers(&repo, 1).await;
}
