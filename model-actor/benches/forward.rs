//! The MLP forward pass in process, the number that moves with the CPU features a
//! build targets (README, "CPU targets"): the example fraud MLP (32-64-32-1) at batch
//! 1 and 64, and a compute-heavy MLP (32-1024-1024-1, random weights) at batch 64.
//! Also the fraud MLP at 1, 4, 16 and 64 rows through candle only and through the
//! direct path (`mlp::DIRECT_MAX_MACS`; forced here up to 64 rows), side by side.
//!
//! Built with the `cuda` feature, a `gpu` group adds both models on `cuda:0` against
//! the CPU at 1, 64 and 1,024 rows, each pass from host rows to host answers (the
//! copies in and out included, as the actor runs it).
//!
//!     cargo bench -p mesh-model-actor --bench forward
//!     RUSTFLAGS="-C target-cpu=x86-64-v3" cargo bench -p mesh-model-actor --bench forward
//!     cargo bench -p mesh-model-actor --features cuda --bench forward -- gpu
use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use mesh_model_actor::mlp::Mlp;
use mesh_model_actor::repository::build_factory;
use mesh_model_actor::{Batch, Model, ModelConfig};

fn load(dir: &Path) -> Box<dyn Model> {
    let config = ModelConfig::load(dir).expect("model.toml");
    build_factory(&config, &dir.join("1")).expect("weights")()
}

/// The example's model.toml with the model on `device` (a GPU computes no batch
/// inline on the caller's thread, which the configuration refuses).
fn toml_on(device: &str) -> String {
    let toml = std::fs::read_to_string(example_dir().join("model.toml")).expect("model.toml");
    if device == "cpu" {
        return toml;
    }
    toml.replacen("device = \"cpu\"", &format!("device = \"{device}\""), 1)
        .replacen("inline_below_us = 50", "", 1)
}

/// `tmp/<name>-<device>` with `toml_on(device)` and an empty version 1.
fn model_dir(tmp: &Path, name: &str, device: &str) -> PathBuf {
    let dir = tmp.join(format!("{name}-{device}"));
    std::fs::create_dir_all(dir.join("1")).expect("dir");
    std::fs::write(dir.join("model.toml"), toml_on(device)).expect("model.toml");
    dir
}

/// A 32-1024-1024-1 MLP with seeded random weights on `device`, in a temporary
/// repository.
fn heavy(tmp: &Path, device: &str) -> Box<dyn Model> {
    let dir = model_dir(tmp, "heavy", device);
    let widths = [32, 1024, 1024, 1];
    let mut tensors = HashMap::new();
    for (i, w) in widths.windows(2).enumerate() {
        let scale = (1.0 / w[0] as f64).sqrt();
        let weight = Tensor::randn(0f32, scale as f32, (w[1], w[0]), &Device::Cpu).expect("randn");
        let bias = Tensor::zeros(w[1], candle_core::DType::F32, &Device::Cpu).expect("zeros");
        tensors.insert(format!("l{i}.weight"), weight);
        tensors.insert(format!("l{i}.bias"), bias);
    }
    candle_core::safetensors::save(&tensors, dir.join("1/model.safetensors")).expect("save");
    load(&dir)
}

fn example_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models/fraud_mlp")
}

fn batch(rows: usize) -> Batch {
    let data = (0..rows * 32)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect();
    Batch {
        rows,
        cols: 32,
        data,
    }
}

/// Each of `models` at each of `rows`, the models side by side at each size.
fn side_by_side(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rows: &[usize],
    models: &mut [(&str, Box<dyn Model>)],
) {
    for &rows in rows {
        let b = batch(rows);
        g.throughput(Throughput::Elements(rows as u64));
        for (name, model) in models.iter_mut() {
            g.bench_function(format!("{name}/batch{rows}"), |bench| {
                bench.iter(|| black_box(model.forward(black_box(&b)).expect("forward")))
            });
        }
    }
}

fn forward(c: &mut Criterion) {
    // One thread per forward pass, as `mesh serve` runs it (`compute_threads = 1`).
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut models = [
        ("fraud_mlp", load(&example_dir())),
        ("heavy_mlp", heavy(tmp.path(), "cpu")),
    ];
    let mut g = c.benchmark_group("forward");
    for (name, model) in models.iter_mut() {
        for rows in [1usize, 64] {
            if *name == "heavy_mlp" && rows == 1 {
                continue;
            }
            let b = batch(rows);
            g.throughput(Throughput::Elements(rows as u64));
            g.bench_function(format!("{name}/batch{rows}"), |bench| {
                bench.iter(|| black_box(model.forward(black_box(&b)).expect("forward")))
            });
        }
    }
    // Candle only against the direct path, at the same rows.
    let dir = example_dir();
    let config = ModelConfig::load(&dir).expect("model.toml");
    let mlp = Mlp::load(
        &dir.join("1/model.safetensors"),
        config.mlp.as_ref().expect("[mlp]"),
        config.dtype,
        &Device::Cpu,
        32,
        1,
    )
    .expect("weights");
    // The direct path forced up to 64 rows, to show where candle's kernels win.
    let mut paths: [(&str, Box<dyn Model>); 2] = [
        ("fraud_mlp_candle", Box::new(mlp.clone().candle_only())),
        ("fraud_mlp_direct", Box::new(mlp.with_direct_rows(64))),
    ];
    side_by_side(&mut g, &[1, 4, 16, 64], &mut paths);
    g.finish();
}

/// Both models on `cuda:0` against the CPU, at batch sizes where each side wins.
#[cfg(feature = "cuda")]
fn gpu(c: &mut Criterion) {
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let tmp = tempfile::tempdir().expect("tempdir");
    let fraud_on = |device: &str| {
        let dir = model_dir(tmp.path(), "fraud", device);
        std::fs::copy(
            example_dir().join("1/model.safetensors"),
            dir.join("1/model.safetensors"),
        )
        .expect("weights");
        load(&dir)
    };
    let mut models = [
        ("fraud_mlp_cpu", fraud_on("cpu")),
        ("fraud_mlp_cuda", fraud_on("cuda:0")),
        ("heavy_mlp_cpu", heavy(tmp.path(), "cpu")),
        ("heavy_mlp_cuda", heavy(tmp.path(), "cuda:0")),
    ];
    let mut g = c.benchmark_group("gpu");
    side_by_side(&mut g, &[1, 64, 1024], &mut models);
    g.finish();
}

#[cfg(feature = "cuda")]
criterion_group!(benches, forward, gpu);
#[cfg(not(feature = "cuda"))]
criterion_group!(benches, forward);
criterion_main!(benches);
