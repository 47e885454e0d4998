//! Fixtures the router's integration tests share: the repository root, the
//! reference model and its holdout rows (tests/data/fraud-mlp, see its README), and
//! model directories built from the example model's config.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A server on ports the OS picks (127.0.0.1:0) serving the example models
/// (fraud_mlp, fraud_xgb, fraud_lgbm), for `mesh_router::server::start`.
pub fn examples_server() -> mesh_router::config::ServerConfig {
    mesh_router::config::ServerConfig::on_any_port(root().join("examples/models"))
}

/// The reference model's weights.
pub fn reference_weights() -> PathBuf {
    root().join("tests/data/fraud-mlp/fraud_mlp.safetensors")
}

/// The 1,000 reference rows: 32 features and the probability scikit-learn computed
/// (tolerance 1e-5 absolute).
pub fn samples() -> Vec<(Vec<f32>, f32)> {
    let text = std::fs::read_to_string(root().join("tests/data/fraud-mlp/samples.csv"))
        .expect("tests/data/fraud-mlp/samples.csv");
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[1..33].iter().map(|v| v.parse().unwrap()).collect(),
                f[34].parse().unwrap(),
            )
        })
        .collect()
}

/// The example model's `model.toml` without its `[input_spec]` (tests bring their own).
pub fn example_model_part() -> String {
    let text = std::fs::read_to_string(root().join("examples/models/fraud_mlp/model.toml"))
        .expect("examples/models/fraud_mlp/model.toml");
    text.split("[input_spec]")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Writes `<repo>/fraud_mlp/` with the reference weights as each of `versions` and
/// `model_toml` as its config; returns the repository directory.
pub fn model_repo(repo: &Path, versions: &[u64], model_toml: &str) -> PathBuf {
    let m = repo.join("fraud_mlp");
    for v in versions {
        std::fs::create_dir_all(m.join(v.to_string())).unwrap();
        std::fs::copy(
            reference_weights(),
            m.join(format!("{v}/model.safetensors")),
        )
        .unwrap();
    }
    std::fs::write(m.join("model.toml"), model_toml).unwrap();
    repo.to_path_buf()
}

/// One reference row of tests/data/fraud-trees: 34 inputs (f0..f31, mcc, country;
/// NaN = missing) and each library's probability (tolerance 1e-6 absolute).
pub struct TreeSample {
    pub x: Vec<f32>,
    pub xgb: f64,
    pub lgbm: f64,
}

/// The 1,000 reference rows of the tree models.
pub fn tree_samples() -> Vec<TreeSample> {
    let text = std::fs::read_to_string(root().join("tests/data/fraud-trees/samples.csv"))
        .expect("tests/data/fraud-trees/samples.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    assert_eq!(
        header[33..38],
        ["mcc", "country", "label", "xgb_proba", "lgbm_proba"]
    );
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            TreeSample {
                x: c[1..35]
                    .iter()
                    .map(|v| {
                        if v.is_empty() {
                            f32::NAN
                        } else {
                            v.parse().unwrap()
                        }
                    })
                    .collect(),
                xgb: c[36].parse().unwrap(),
                lgbm: c[37].parse().unwrap(),
            }
        })
        .collect()
}

/// Writes `<repo>/<name>/` with the reference tree model `file` of
/// tests/data/fraud-trees as version 1 (`model.json` or `model.txt`) and the
/// example's model.toml (examples/models/<name>, without its `[input_spec]`)
/// followed by `spec`.
pub fn tree_model(repo: &Path, name: &str, file: &str, spec: &str) {
    let m = repo.join(name);
    std::fs::create_dir_all(m.join("1")).unwrap();
    let dst = if file.ends_with(".json") {
        "model.json"
    } else {
        "model.txt"
    };
    std::fs::copy(
        root().join("tests/data/fraud-trees").join(file),
        m.join("1").join(dst),
    )
    .unwrap();
    let example =
        std::fs::read_to_string(root().join(format!("examples/models/{name}/model.toml"))).unwrap();
    let base = example.split("\n[input_spec]").next().unwrap_or_default();
    std::fs::write(m.join("model.toml"), format!("{base}\n{spec}")).unwrap();
}

/// A Decide request for card `id` of fraud_mlp with the reference row `x` as request
/// features f0..f30 (f31 comes from the store).
pub fn decide_request(id: usize, x: &[f32]) -> mesh_proto::mesh::v1::DecideRequest {
    use mesh_proto::mesh::v1 as pb;
    let features: std::collections::HashMap<String, f64> = (0..31)
        .map(|i| (format!("f{i}"), f64::from(x[i])))
        .collect();
    pb::DecideRequest {
        request_id: format!("r{id}"),
        model: "fraud_mlp".into(),
        entities: [(
            "card_id".to_string(),
            pb::EntityKey {
                key: Some(pb::entity_key::Key::Int64Key(id as i64)),
            },
        )]
        .into(),
        features,
        ..Default::default()
    }
}

/// The reference model's model.toml (no `latest` line) reading f0..f30 from the
/// request (a missing one takes 0) and f31 from the `card` view, with the
/// thresholds review 0.5, decline 0.9.
pub fn card_f31_model_toml() -> String {
    let base: String = example_model_part()
        .lines()
        .filter(|l| !l.starts_with("latest"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut spec = String::from("\n[input_spec]\non_missing = \"default\"\n");
    for i in 0..31 {
        spec += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
    }
    spec += "[[input_spec.features]]\nsource = \"card:f31\"\n";
    spec += "\n[decision]\nreview_at = 0.5\ndecline_at = 0.9\n";
    base + &spec
}

/// Views TOML: the `card` entity (int64 `card_id`) and its view of one f32, `f31`,
/// fresh for 1h.
pub const CARD_F31_VIEWS: &str = r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"
[[views]]
name = "card"
entity = "card"
max_age = "1h"
features = [{ name = "f31", type = "f32" }]
"#;

/// Version 1 of [`card_f31_model_toml`] and [`CARD_F31_VIEWS`] under `dir`;
/// returns (models dir, views file).
pub fn card_f31_files(dir: &Path) -> (PathBuf, PathBuf) {
    let models = model_repo(&dir.join("models"), &[1], &card_f31_model_toml());
    let views = dir.join("views.toml");
    std::fs::write(&views, CARD_F31_VIEWS).unwrap();
    (models, views)
}

/// Rows of the `card` view holding f31 of the first `n` reference samples, one per
/// sample under card_id = its index, dated now.
pub fn card_f31_rows(n: usize) -> Vec<mesh_feature_store::Row> {
    use mesh_feature_store::{EntityKey, Row, Value};
    let now = mesh_feature_store::now_micros();
    samples()
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, (x, _))| Row {
            key: EntityKey::Int64(i as i64),
            event_time: now,
            values: vec![Some(Value::F32(x[31]))],
        })
        .collect()
}

/// The status fields of a gRPC answer read over a raw HTTP/2 connection: its headers
/// when they carry `grpc-status` (a trailers-only answer), else its trailers, once the
/// body has been read to its end (the headers again when there are none).
pub async fn grpc_status_fields(
    answer: http::Response<h2::RecvStream>,
) -> Result<http::HeaderMap, h2::Error> {
    let (head, mut body) = answer.into_parts();
    if head.headers.contains_key("grpc-status") {
        return Ok(head.headers);
    }
    while let Some(chunk) = body.data().await {
        chunk?;
    }
    Ok(body.trailers().await?.unwrap_or(head.headers))
}
