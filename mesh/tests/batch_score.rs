//! `mesh batch-score` end to end: entity keys from Parquet, features from a real
//! sled store, the reference model, scores written into a feature view; each
//! stored score equals the model's answer for the row the spec builds offline.
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
