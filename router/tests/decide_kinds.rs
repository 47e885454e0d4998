//! Canary and shadow between model kinds in one Decide deployment: the MLP
//! (fraud_mlp) is the primary, the XGBoost model (fraud_xgb) the canary with 30% of
//! the traffic, and the LightGBM model (fraud_lgbm) the shadow, each with its own
//! input spec over the same requests (a real mesh on 127.0.0.1:0, sled store, the
//! prediction log in a temp dir). Traffic splits by the canary's weight; each
//! answer names the model and version that gave it with its role; the canary's
//! scores are XGBoost's own probabilities and the shadow's (logged, never
//! returned) LightGBM's; the log holds one record per answer and per shadow copy.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mesh_feature_store::{Durability, EntityKey, Row, Value};
use mesh_prediction_log::Role;
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use pb::decisions_client::DecisionsClient;

mod common;

const TOLERANCE: f64 = 1e-6;
const WEIGHT: f64 = 0.3;

/// fraud_mlp reads f0..f30 from the request (a missing one takes 0) and f31 from
/// the card view.
fn mlp_spec() -> String {
    let mut s = String::from("\n[input_spec]\n");
    for i in 0..31 {
        s += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
    }
    s + "[[input_spec.features]]\nsource = \"card:f31\"\n"
}

/// The tree models read f0..f31, mcc and country (codes) from the request; a
/// feature not sent is NaN where the model takes missing values (`nan`).
fn tree_spec(nan: &[usize]) -> String {
    let mut s = String::from("[input_spec]\non_missing = \"refuse\"\n");
    let names = (0..32)
        .map(|i| format!("f{i}"))
        .chain(["mcc".into(), "country".into()]);
    for (i, n) in names.enumerate() {
        s += &format!("[[input_spec.features]]\nsource = \"request:{n}\"\n");
        if nan.contains(&i) {
            s += "on_missing = \"nan\"\n";
        }
    }
    s
}

fn request(i: usize, x: &[f32]) -> pb::DecideRequest {
    let names = (0..32)
        .map(|j| format!("f{j}"))
        .chain(["mcc".into(), "country".into()]);
    let features: HashMap<String, f64> = names
        .zip(x)
        .filter(|(_, v)| !v.is_nan())
        .map(|(n, v)| (n, f64::from(*v)))
        .collect();
    pb::DecideRequest {
        request_id: format!("k{i}"),
        model: "fraud_mlp".into(),
        entities: [(
            "card_id".to_string(),
            pb::EntityKey {
                key: Some(pb::entity_key::Key::Int64Key(i as i64)),
            },
        )]
        .into(),
        features,
        ..Default::default()
    }
}

/// Decisions counted by role in /metrics' registry.
fn decisions(role: &str) -> f64 {
    mesh_router::telemetry::metrics()
        .render()
        .lines()
        .filter(|l| {
            l.starts_with("mesh_router_decisions_total") && l.contains(&format!("role=\"{role}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mlp_primary_with_an_xgboost_canary_and_a_lightgbm_shadow() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = d.join("models");
    common::model_repo(&models, &[1], &(common::example_model_part() + &mlp_spec()));
    common::tree_model(
        &models,
        "fraud_xgb",
        "fraud_xgb.json",
        &tree_spec(&[4, 9, 20, 32, 33]),
    );
    common::tree_model(
        &models,
        "fraud_lgbm",
        "fraud_lgbm.txt",
        &tree_spec(&[4, 9, 20]),
    );
    std::fs::write(d.join("views.toml"), common::CARD_F31_VIEWS).unwrap();
    let logs = d.join("predictions");
    let cfg: MeshConfig = toml::from_str(&format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [features]
        path = "{db}"
        views = "{views}"
        [prediction_log]
        dir = "{logs}"
        [decisions]
        deadline = "5s"
        max_batch_items = 250
        [decisions.stack]
        per_try_timeout = "2s"
        [[decisions.deployments]]
        model = "fraud_mlp"
        canary = {{ model = "fraud_xgb", weight = {WEIGHT} }}
        shadow = {{ model = "fraud_lgbm" }}
        "#,
        models = models.display(),
        db = d.join("db").display(),
        views = d.join("views.toml").display(),
        logs = logs.display(),
    ))
    .unwrap();
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let rows = common::tree_samples();
    let now = mesh_feature_store::now_micros();
    let card: Vec<Row> = rows
        .iter()
        .enumerate()
        .map(|(i, s)| Row {
            key: EntityKey::Int64(i as i64),
            event_time: now,
            values: vec![Some(Value::F32(s.x[31]))],
        })
        .collect();
    let store = running.store.clone().unwrap();
    store
        .push("card", card, Durability::Buffered)
        .await
        .unwrap();
    let mut client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    let shadows_before = decisions("shadow");

    // 2,000 decisions: every reference row twice, in DecideBatch calls of 250.
    let (mut canary, mut primary) = (0usize, 0usize);
    let mut answered: HashMap<String, (String, String, f32)> = HashMap::new();
    for round in 0..8 {
        let requests = (0..250)
            .map(|k| {
                let i = (round * 250 + k) % rows.len();
                let mut r = request(i, &rows[i].x);
                r.request_id = format!("k{round}-{i}");
                r
            })
            .collect();
        let out = client
            .decide_batch(pb::DecideBatchRequest { requests })
            .await
            .unwrap()
            .into_inner();
        for r in out.responses {
            assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
            let i: usize = r.request_id.rsplit('-').next().unwrap().parse().unwrap();
            let score = r.score.unwrap();
            match (r.role.as_str(), r.model.as_str(), r.model_version.as_str()) {
                ("canary", "fraud_xgb", "1") => {
                    canary += 1;
                    // The canary decided with its own spec: XGBoost's probability.
                    assert!(
                        (f64::from(score) - rows[i].xgb).abs() <= TOLERANCE,
                        "row {i}: {score} vs {}",
                        rows[i].xgb
                    );
                }
                ("primary", "fraud_mlp", "1") => primary += 1,
                other => panic!("unexpected answer {other:?}"),
            }
            answered.insert(r.request_id.clone(), (r.model, r.role, score));
        }
    }
    let total = canary + primary;
    assert_eq!(total, 2000);
    let share = canary as f64 / total as f64;
    assert!((share - WEIGHT).abs() <= 0.04, "canary share {share}");

    // Every primary answer sent one shadow copy to fraud_lgbm; wait for them all.
    let waited = Instant::now();
    while decisions("shadow") - shadows_before < primary as f64
        && waited.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(decisions("shadow") - shadows_before, primary as f64);
    running.shutdown().await;

    // The log: one record per answer, with its model, version and role, and one per
    // shadow copy (fraud_lgbm, role shadow, LightGBM's own probability).
    let records =
        mesh_prediction_log::read_all(&logs, mesh_prediction_log::ReadOptions::default()).unwrap();
    let mut by: HashMap<(String, Role), usize> = HashMap::new();
    for rec in &records {
        *by.entry((rec.model.clone(), rec.role)).or_default() += 1;
        assert_eq!(rec.version, "1");
        let i: usize = rec.request_id.rsplit('-').next().unwrap().parse().unwrap();
        let score = rec.score.unwrap();
        match rec.role {
            Role::Shadow => {
                assert_eq!(rec.model, "fraud_lgbm");
                assert!(
                    (score - rows[i].lgbm).abs() <= TOLERANCE,
                    "shadow row {i}: {score} vs {}",
                    rows[i].lgbm
                );
                // Only requests the primary answered were copied.
                assert_eq!(answered[&rec.request_id].1, "primary");
            }
            _ => {
                let (model, role, s) = &answered[&rec.request_id];
                assert_eq!((&rec.model, rec.role.as_str()), (model, role.as_str()));
                assert_eq!(score, f64::from(*s));
            }
        }
    }
    assert_eq!(by[&("fraud_mlp".to_string(), Role::Primary)], primary);
    assert_eq!(by[&("fraud_xgb".to_string(), Role::Canary)], canary);
    assert_eq!(by[&("fraud_lgbm".to_string(), Role::Shadow)], primary);
    assert_eq!(records.len(), total + primary);
}

#[test]
fn other_model_arms_are_read_and_checked() {
    use mesh_router::decide::config::DecisionsConfig;
    let cfg: DecisionsConfig = toml::from_str(
        r#"
        [[deployments]]
        model = "fraud_mlp"
        canary = { model = "fraud_xgb", version = 2, weight = 0.1 }
        shadow = { model = "fraud_lgbm" }
        [[deployments]]
        model = "other"
        canary = { version = 3, weight = 0.5 }
        shadow = 2
        "#,
    )
    .unwrap();
    let d = &cfg.deployments[0];
    assert!(d.canary.is_none() && d.shadow.is_none());
    let c = d.canary_model.as_ref().unwrap();
    assert_eq!(
        (c.model.as_str(), c.version, c.weight),
        ("fraud_xgb", Some(2), 0.1)
    );
    assert_eq!(d.shadow_model.as_ref().unwrap().model, "fraud_lgbm");
    assert_eq!(
        d.models().collect::<Vec<_>>(),
        ["fraud_mlp", "fraud_xgb", "fraud_lgbm"]
    );
    assert!(cfg.decides_with("fraud_lgbm") && !cfg.decides_with("fraud_onnx"));
    let o = &cfg.deployments[1];
    assert_eq!(o.canary.as_ref().unwrap().version, 3);
    assert_eq!(o.shadow, Some(2));
    for (text, needle) in [
        ("canary = { weight = 0.1 }", "names its version"),
        (
            "canary = { model = \"x\", weight = 2.0 }",
            "not within 0..=1",
        ),
        ("shadow = { model = \"m\" }", "names its version"),
        (
            "canary = { model = \"x\", weight = 0.1, extra = 1 }",
            "extra",
        ),
    ] {
        let e =
            toml::from_str::<DecisionsConfig>(&format!("[[deployments]]\nmodel = \"m\"\n{text}\n"))
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map(|_| c))
                .err()
                .unwrap_or_else(|| panic!("{text} was accepted"));
        assert!(e.contains(needle), "{text}: {e}");
    }
}
