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

/// The example fraud_mlp in `dst` with the reference weights as version 1 only and
/// the policy `latest = 1` (the example serves two versions; these tests watch one
/// window move), each `(from, to)` of `edits` applied once to its model.toml. Every
/// line replaced must be there: a test does not run against an example that moved.
pub fn example_repo(dst: &Path, edits: &[(&str, &str)]) {
    let src = root().join("examples/models/fraud_mlp");
    std::fs::create_dir_all(dst.join("fraud_mlp")).expect("model directory");
    let mut toml = std::fs::read_to_string(src.join("model.toml")).expect("model.toml");
    for (from, to) in [("latest = 2", "latest = 1")].iter().chain(edits) {
        assert!(
            toml.contains(from),
            "the example's model.toml lost `{from}`"
        );
        toml = toml.replacen(from, to, 1);
    }
    std::fs::write(dst.join("fraud_mlp/model.toml"), toml).expect("model.toml");
    add_version(dst, 1);
}

/// Version `v` of fraud_mlp in the repository `dst`, with the reference weights.
pub fn add_version(dst: &Path, v: u64) {
    let vdir = dst.join(format!("fraud_mlp/{v}"));
    std::fs::create_dir_all(&vdir).expect("version directory");
    std::fs::copy(
        reference_dir().join("fraud_mlp.safetensors"),
        vdir.join("model.safetensors"),
    )
    .expect("weights");
}

/// Sends each of `rows` (32 features and the expected value) as its own request,
/// all in flight at once, so the batcher forms batches out of separate callers.
/// Returns the worst absolute error; every answer must be finite.
pub async fn worst_one_row_each(
    h: &std::sync::Arc<mesh_model_actor::VersionHandle>,
    rows: &[(Vec<f32>, f32)],
) -> f32 {
    let mut tasks = Vec::new();
    for (x, want) in rows.iter().cloned() {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let got = infer_rows(&h, &[x], 32).await.expect("one row");
            (got[0], want)
        }));
    }
    let mut worst = 0f32;
    for t in tasks {
        let (got, want) = t.await.expect("task");
        assert!(got.is_finite(), "{got}");
        worst = worst.max((got - want).abs());
    }
    worst
}

/// Sends `rows` as requests of `size` rows each. Returns the worst absolute error
/// and the answers in order; every answer must be finite.
pub async fn worst_in_batches(
    h: &mesh_model_actor::VersionHandle,
    rows: &[(Vec<f32>, f32)],
    size: usize,
) -> (f32, Vec<f32>) {
    let (mut worst, mut answers) = (0f32, Vec::new());
    for chunk in rows.chunks(size) {
        let x: Vec<&[f32]> = chunk.iter().map(|(x, _)| x.as_slice()).collect();
        let out = infer_rows(h, &x, 32).await.expect("batch");
        for (got, (_, want)) in out.iter().zip(chunk) {
            assert!(got.is_finite(), "{got}");
            worst = worst.max((got - want).abs());
        }
        answers.extend(out);
    }
    (worst, answers)
}

/// Asserts that the batcher combined requests: fewer forward passes than rows.
pub fn assert_batches_formed(h: &mesh_model_actor::VersionHandle) {
    use std::sync::atomic::Ordering::Relaxed;
    let executions = h.stats.execution_count.load(Relaxed);
    let rows = h.stats.inference_count.load(Relaxed);
    assert!(
        executions < rows,
        "{executions} executions for {rows} rows: no batch formed"
    );
}
