//! The Parquet encoder alone: records/s through `write_parquet` (the log's own column
//! writer, the one its encoder thread fills as records arrive: pages, dictionaries,
//! Snappy, row groups and the footer), against `write_parquet_arrow` (the Arrow writer
//! with the settings the log used before, as the baseline), in the same run, with records shaped like the ones `mesh serve` logs
//! for the example spec's decisions: 30 features (the card and merchant views' values
//! with their event times, request floats of full precision), two entity keys, a score,
//! the stage times. The time measured is the thread's CPU time (elsewhere than Linux,
//! wall time). Prints the file's size per record once.
//!
//! A third figure feeds the log's writer as its encoder thread does
//! (`log_writer_from_wal_frames`): runs of wal frames, made just before (so in cache,
//! as the serving threads' frames are), decoded in place into the columns. It is the
//! one to read for the encoder's cost in the server: the first two read their records
//! from 32,768 of them in memory, and in `perf` more than a tenth of their time is
//! spent waiting for those loads.
//!
//! cargo bench -p mesh-prediction-log --bench encode

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mesh_prediction_log::{
    source, write_parquet, write_parquet_arrow, FeatureUsed, FrameEncoder, FrameMaker,
    PredictionRecord, Protocol, Role, StageMicros,
};
use std::sync::Arc;
use std::time::Duration;

/// The allocator `mesh serve` runs with: how the encoder's memory is reused, or given
/// back and faulted in again, depends on it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const N: usize = 32 * 1024;

#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

fn records() -> Vec<PredictionRecord> {
    let card = [
        "txn_count_1h",
        "txn_count_24h",
        "amount_sum_24h",
        "avg_amount_30d",
        "max_amount_7d",
        "distinct_merchants_7d",
        "declined_count_24h",
    ];
    let merchant = [
        "chargeback_rate_90d",
        "refund_rate_30d",
        "txn_count_24h",
        "avg_ticket_30d",
        "risk_tier",
        "is_high_risk_mcc",
    ];
    // Names are shared, as the router's spec shares them.
    let name = Arc::<str>::from;
    let card: Vec<Arc<str>> = card.iter().map(|f| name(format!("card:{f}"))).collect();
    let merchant: Vec<Arc<str>> = merchant
        .iter()
        .map(|f| name(format!("merchant:{f}")))
        .collect();
    let request: Vec<Arc<str>> = std::iter::once("amount".to_string())
        .chain(std::iter::once("merchant_category".to_string()))
        .chain((18..32).map(|i| format!("f{i}")))
        .map(|f| name(format!("request:{f}")))
        .collect();
    let mut rng = Rng(7);
    let t0 = 1_796_170_000_000_000i64;
    (0..N)
        .map(|i| {
            let ts = t0 + i as i64 * 80;
            let card_id = rng.next() % 10_000;
            let merchant_id = rng.next() % 1_000;
            let mut r =
                PredictionRecord::new(format!("bench-{i}"), "fraud_mlp", "2", Role::Primary);
            r.ts_us = ts;
            r.protocol = Protocol::Decide;
            r.entity_keys = vec![
                ("merchant_id".into(), format!("m{merchant_id:06}")),
                ("card_id".into(), card_id.to_string()),
            ];
            // Event times: one per entity, as a view's row carries one.
            let card_time = t0 - (card_id as i64 % 3_600) * 1_000_000;
            let merchant_time = t0 - 36_000_000_000 - merchant_id as i64 * 1_000_000;
            let stored = |names: &[Arc<str>], time: i64, rng: &mut Rng| {
                names
                    .iter()
                    .map(|n| FeatureUsed {
                        name: n.clone(),
                        // Stored values are f32: fewer distinct bit patterns.
                        value: Some(f64::from((rng.unit() * 500.0) as f32)),
                        status: "PRESENT".into(),
                        event_time_us: Some(time),
                    })
                    .collect::<Vec<_>>()
            };
            let mut features = stored(&card, card_time, &mut rng);
            features.extend(stored(&merchant, merchant_time, &mut rng));
            features.extend(request.iter().map(|n| FeatureUsed {
                name: n.clone(),
                value: Some(rng.unit() * 2.0 - 1.0),
                status: "PRESENT".into(),
                event_time_us: None,
            }));
            r.features = Some(features);
            r.score = Some(rng.unit());
            r.decision = Some(
                if rng.unit() < 0.1 {
                    "decline"
                } else {
                    "approve"
                }
                .into(),
            );
            r.source = source::MODEL.into();
            r.stages = StageMicros {
                validate: 0,
                features: 20 + rng.next() % 40,
                preprocess: 2,
                queue: 0,
                compute: rng.next() % 3,
                postprocess: 0,
                total: 40 + rng.next() % 60,
            };
            r
        })
        .collect()
}

// CPU time of this thread: what the encoding takes from the serving threads (the file's
// fsync at the end is a wait, not CPU, and its length is the disk's).
use cpu::thread_cpu as cpu_time;

/// A function that writes records to a Parquet file.
type WriteFn = fn(&std::path::Path, &[PredictionRecord]) -> mesh_prediction_log::Result<()>;

fn encode(c: &mut Criterion) {
    let recs = records();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bench.parquet");
    let writers: [(&str, WriteFn); 2] = [
        ("log_writer", write_parquet),
        ("arrow_writer_baseline", write_parquet_arrow),
    ];
    for (name, write) in writers {
        write(&path, &recs).expect("write");
        let bytes = std::fs::metadata(&path).expect("metadata").len();
        eprintln!(
            "encode: {name}: {N} records of 30 features, {:.1} bytes a record",
            bytes as f64 / N as f64
        );
    }
    let mut g = c.benchmark_group("encode");
    g.sample_size(10).measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Elements(N as u64));
    for (name, write) in writers {
        g.bench_function(format!("{name}_{N}_records_30_features"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = cpu_time();
                    write(&path, &recs).expect("write");
                    total += cpu_time() - t;
                }
                total
            })
        });
    }
    // As the encoder thread runs: slices of wal frames that the serving threads just
    // made (so in cache, as there), each decoded in place into the columns. Only the
    // decoding and encoding are timed, not the making of the frames.
    g.bench_function(
        format!("log_writer_from_wal_frames_{N}_records_30_features"),
        |b| {
            let mut frames = Vec::new();
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = cpu_time();
                    let mut enc = FrameEncoder::create(&path).expect("create");
                    total += cpu_time() - t;
                    let mut maker = FrameMaker::default();
                    for slice in recs.chunks(SLICE) {
                        frames.clear();
                        maker.push_frames(slice, &mut frames);
                        let t = cpu_time();
                        enc.append_frames(&frames).expect("append");
                        total += cpu_time() - t;
                    }
                    let t = cpu_time();
                    enc.finish().expect("finish");
                    total += cpu_time() - t;
                }
                total
            })
        },
    );
    g.finish();
}

/// Records in one run of the writer's queue, as the encoder gets them: what the writer
/// takes every few milliseconds, at 15,000 records/s about 50-100. (The thread's clock
/// is read twice a run, about 1% of what is timed.)
const SLICE: usize = 64;

criterion_group!(benches, encode);
criterion_main!(benches);
