//! The reference fraud model through the whole actor path: every row of
//! samples.csv reproduces scikit-learn's probability within 1e-5, one row per
//! request and in batches of several sizes, and hot loading works.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use mesh_model_actor::{ActorSystem, Batch, ModelError, ModelRepository};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reproduces_expected_proba_one_row_and_batched() {
    let dir = tempfile::tempdir().unwrap();
    example_repo(dir.path(), &[]);
    let repo = ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap();
    repo.load_all().await.unwrap();
    let h = repo.get("fraud_mlp", None).unwrap();
    assert_eq!(h.version, 1);
    let rows = samples();
    assert_eq!(rows.len(), 1000);

    // One row per request, many requests in flight at once so the batcher forms
    // batches out of separate callers.
    let worst = worst_one_row_each(&h, &rows).await;
    assert!(worst <= 1e-5, "one-row max abs error {worst}");

    // Batches of several sizes in one request each.
    for size in [2usize, 7, 32, 64] {
        let (worst, _) = worst_in_batches(&h, &rows, size).await;
        assert!(worst <= 1e-5, "batches of {size}: max abs error {worst}");
    }
    assert_batches_formed(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    example_repo(dir.path(), &[]);
    let repo = ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap();
    repo.load_all().await.unwrap();
    let h = repo.get("fraud_mlp", None).unwrap();
    let too_many = h
        .infer(
            Batch {
                rows: 65,
                cols: 32,
                data: vec![0.0; 65 * 32],
            },
            deadline(),
        )
        .await;
    assert!(matches!(too_many, Err(ModelError::InvalidInput(m)) if m.contains("64")));
    let short = h
        .infer(
            Batch {
                rows: 1,
                cols: 32,
                data: vec![0.0; 31],
            },
            deadline(),
        )
        .await;
    assert!(matches!(short, Err(ModelError::InvalidInput(_))));
    assert!(matches!(
        repo.get("nope", None),
        Err(ModelError::ModelNotFound(_))
    ));
    assert!(matches!(
        repo.get("fraud_mlp", Some(9)),
        Err(ModelError::VersionNotFound { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_load_under_load_fails_nothing_and_a_broken_version_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    example_repo(dir.path(), &[]);
    let repo = Arc::new(ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap());
    repo.load_all().await.unwrap();
    let rows = samples();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (repo, stop, rows) = (repo.clone(), stop.clone(), rows.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut versions) = (0u64, std::collections::BTreeSet::new());
            let mut i = w;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (x, want) = &rows[i % rows.len()];
                let h = repo
                    .get("fraud_mlp", None)
                    .expect("a ready version at every moment");
                let out = h
                    .infer(
                        Batch {
                            rows: 1,
                            cols: 32,
                            data: x.clone(),
                        },
                        deadline(),
                    )
                    .await
                    .expect("no failed request");
                assert!((out.data[0] - want).abs() <= 1e-5);
                versions.insert(out.version);
                ok += 1;
                i += 8;
            }
            (ok, versions)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Version 2 (same weights) appears; the policy (latest 1) moves to it.
    let v2 = dir.path().join("fraud_mlp/2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::copy(
        reference_dir().join("fraud_mlp.safetensors"),
        v2.join("model.safetensors"),
    )
    .unwrap();
    assert_eq!(repo.load("fraud_mlp").await.unwrap(), vec![2]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Version 3 is broken: its load fails and version 2 keeps serving.
    let v3 = dir.path().join("fraud_mlp/3");
    std::fs::create_dir_all(&v3).unwrap();
    std::fs::write(v3.join("model.safetensors"), b"not a safetensors file").unwrap();
    let err = repo.load("fraud_mlp").await.unwrap_err();
    assert!(matches!(err, ModelError::Load { version: 3, .. }), "{err}");
    assert_eq!(repo.get("fraud_mlp", None).unwrap().version, 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    let mut seen = std::collections::BTreeSet::new();
    for w in workers {
        let (ok, v) = w.await.unwrap();
        total += ok;
        seen.extend(v);
    }
    assert!(total > 100, "only {total} requests ran");
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 2]);
    let index = repo.index();
    assert!(index
        .iter()
        .any(|e| e.version == 3 && e.state == "UNAVAILABLE" && !e.reason.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_precision_weights_stay_close_to_the_reference() {
    let rows = samples();
    for (dtype, tolerance) in [("f16", 5e-3f32), ("bf16", 5e-2f32)] {
        let dir = tempfile::tempdir().unwrap();
        let dtype_line = format!("dtype = \"{dtype}\"");
        example_repo(dir.path(), &[("dtype = \"f32\"", &dtype_line)]);
        let repo = ModelRepository::new(dir.path(), ActorSystem::start().unwrap()).unwrap();
        repo.load_all().await.unwrap();
        let h = repo.get("fraud_mlp", None).unwrap();
        let (worst, _) = worst_in_batches(&h, &rows[..256], 64).await;
        println!("{dtype}: max abs error {worst}");
        assert!(worst <= tolerance, "{dtype}: max abs error {worst}");
        // Not the f32 path in disguise: some rounding must show.
        assert!(worst > 1e-6, "{dtype}: error {worst} suspiciously small");
    }
}

/// A load that must not hurt what is serving: weights with NaN, weights that link
/// outside the version directory, and a model.toml over a size bound are each
/// refused with a message that names the problem (and not the host's absolute
/// path), and version 1 keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_loads_are_refused_and_the_serving_version_stays() {
    let dir = tempfile::tempdir().unwrap();
    example_repo(dir.path(), &[]);
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load("fraud_mlp").await.unwrap();
    let m = dir.path().join("fraud_mlp");
    let serving = |repo: &ModelRepository| repo.get("fraud_mlp", None).map(|h| h.version);
    assert_eq!(serving(&repo).unwrap(), 1);

    // Version 2: the reference weights with one NaN in a bias.
    let mut tensors = candle_core::safetensors::load(
        reference_dir().join("fraud_mlp.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let mut bias: Vec<f32> = tensors["l1.bias"].to_vec1().unwrap();
    bias[3] = f32::NAN;
    tensors.insert(
        "l1.bias".into(),
        candle_core::Tensor::from_vec(bias, 32, &candle_core::Device::Cpu).unwrap(),
    );
    std::fs::create_dir_all(m.join("2")).unwrap();
    candle_core::safetensors::save(&tensors, m.join("2/model.safetensors")).unwrap();
    let err = repo.load("fraud_mlp").await.unwrap_err().to_string();
    assert!(err.contains("l1.bias") && err.contains("NaN"), "{err}");
    assert_eq!(serving(&repo).unwrap(), 1);
    std::fs::remove_dir_all(m.join("2")).unwrap();

    // Version 3: the weights are a link to a file outside the version directory.
    let outside = dir.path().join("elsewhere.safetensors");
    std::fs::copy(reference_dir().join("fraud_mlp.safetensors"), &outside).unwrap();
    std::fs::create_dir_all(m.join("3")).unwrap();
    std::os::unix::fs::symlink(&outside, m.join("3/model.safetensors")).unwrap();
    let err = repo.load("fraud_mlp").await.unwrap_err().to_string();
    assert!(err.contains("outside the version directory"), "{err}");
    assert!(
        !err.contains(&dir.path().display().to_string()),
        "the message shows the host path: {err}"
    );
    assert_eq!(serving(&repo).unwrap(), 1);
    std::fs::remove_dir_all(m.join("3")).unwrap();

    // A model.toml that asks for a warmup of 10^12 rows: refused at parse time.
    let toml = std::fs::read_to_string(m.join("model.toml")).unwrap();
    std::fs::write(
        m.join("model.toml"),
        toml.replace("\nbatch_size = 16", "\nbatch_size = 1000000000000"),
    )
    .unwrap();
    let err = repo.load("fraud_mlp").await.unwrap_err().to_string();
    assert!(
        err.contains("[warmup] batch_size") && err.contains("over the limit"),
        "{err}"
    );
    assert_eq!(serving(&repo).unwrap(), 1);
    let h = repo.get("fraud_mlp", None).unwrap();
    let out = h
        .infer(
            Batch {
                rows: 1,
                cols: 32,
                data: vec![0.0; 32],
            },
            deadline(),
        )
        .await
        .unwrap();
    assert!(out.data[0].is_finite());
    system.stop();
}
