//! `mesh batch-score` end to end: entity keys from Parquet, features from a real
//! sled store, the reference model, scores written into a feature view; each
//! stored score equals the model's answer for the row the spec builds offline.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use mesh_feature_store::{
    Durability, EntityKey, FeatureStatus, FeatureStore, KeyColumn, LookupRequest, Row, Value,
    ViewsConfig,
};
use mesh_model_actor::{ActorSystem, Batch, ModelRepository};

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Waits until no handle holds the sled store's lock: a dropped store lets go of it
/// only when sled's flusher thread ends, a moment later.
fn wait_until_unlocked(db: &Path) {
    let file = std::fs::File::open(db.join("db")).unwrap();
    let t = Instant::now();
    while file.try_lock().is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the store stays locked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    file.unlock().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_every_entity_into_the_view() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Model: f4 from the store, the rest from the request (absent offline -> default 0, even if "refuse").
    let m = d.join("models/fraud_mlp");
    std::fs::create_dir_all(m.join("1")).unwrap();
    std::fs::copy(
        root().join("tests/data/fraud-mlp/fraud_mlp.safetensors"),
        m.join("1/model.safetensors"),
    )
    .unwrap();
    let base =
        std::fs::read_to_string(root().join("examples/models/fraud_mlp/model.toml")).unwrap();
    let mut text = base.split("[input_spec]").next().unwrap().to_owned() + "\n[input_spec]\n";
    for i in 0..32 {
        if i == 4 {
            // x4 carries signal in the reference model (x16..x31 are noise).
            text += "[[input_spec.features]]\nsource = \"card:f4\"\n";
        } else {
            text += &format!(
                "[[input_spec.features]]\nsource = \"request:f{i}\"\non_missing = \"refuse\"\n"
            );
        }
    }
    std::fs::write(m.join("model.toml"), text).unwrap();
    let views = d.join("views.toml");
    std::fs::write(
        &views,
        r#"
        [[entities]]
        name = "card"
        join_key = "card_id"
        key_type = "int64"
        [[views]]
        name = "card"
        entity = "card"
        max_age = "1h"
        features = [{ name = "f4", type = "f32" }]
        [[views]]
        name = "fraud_scores"
        entity = "card"
        max_age = "1d"
        features = [{ name = "score", type = "f32" }]
        "#,
    )
    .unwrap();
    let db = d.join("db");
    let n = 300i64;
    {
        let store = FeatureStore::open(&db, &ViewsConfig::from_path(&views).unwrap()).unwrap();
        let now = mesh_feature_store::now_micros();
        let rows = (0..n).map(|i| Row {
            key: EntityKey::Int64(i),
            event_time: now,
            values: vec![Some(Value::F32(i as f32 / 30.0 - 5.0))],
        });
        store
            .push("card", rows.collect(), Durability::Sync)
            .await
            .unwrap();
    }
    wait_until_unlocked(&db);
    let keys = d.join("keys.parquet");
    let batch = RecordBatch::try_from_iter([(
        "card_id",
        Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())) as ArrayRef,
    )])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&keys).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    mesh::batch_score::run(mesh::batch_score::BatchScoreArgs {
        model: "fraud_mlp".into(),
        entities: keys,
        out_view: "fraud_scores".into(),
        models: d.join("models"),
        store: db.clone(),
        views: views.clone(),
        chunk: 128,
    })
    .await
    .unwrap();

    wait_until_unlocked(&db);
    let store = FeatureStore::open(&db, &ViewsConfig::from_path(&views).unwrap()).unwrap();
    let resp = store
        .get_online_features(
            LookupRequest::new(["fraud_scores:score"])
                .with_keys("card_id", KeyColumn::Int64((0..n).collect())),
        )
        .await
        .unwrap();
    let col = &resp.columns[0];
    assert!(col.statuses.iter().all(|s| *s == FeatureStatus::Present));
    let mesh_feature_store::ColumnValues::F32(scores) = &col.values else {
        panic!("scores are f32")
    };
    // The same rows straight through the model.
    let repo = ModelRepository::new(d.join("models"), ActorSystem::start().unwrap()).unwrap();
    repo.load_all().await.unwrap();
    let h = repo.get("fraud_mlp", None).unwrap();
    for i in [0usize, 17, 150, 299] {
        let mut row = vec![0.0f32; 32];
        row[4] = i as f32 / 30.0 - 5.0;
        let out = h
            .infer(
                Batch {
                    rows: 1,
                    cols: 32,
                    data: row,
                },
                Some(Instant::now() + Duration::from_secs(10)),
            )
            .await
            .unwrap();
        assert!(
            (out.data[0] - scores[i]).abs() <= 1e-6,
            "entity {i}: stored {} vs model {}",
            scores[i],
            out.data[0]
        );
    }
    assert!(
        scores.iter().any(|s| (s - scores[0]).abs() > 1e-6),
        "all scores equal: the store feature had no effect"
    );
}

/// The reference rows of tests/data/fraud-trees: 34 inputs (NaN = missing) and
/// XGBoost's own probability.
fn tree_samples() -> Vec<(Vec<f32>, f64)> {
    let text = std::fs::read_to_string(root().join("tests/data/fraud-trees/samples.csv")).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            let x = c[1..35]
                .iter()
                .map(|v| {
                    if v.is_empty() {
                        f32::NAN
                    } else {
                        v.parse().unwrap()
                    }
                })
                .collect();
            (x, c[36].parse().unwrap())
        })
        .collect()
}

/// `mesh batch-score` with the XGBoost example model: every input from the `card`
/// view (f0..f31, NULL where missing, sent as NaN; mcc as a stored code; country as
/// a stored name mapped to its code), one score per card written into
/// `fraud_scores`, each XGBoost's own probability within 1e-6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_with_an_xgboost_model_match_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = d.join("models/fraud_xgb");
    std::fs::create_dir_all(m.join("1")).unwrap();
    std::fs::copy(
        root().join("tests/data/fraud-trees/fraud_xgb.json"),
        m.join("1/model.json"),
    )
    .unwrap();
    let example =
        std::fs::read_to_string(root().join("examples/models/fraud_xgb/model.toml")).unwrap();
    let mut text = example.split("\n[input_spec]").next().unwrap().to_owned();
    text += "\n[input_spec]\non_missing = \"refuse\"\n";
    for i in 0..32 {
        text += &format!("[[input_spec.features]]\nsource = \"card:f{i}\"\n");
        if [4, 9, 20].contains(&i) {
            text += "on_missing = \"nan\"\n";
        }
    }
    let countries: Vec<String> = (0..30).map(|i| format!("\"C{i}\"")).collect();
    text += &format!(
        "[[input_spec.features]]\nsource = \"card:mcc\"\n\
         [[input_spec.features]]\nsource = \"card:country\"\ncategories = [{}]\non_missing = \"nan\"\n",
        countries.join(", ")
    );
    std::fs::write(m.join("model.toml"), text).unwrap();
    let mut features: Vec<String> = (0..32)
        .map(|i| format!("{{ name = \"f{i}\", type = \"f32\" }}"))
        .collect();
    features.push("{ name = \"mcc\", type = \"i64\" }".into());
    features.push("{ name = \"country\", type = \"string\" }".into());
    let views = d.join("views.toml");
    std::fs::write(
        &views,
        format!(
            r#"
            [[entities]]
            name = "card"
            join_key = "card_id"
            key_type = "int64"
            [[views]]
            name = "card"
            entity = "card"
            max_age = "1h"
            features = [{}]
            [[views]]
            name = "fraud_scores"
            entity = "card"
            max_age = "1d"
            features = [{{ name = "score", type = "f32" }}]
            "#,
            features.join(", ")
        ),
    )
    .unwrap();
    let rows = tree_samples();
    let n = rows.len() as i64;
    let db = d.join("db");
    {
        let store = FeatureStore::open(&db, &ViewsConfig::from_path(&views).unwrap()).unwrap();
        let now = mesh_feature_store::now_micros();
        let card = rows.iter().enumerate().map(|(i, (x, _))| Row {
            key: EntityKey::Int64(i as i64),
            event_time: now,
            values: x[..32]
                .iter()
                .map(|v| (!v.is_nan()).then_some(Value::F32(*v)))
                .chain([
                    Some(Value::I64(x[32] as i64)),
                    Some(Value::String(format!("C{}", x[33] as i64))),
                ])
                .collect(),
        });
        store
            .push("card", card.collect(), Durability::Sync)
            .await
            .unwrap();
    }
    wait_until_unlocked(&db);
    let keys = d.join("keys.parquet");
    let batch = RecordBatch::try_from_iter([(
        "card_id",
        Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())) as ArrayRef,
    )])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&keys).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    mesh::batch_score::run(mesh::batch_score::BatchScoreArgs {
        model: "fraud_xgb".into(),
        entities: keys,
        out_view: "fraud_scores".into(),
        models: d.join("models"),
        store: db.clone(),
        views: views.clone(),
        chunk: 300,
    })
    .await
    .unwrap();

    wait_until_unlocked(&db);
    let store = FeatureStore::open(&db, &ViewsConfig::from_path(&views).unwrap()).unwrap();
    let resp = store
        .get_online_features(
            LookupRequest::new(["fraud_scores:score"])
                .with_keys("card_id", KeyColumn::Int64((0..n).collect())),
        )
        .await
        .unwrap();
    let col = &resp.columns[0];
    assert!(col.statuses.iter().all(|s| *s == FeatureStatus::Present));
    let mesh_feature_store::ColumnValues::F32(scores) = &col.values else {
        panic!("scores are f32")
    };
    let worst = scores
        .iter()
        .zip(&rows)
        .map(|(s, (_, want))| (f64::from(*s) - want).abs())
        .fold(0.0, f64::max);
    assert!(worst <= 1e-6, "worst difference from xgb_proba: {worst}");
    assert!(
        rows.iter().any(|(x, _)| x[4].is_nan()),
        "rows with missing f4"
    );
}
