//! Single-row latency (p50/p99) and rows/s at batch 1, 10, 100, 1000 for the reference
//! XGBoost and LightGBM models, on the 1,000 reference rows.
//!
//!     cargo bench -p mesh-trees --bench predict

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mesh_trees::Forest;

const FEATURES: usize = 34;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/fraud-trees")
}

fn rows() -> Vec<f32> {
    let text = std::fs::read_to_string(data_dir().join("samples.csv")).expect("samples.csv");
    let mut rows = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.is_empty()) {
        for c in line.split(',').skip(1).take(FEATURES) {
            rows.push(if c.is_empty() {
                f32::NAN
            } else {
                c.parse().expect("feature")
            });
        }
    }
    rows
}

fn models() -> Vec<(&'static str, Forest)> {
    let xgb = std::fs::read(data_dir().join("fraud_xgb.json")).expect("xgb");
    let lgbm = std::fs::read_to_string(data_dir().join("fraud_lgbm.txt")).expect("lgbm");
    vec![
        (
            "xgboost",
            Forest::from_xgboost_json(&xgb).expect("load xgb"),
        ),
        (
            "lightgbm",
            Forest::from_lightgbm_text(&lgbm).expect("load lgbm"),
        ),
    ]
}

/// p50 / p99 of single-row calls, each timed alone, over the reference rows.
fn percentiles(name: &str, forest: &Forest, rows: &[f32]) {
    let n = rows.len() / FEATURES;
    let mut out = [0.0f32];
    let mut times = Vec::with_capacity(20 * n);
    for _ in 0..3 {
        for r in rows.chunks_exact(FEATURES) {
            forest.predict(r, 1, &mut out).expect("predict");
        }
    }
    for _ in 0..20 {
        for r in rows.chunks_exact(FEATURES) {
            let t = Instant::now();
            forest.predict(black_box(r), 1, &mut out).expect("predict");
            times.push(t.elapsed());
            black_box(out[0]);
        }
    }
    times.sort_unstable();
    let p = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    eprintln!(
        "{name}: single row over {} calls: p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us",
        times.len(),
        us(p(0.5)),
        us(p(0.99)),
        us(p(0.999))
    );
}

fn bench(c: &mut Criterion) {
    let rows = rows();
    let n = rows.len() / FEATURES;
    for (name, forest) in models() {
        percentiles(name, &forest, &rows);
        let mut group = c.benchmark_group(format!("{name}/predict"));
        for batch in [1usize, 10, 100, 1000] {
            group.throughput(Throughput::Elements(batch as u64));
            let mut out = vec![0.0f32; batch];
            let mut start = 0usize;
            group.bench_function(format!("batch_{batch}"), |b| {
                b.iter(|| {
                    // Walk through the reference rows so every batch is different.
                    if start + batch > n {
                        start = 0;
                    }
                    let slice = &rows[start * FEATURES..(start + batch) * FEATURES];
                    forest
                        .predict(black_box(slice), batch, &mut out)
                        .expect("predict");
                    start += batch;
                    black_box(out[0])
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
