//! Fixtures the model-actor integration tests share: the repository root and the
//! reference fraud MLP's rows (tests/data/fraud-mlp, see its README).
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// tests/data/fraud-mlp.
pub fn reference_dir() -> PathBuf {
    root().join("tests/data/fraud-mlp")
}

/// The 1,000 reference rows: 32 features and scikit-learn's probability.
pub fn samples() -> Vec<(Vec<f32>, f32)> {
    let text = std::fs::read_to_string(reference_dir().join("samples.csv")).expect("samples.csv");
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let x = f[1..33]
                .iter()
                .map(|v| v.parse::<f32>().expect("feature"))
                .collect();
            (x, f[34].parse::<f32>().expect("expected_proba"))
        })
        .collect()
}

/// A deadline ten seconds from now.
pub fn deadline() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(10))
}
