//! What logging a decision costs the serving thread: `record` of an owned record built
//! from the caller's data (what the router did before `record_ref`) against `record_ref`
//! from references, through a running log. Calls are paced one every 60 µs (about
//! 16,000/s, as a busy serving thread logs) so the writer keeps up and the caches are as
//! cold as between requests; only the call itself is timed.
//!
//! cargo bench -p mesh-prediction-log --bench request_path

use criterion::{criterion_group, criterion_main, Criterion};
use mesh_prediction_log::{
    now_us, FeatureUsed, LogConfig, LoggedFeature, PredictionLog, PredictionRecord, Protocol,
    RecordRef, Role, StageMicros, VersionText,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A caller's own feature type (the router's is like it).
struct Used {
    name: Arc<str>,
    value: Option<f64>,
    status: &'static str,
    event_time_us: Option<i64>,
}

impl LoggedFeature for Used {
    fn name(&self) -> &str {
        &self.name
    }
    fn value(&self) -> Option<f64> {
        self.value
    }
    fn status(&self) -> &str {
        self.status
    }
    fn event_time_us(&self) -> Option<i64> {
        self.event_time_us
    }
}

const GAP: Duration = Duration::from_micros(60);

fn request_path(c: &mut Criterion) {
    // 40 features named like the example spec's (`view:feature`, about 17 bytes).
    let features: Vec<Used> = (0..40)
        .map(|i| Used {
            name: format!("card:feature_{i:04}").into(),
            value: Some(f64::from(i) * 0.5),
            status: "PRESENT",
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
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let id = format!("req-{n:012}");
                let t0 = Instant::now();
                let mut rec = PredictionRecord::new(&id, "fraud", 3.to_string(), Role::Primary);
                rec.entity_keys = keys.clone();
                rec.features = Some(
                    features
                        .iter()
                        .map(|f| FeatureUsed {
                            name: f.name.clone(),
                            value: f.value,
                            status: f.status.into(),
                            event_time_us: f.event_time_us,
                        })
                        .collect(),
                );
                rec.score = Some(0.5);
                rec.decision = Some("approve".to_owned());
                rec.source = "MODEL".to_owned();
                log.record(rec);
                spent += t0.elapsed();
                while t0.elapsed() < GAP {
                    std::hint::spin_loop();
                }
            }
            spent
        })
    });
    g.bench_function("record_ref", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let id = format!("req-{n:012}");
                let t0 = Instant::now();
                let version = VersionText::new(Some(3));
                log.record_ref(&RecordRef {
                    request_id: &id,
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
                spent += t0.elapsed();
                while t0.elapsed() < GAP {
                    std::hint::spin_loop();
                }
            }
            spent
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
