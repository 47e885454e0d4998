//! Sustained throughput of the prediction log writer: records/s from `record_wait` through
//! the wal to closed Parquet segments (shutdown included, so conversion is paid for).
//!
//! cargo bench -p mesh-prediction-log --bench writer

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mesh_prediction_log::{
    source, FeatureUsed, LogConfig, PredictionLog, PredictionRecord, Role, StageMicros,
};
use std::time::{Duration, Instant};

fn record(i: u64, features: usize) -> PredictionRecord {
    let mut r = PredictionRecord::new(format!("req-{i:012}"), "fraud", "3", Role::Primary);
    r.entity_keys = vec![("card_id".into(), format!("card-{}", i % 10_000))];
    r.features = Some(
        (0..features)
            .map(|f| FeatureUsed {
                name: format!("feature_{f}").into(),
                value: Some(i as f64 * 0.25),
                status: "PRESENT".into(),
                event_time_us: Some(r.ts_us - 1_000_000),
            })
            .collect(),
    );
    r.score = Some((i % 1000) as f64 / 1000.0);
    r.decision = Some("approve".into());
    r.source = source::MODEL.into();
    r.stages = StageMicros {
        validate: 3,
        features: 40,
        preprocess: 5,
        queue: 80,
        compute: 30,
        postprocess: 2,
        total: 170,
    };
    r
}

fn sustained(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("writer");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    const N: u64 = 100_000;
    for features in [0usize, 8] {
        g.throughput(Throughput::Elements(N));
        g.bench_function(format!("sustained_{N}_records_{features}_features"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().expect("tempdir");
                    let recs: Vec<_> = (0..N).map(|i| record(i, features)).collect();
                    let mut cfg = LogConfig::new(dir.path());
                    cfg.segment_max_bytes = 32 << 20;
                    let start = Instant::now();
                    rt.block_on(async {
                        let (log, writer) = PredictionLog::start(cfg).expect("start");
                        for r in recs {
                            log.record_wait(r).await.expect("record");
                        }
                        log.shutdown().await.expect("shutdown");
                        writer.join().expect("join");
                    });
                    total += start.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, sustained);
criterion_main!(benches);
