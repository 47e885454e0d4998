//! Fixtures the router's integration tests share: the repository root, the
//! reference model and its holdout rows (tests/data/fraud-mlp, see its README), and
//! model directories built from the example model's config.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The reference model's weights.
pub fn reference_weights() -> PathBuf {
    root().join("tests/data/fraud-mlp/fraud_mlp.safetensors")
}

/// The 1,000 reference rows: 32 features and the probability scikit-learn computed
/// (tolerance 1e-5 absolute).
pub fn samples() -> Vec<(Vec<f32>, f32)> {
    let text = std::fs::read_to_string(root().join("tests/data/fraud-mlp/samples.csv"))
        .expect("tests/data/fraud-mlp/samples.csv");
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[1..33].iter().map(|v| v.parse().unwrap()).collect(),
                f[34].parse().unwrap(),
            )
        })
        .collect()
}

/// The example model's `model.toml` without its `[input_spec]` (tests bring their own).
pub fn example_model_part() -> String {
    let text = std::fs::read_to_string(root().join("examples/models/fraud_mlp/model.toml"))
        .expect("examples/models/fraud_mlp/model.toml");
    text.split("[input_spec]")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Writes `<repo>/fraud_mlp/` with the reference weights as each of `versions` and
/// `model_toml` as its config; returns the repository directory.
pub fn model_repo(repo: &Path, versions: &[u64], model_toml: &str) -> PathBuf {
    let m = repo.join("fraud_mlp");
    for v in versions {
        std::fs::create_dir_all(m.join(v.to_string())).unwrap();
        std::fs::copy(
            reference_weights(),
            m.join(format!("{v}/model.safetensors")),
        )
        .unwrap();
    }
    std::fs::write(m.join("model.toml"), model_toml).unwrap();
    repo.to_path_buf()
}
