//! Decisions with a tree model: the XGBoost example model (examples/models/fraud_xgb,
//! its model.toml's kind, `[trees]` and batching, the reference model file) behind a
//! real mesh (gRPC on 127.0.0.1:0, sled store in a temp dir), with an input spec that
//! reads every kind of source: request numbers, store numbers from two views, a
//! categorical request feature and a categorical store string (text -> code), and
//! missing values from an absent request field, a store row that does not exist
//! (NOT_FOUND) and a NULL store value, each sent to the trees as NaN. Every reference
//! row of tests/data/fraud-trees, sent through Decide, reproduces XGBoost's own
//! probability (`xgb_proba`) within 1e-6.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use mesh_feature_store::{Durability, EntityKey, Row, Value};
use mesh_model_actor::Batch;
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use pb::decisions_client::DecisionsClient;
use tonic::Code;

mod common;
use common::root;

const FEATURES: usize = 34;
const TOLERANCE: f64 = 1e-6;

/// One reference row: 34 inputs (NaN = missing) and XGBoost's probability.
struct Sample {
    x: Vec<f32>,
    want: f64,
}

fn samples() -> Vec<Sample> {
    common::tree_samples()
        .into_iter()
        .map(|s| Sample {
            x: s.x,
            want: s.xgb,
        })
        .collect()
}

/// The model's names of mcc code `i` and country code `i`.
fn mcc(i: usize) -> String {
    format!("mcc{i:02}")
}
fn country(i: usize) -> String {
    format!("C{i:02}")
}

fn quoted(names: impl Iterator<Item = String>) -> String {
    names
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// This test's input spec: f0..f3 request, f4 card_risk (NaN when the row is
/// absent), f5..f8 card, f9 merchant (NaN when null), f10..f31 request (f20 NaN
/// when not sent), mcc from the request's text, country from the card's text.
fn input_spec() -> String {
    let mut spec = String::from("[input_spec]\non_missing = \"refuse\"\n");
    let mut entry = |source: String, extra: &str| {
        spec += &format!("[[input_spec.features]]\nsource = \"{source}\"\n{extra}");
    };
    for i in 0..32 {
        match i {
            4 => entry("card_risk:f4".into(), "on_missing = \"nan\"\n"),
            5..=8 => entry(format!("card:f{i}"), ""),
            9 => entry("merchant:f9".into(), "on_missing = \"nan\"\n"),
            20 => entry("request:f20".into(), "on_missing = \"nan\"\n"),
            _ => entry(format!("request:f{i}"), ""),
        }
    }
    let mccs = quoted((0..50).map(mcc));
    entry(
        "request:mcc".into(),
        &format!("categories = [{mccs}]\non_missing = \"nan\"\n"),
    );
    let countries = quoted((0..30).map(country));
    entry(
        "card:country".into(),
        &format!("categories = [{countries}]\non_missing = \"nan\"\n"),
    );
    spec
}

const VIEWS: &str = r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"
[[entities]]
name = "merchant"
join_key = "merchant_id"
key_type = "string"
[[views]]
name = "card"
entity = "card"
max_age = "1h"
features = [
  { name = "f5", type = "f32" }, { name = "f6", type = "f32" },
  { name = "f7", type = "f32" }, { name = "f8", type = "f32" },
  { name = "country", type = "string" },
]
[[views]]
name = "card_risk"
entity = "card"
max_age = "1h"
features = [{ name = "f4", type = "f32" }]
[[views]]
name = "merchant"
entity = "merchant"
max_age = "1h"
features = [{ name = "f9", type = "f32" }]
"#;

struct Mesh {
    running: mesh_router::server::Running,
    client: DecisionsClient<tonic::transport::Channel>,
    _dir: tempfile::TempDir,
}

async fn mesh() -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    common::tree_model(
        &d.join("models"),
        "fraud_xgb",
        "fraud_xgb.json",
        &input_spec(),
    );
    std::fs::write(d.join("views.toml"), VIEWS).unwrap();
    let text = format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [features]
        path = "{db}"
        views = "{views}"
        [decisions]
        deadline = "2s"
        max_batch_items = 250
        [decisions.stack]
        per_try_timeout = "1s"
        [[decisions.deployments]]
        model = "fraud_xgb"
        "#,
        models = d.join("models").display(),
        db = d.join("db").display(),
        views = d.join("views.toml").display(),
    );
    let cfg: MeshConfig = toml::from_str(&text).unwrap();
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    Mesh {
        running,
        client,
        _dir: dir,
    }
}

/// Card `i` and merchant `m<i>` hold row `i`'s store features: card f5..f8 and its
/// country's name; card_risk f4 only where it is not missing (else the row does not
/// exist: NOT_FOUND); merchant f9, null where missing.
async fn fill_store(m: &Mesh, rows: &[Sample]) {
    let store = m.running.store.clone().unwrap();
    let now = mesh_feature_store::now_micros();
    let f32v = |x: f32| (!x.is_nan()).then_some(Value::F32(x));
    let card = rows.iter().enumerate().map(|(i, s)| Row {
        key: EntityKey::Int64(i as i64),
        event_time: now,
        values: (5..=8)
            .map(|j| f32v(s.x[j]))
            .chain([Some(Value::String(country(s.x[33] as usize)))])
            .collect(),
    });
    let risk = rows
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.x[4].is_nan())
        .map(|(i, s)| Row {
            key: EntityKey::Int64(i as i64),
            event_time: now,
            values: vec![f32v(s.x[4])],
        });
    let merchant = rows.iter().enumerate().map(|(i, s)| Row {
        key: EntityKey::String(format!("m{i}")),
        event_time: now,
        values: vec![f32v(s.x[9])],
    });
    for (view, rows) in [
        ("card", card.collect::<Vec<_>>()),
        ("card_risk", risk.collect()),
        ("merchant", merchant.collect()),
    ] {
        store.push(view, rows, Durability::Buffered).await.unwrap();
    }
}

/// Row `i` as a caller sends it: its keys, f0..f3 and f10..f31 (f20 left out where
/// missing), and the mcc's name.
fn request(i: usize, s: &Sample) -> pb::DecideRequest {
    let features: HashMap<String, f64> = (0..4)
        .chain(10..32)
        .filter(|&j| !s.x[j].is_nan())
        .map(|j| (format!("f{j}"), f64::from(s.x[j])))
        .collect();
    let key = |k: pb::entity_key::Key| pb::EntityKey { key: Some(k) };
    pb::DecideRequest {
        request_id: format!("t{i}"),
        model: "fraud_xgb".into(),
        entities: [
            (
                "card_id".to_string(),
                key(pb::entity_key::Key::Int64Key(i as i64)),
            ),
            (
                "merchant_id".to_string(),
                key(pb::entity_key::Key::StringKey(format!("m{i}"))),
            ),
        ]
        .into(),
        features,
        categorical: [("mcc".to_string(), mcc(s.x[32] as usize))].into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_with_the_xgboost_model_reproduce_the_library() {
    let mut m = mesh().await;
    let rows = samples();
    assert_eq!(rows.len(), 1000);
    fill_store(&m, &rows).await;

    // Every row, in DecideBatch calls of 250 (one feature lookup each).
    let mut answers = Vec::new();
    for chunk in (0..rows.len()).collect::<Vec<_>>().chunks(250) {
        let requests = chunk.iter().map(|&i| request(i, &rows[i])).collect();
        let out = m
            .client
            .decide_batch(pb::DecideBatchRequest { requests })
            .await
            .unwrap()
            .into_inner();
        answers.extend(out.responses);
    }
    let mut worst = 0f64;
    for (i, (r, s)) in answers.iter().zip(&rows).enumerate() {
        assert_eq!(r.request_id, format!("t{i}"));
        assert_eq!(
            r.source,
            pb::AnswerSource::Model as i32,
            "row {i}: {:?}",
            r.reasons
        );
        assert_eq!(
            (r.model.as_str(), r.model_version.as_str()),
            ("fraud_xgb", "1")
        );
        worst = worst.max((f64::from(r.score.unwrap()) - s.want).abs());
        // Each missing value is named with its status in the reasons.
        let reasons = r.reasons.join("; ");
        for (col, needle) in [
            (4, "card_risk NOT_FOUND: f4"),
            (9, "merchant NULL: f9"),
            (20, "request MISSING: f20"),
        ] {
            assert_eq!(
                reasons.contains(needle),
                s.x[col].is_nan(),
                "row {i}: {reasons}"
            );
        }
    }
    assert!(worst <= TOLERANCE, "worst difference {worst}");
    let missing = |c: usize| rows.iter().filter(|s| s.x[c].is_nan()).count();
    assert!(
        missing(4) > 10 && missing(9) > 10 && missing(20) > 10,
        "the reference rows have missing values in each of f4, f9, f20"
    );

    // One row per Decide call: the same answers.
    for i in [0, 1, 2, 500, 999] {
        let r = m
            .client
            .decide(request(i, &rows[i]))
            .await
            .unwrap()
            .into_inner();
        let got = f64::from(r.score.unwrap());
        assert!((got - rows[i].want).abs() <= TOLERANCE, "row {i}: {got}");
    }

    // An mcc the spec does not list is unseen: sent as missing (NaN), as the model
    // itself answers that row over OIP, and said so in the reasons.
    let mut unseen = request(3, &rows[3]);
    unseen.categorical.insert("mcc".into(), "not-an-mcc".into());
    let r = m.client.decide(unseen).await.unwrap().into_inner();
    assert!(
        r.reasons.iter().any(|x| x.contains("request UNSEEN: mcc")),
        "{:?}",
        r.reasons
    );
    let mut x = rows[3].x.clone();
    x[32] = f32::NAN;
    let h = m
        .running
        .core
        .as_ref()
        .unwrap()
        .repo
        .get("fraud_xgb", None)
        .unwrap();
    let direct = h
        .infer(
            Batch {
                rows: 1,
                cols: FEATURES,
                data: x,
            },
            Some(Instant::now() + Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(r.score.unwrap(), direct.data[0]);

    // NaN in a request is refused (a missing value is sent by leaving it out), and a
    // feature marked refuse that is not sent is not scored.
    let mut nan = request(0, &rows[0]);
    nan.features.insert("f20".into(), f64::NAN);
    let e = m.client.decide(nan).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("f20"), "{}", e.message());
    let mut no_f0 = request(0, &rows[0]);
    no_f0.features.remove("f0");
    let r = m.client.decide(no_f0).await.unwrap().into_inner();
    assert_ne!(r.source, pb::AnswerSource::Model as i32);
    assert!(
        r.reasons
            .iter()
            .any(|x| x.contains("request:f0 is MISSING")),
        "{:?}",
        r.reasons
    );
    m.running.shutdown().await;
}

#[test]
fn the_example_spec_is_checked_like_any_other() {
    // The example's own [input_spec] parses and fills the model's 34 inputs, its
    // NaN entries sit on columns the model takes missing values in.
    let dir = root().join("examples/models/fraud_xgb");
    let cfg = mesh_model_actor::ModelConfig::load(Path::new(&dir)).unwrap();
    let spec = mesh_router::decide::spec::DecisionSpec::from_model(&cfg)
        .unwrap()
        .unwrap();
    let width: usize = spec.entries.iter().map(|e| e.width()).sum();
    assert_eq!(width, 34);
    let views =
        mesh_feature_store::ViewsConfig::from_path(root().join("examples/features/views.toml"))
            .unwrap();
    let d = tempfile::tempdir().unwrap();
    let store = mesh_feature_store::FeatureStore::open(d.path().join("db"), &views).unwrap();
    spec.check_views(store.views()).unwrap();
}
