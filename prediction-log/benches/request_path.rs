//! What logging a decision costs the serving thread: `record` of an owned record built
//! from the caller's data (what the router did before `record_ref`: a copy of every
//! feature, its name shared) against `record_ref` from references, through a running
//! log. Calls are paced one every 60 µs (about 16,000/s, as a busy serving thread logs)
//! so the writer keeps up and the caches are as cold as between requests; only the call
//! itself is timed.
//!
//! cargo bench -p mesh-prediction-log --bench request_path

use criterion::{criterion_group, criterion_main, Criterion};
use mesh_prediction_log::{
    now_us, FeatureUsed, LogConfig, PredictionLog, PredictionRecord, Protocol, RecordRef, Role,
    StageMicros, VersionText,
};
use std::time::{Duration, Instant};

const GAP: Duration = Duration::from_micros(60);

/// Calls `log_one` with a new request id `iters` times, one call every [`GAP`]; returns
/// the time spent in the calls.
fn paced(iters: u64, n: &mut u64, mut log_one: impl FnMut(&str)) -> Duration {
    let mut spent = Duration::ZERO;
    for _ in 0..iters {
        *n += 1;
        let id = format!("req-{n:012}");
        let t0 = Instant::now();
        log_one(&id);
        spent += t0.elapsed();
        while t0.elapsed() < GAP {
            std::hint::spin_loop();
        }
    }
    spent
}

fn request_path(c: &mut Criterion) {
    // 40 features named like the example spec's (`view:feature`, about 17 bytes).
    let features: Vec<FeatureUsed> = (0..40)
        .map(|i| FeatureUsed {
            name: format!("card:feature_{i:04}").into(),
            value: Some(f64::from(i) * 0.5),
            status: "PRESENT".into(),
            event_time_us: Some(1_700_000_000_000_000),
        })
        .collect();
    let keys = vec![
        ("card_id".to_string(), "4242".to_string()),
        ("merchant_id".to_string(), "77".to_string()),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, writer) = PredictionLog::start(LogConfig::new(dir.path())).expect("start");
    let mut g = c.benchmark_group("request_path_40_features");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    let mut n = 0u64;
    g.bench_function("record_owned", |b| {
        b.iter_custom(|iters| {
            paced(iters, &mut n, |id| {
                let mut rec = PredictionRecord::new(id, "fraud", 3.to_string(), Role::Primary);
                rec.entity_keys = keys.clone();
                rec.features = Some(features.clone());
                rec.score = Some(0.5);
                rec.decision = Some("approve".to_owned());
                rec.source = "MODEL".to_owned();
                log.record(rec);
            })
        })
    });
    g.bench_function("record_ref", |b| {
        b.iter_custom(|iters| {
            paced(iters, &mut n, |id| {
                let version = VersionText::new(Some(3));
                log.record_ref(&RecordRef {
                    request_id: id,
                    ts_us: now_us(),
                    model: "fraud",
                    version: version.as_str(),
                    role: Role::Primary,
                    protocol: Protocol::Decide,
                    entity_keys: &keys,
                    features: Some(&features),
                    score: Some(0.5),
                    decision: Some("approve"),
                    source: "MODEL",
                    stages: StageMicros::default(),
                });
            })
        })
    });
    g.finish();
    let stats = log.shutdown_blocking();
    writer.join().expect("writer");
    assert_eq!(
        stats.dropped, 0,
        "the paced calls must not outrun the writer"
    );
}

criterion_group!(benches, request_path);
criterion_main!(benches);
