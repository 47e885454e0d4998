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

/// Sends `rows` (each `cols` wide) as one request; checks the answer is one value
/// per row and returns the values.
pub async fn infer_rows<R: AsRef<[f32]>>(
    h: &mesh_model_actor::VersionHandle,
    rows: &[R],
    cols: usize,
) -> Result<Vec<f32>, mesh_model_actor::ModelError> {
    let data: Vec<f32> = rows
        .iter()
        .flat_map(|r| r.as_ref().iter().copied())
        .collect();
    let batch = mesh_model_actor::Batch {
        rows: rows.len(),
        cols,
        data,
    };
    let out = h.infer(batch, deadline()).await?;
    assert_eq!((out.rows, out.cols), (rows.len(), 1));
    Ok(out.data)
}
