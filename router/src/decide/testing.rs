//! Fakes shared by the decision stages' unit tests: a real sled feature store in a
//! temp dir, requests, a model answer.
use std::collections::BTreeSet;
use std::time::Duration;

use mesh_feature_store::{Durability, EntityKey, FeatureStore, Row, Value, ViewsConfig};
use mesh_proto::mesh::v1 as pb;

use super::replica::ModelAnswer;
use super::spec::{DecisionSpec, Entry, OnMissing, Source, Thresholds};

/// A tree model of 4 inputs (column 1 may be missing, column 3 is categorical),
/// with `spec` appended (an `[input_spec]`, or nothing).
pub fn tree_model(spec: &str) -> mesh_model_actor::ModelConfig {
    mesh_model_actor::ModelConfig::parse(
        &format!(
            r#"
            kind = "xgboost"
            [[inputs]]
            name = "input"
            datatype = "FP32"
            dims = [4]
            [[outputs]]
            name = "p"
            datatype = "FP32"
            dims = [1]
            [trees]
            categorical = [3]
            missing = [1]
            {spec}
            "#
        ),
        "t",
    )
    .unwrap()
}

/// `card` (f31, 1h) and `fraud_scores` (score, 1d), both keyed by int64 `card_id`.
const VIEWS: &str = r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"
[[views]]
name = "card"
entity = "card"
max_age = "1h"
features = [{ name = "f31", type = "f32" }]
[[views]]
name = "fraud_scores"
entity = "card"
max_age = "1d"
features = [{ name = "score", type = "f32" }]
"#;

/// A store with card 7: f31 = 0.25, score = 0.95 (fresh), and card 8: score two
/// days old (stale).
pub fn store() -> (tempfile::TempDir, FeatureStore) {
    let dir = tempfile::tempdir().unwrap();
    let views = ViewsConfig::from_toml_str(VIEWS).unwrap();
    let store = FeatureStore::open(dir.path().join("db"), &views).unwrap();
    let now = mesh_feature_store::now_micros();
    let row = |key: i64, age_us: i64, v: f32| Row {
        key: EntityKey::Int64(key),
        event_time: now - age_us,
        values: vec![Some(Value::F32(v))],
    };
    store
        .write_rows("card", &[row(7, 0, 0.25)], Durability::Buffered)
        .unwrap();
    let two_days = 2 * 86_400 * 1_000_000;
    store
        .write_rows(
            "fraud_scores",
            &[row(7, 0, 0.95), row(8, two_days, 0.05)],
            Durability::Buffered,
        )
        .unwrap();
    (dir, store)
}

/// [`store`] as the decision stages see it.
pub fn source() -> (tempfile::TempDir, super::feature_source::FeatureSource) {
    let (dir, store) = store();
    (dir, std::sync::Arc::new(store).into())
}

/// A deadline far enough away for any lookup of a test.
pub fn later() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(10)
}

/// An entry of an input spec (no transforms).
pub fn entry(source: Source, on_missing: OnMissing) -> Entry {
    Entry {
        label: Entry::label_of(&source),
        source,
        transforms: Vec::new(),
        default: -1.0,
        on_missing,
        one_hot: None,
        categories: None,
    }
}

/// `request:amount` (refused when missing), then `card:f31` (default -1).
pub fn spec() -> DecisionSpec {
    DecisionSpec {
        entries: vec![
            entry(Source::Request("amount".into()), OnMissing::Refuse),
            entry(
                Source::Store {
                    view: "card".into(),
                    feature: "f31".into(),
                },
                OnMissing::Default,
            ),
        ],
        thresholds: Thresholds {
            review_at: 0.5,
            decline_at: 0.9,
        },
        store_features: vec!["card:f31".into()].into(),
        views: BTreeSet::from(["card".to_owned()]),
        columns: Default::default(),
    }
}

/// A request for `fraud` with `amount` and, if given, `card_id`.
pub fn request(id: &str, amount: f64, card: Option<i64>) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: id.into(),
        model: "fraud".into(),
        entities: card
            .map(|c| {
                (
                    "card_id".to_string(),
                    pb::EntityKey {
                        key: Some(pb::entity_key::Key::Int64Key(c)),
                    },
                )
            })
            .into_iter()
            .collect(),
        features: [("amount".to_string(), amount)].into(),
        ..Default::default()
    }
}

pub fn answer(version: u64, score: f32) -> ModelAnswer {
    ModelAnswer {
        scores: vec![score],
        version,
        queue: Duration::from_micros(7),
        compute: Duration::from_micros(11),
    }
}

/// One metric update seen by [`Recorder`].
#[derive(Debug, Clone)]
pub struct Seen {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A metrics recorder for `metrics::with_local_recorder`: every counter increment
/// and histogram sample, in order, and how many handles were registered.
#[derive(Default, Clone)]
pub struct Recorder(
    std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

struct Handle(Recorder, metrics::Key);

impl Recorder {
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
    fn push(&self, key: &metrics::Key, value: f64) {
        self.0.lock().unwrap().push(Seen {
            name: key.name().to_owned(),
            labels: key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect(),
            value,
        });
    }
    /// Counters and histograms registered so far.
    pub fn registered(&self) -> usize {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn handle(&self, key: &metrics::Key) -> std::sync::Arc<Handle> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::sync::Arc::new(Handle(self.clone(), key.clone()))
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.0.push(&self.1, value as f64);
    }
    fn absolute(&self, value: u64) {
        self.0.push(&self.1, value as f64);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.0.push(&self.1, value);
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.handle(key))
    }
}
