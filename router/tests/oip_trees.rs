//! Kinds `xgboost` and `lightgbm` over the OIP v2 gRPC server, started for real on
//! 127.0.0.1:0 over a temporary repository holding the reference tree models
//! (tests/data/fraud-trees, with the example model.toml files): every reference row
//! reproduces each library's probability within 1e-6, in batches and one row per
//! request; NaN and category codes follow model.toml; Triton's ModelConfig and
//! metadata name the kind.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use mesh_proto::inference as pb;
use mesh_router::config::ServerConfig;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;
use tonic::Code;

mod common;
use common::root;

const FEATURES: usize = 34;
const TOLERANCE: f64 = 1e-6;

/// (model, file in the version directory, reference file, platform)
const MODELS: [(&str, &str, &str, &str); 2] = [
    ("fraud_xgb", "model.json", "fraud_xgb.json", "xgboost_json"),
    ("fraud_lgbm", "model.txt", "fraud_lgbm.txt", "lightgbm_text"),
];

fn data_dir() -> PathBuf {
    root().join("tests/data/fraud-trees")
}

/// Rows (NaN = missing) and each library's probability.
fn samples() -> (Vec<Vec<f32>>, Vec<f64>, Vec<f64>) {
    let text = std::fs::read_to_string(data_dir().join("samples.csv")).expect("samples.csv");
    let (mut rows, mut xgb, mut lgbm) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines().skip(1).filter(|l| !l.is_empty()) {
        let c: Vec<&str> = line.split(',').collect();
        rows.push(
            c[1..=FEATURES]
                .iter()
                .map(|v| {
                    if v.is_empty() {
                        f32::NAN
                    } else {
                        v.parse().unwrap()
                    }
                })
                .collect(),
        );
        xgb.push(c[36].parse().unwrap());
        lgbm.push(c[37].parse().unwrap());
    }
    assert_eq!(rows.len(), 1000);
    (rows, xgb, lgbm)
}

fn tree_repo(dst: &Path) {
    for (name, file, reference, _) in MODELS {
        let m = dst.join(name);
        std::fs::create_dir_all(m.join("1")).unwrap();
        std::fs::copy(
            root().join(format!("examples/models/{name}/model.toml")),
            m.join("model.toml"),
        )
        .unwrap();
        std::fs::copy(data_dir().join(reference), m.join("1").join(file)).unwrap();
    }
}

fn raw_request(model: &str, rows: &[Vec<f32>]) -> pb::ModelInferRequest {
    let raw: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    pb::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows.len() as i64, FEATURES as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![raw],
        ..Default::default()
    }
}

fn outputs(resp: &pb::ModelInferResponse) -> Vec<f32> {
    resp.raw_output_contents[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_models_over_model_infer_reproduce_the_libraries() {
    let dir = tempfile::tempdir().unwrap();
    tree_repo(dir.path());
    let cfg = ServerConfig::on_any_port(dir.path());
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let (rows, xgb, lgbm) = samples();

    for (name, _, _, platform) in MODELS {
        let want = if name == "fraud_xgb" { &xgb } else { &lgbm };
        let ready = c
            .model_ready(pb::ModelReadyRequest {
                name: name.into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(ready.ready, "{name} not ready");

        // Triton's ModelConfig and metadata name the kind.
        let mc = c
            .model_config(pb::ModelConfigRequest {
                name: name.into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .config
            .unwrap();
        assert_eq!(mc.platform, platform);
        assert_eq!(mc.backend, "mesh_trees");
        assert_eq!(mc.input[0].dims, vec![FEATURES as i64]);
        assert_eq!(mc.output[0].dims, vec![1]);
        // What the columns take, as parameters (mesh bench builds its rows from them).
        let param = |k: &str| mc.parameters.get(k).map(|p| p.string_value.as_str());
        assert_eq!(param("categorical_columns"), Some("32,33"));
        let missing = if name == "fraud_xgb" {
            "4,9,20,32,33"
        } else {
            "4,9,20"
        };
        assert_eq!(param("missing_columns"), Some(missing));
        let meta = c
            .model_metadata(pb::ModelMetadataRequest {
                name: name.into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(meta.platform, platform);
        let max = mc.max_batch_size as usize;

        // Every row, in requests of max_batch_size rows (raw bytes).
        let mut worst = 0f64;
        for (k, chunk) in rows.chunks(max).enumerate() {
            let resp = c
                .model_infer(raw_request(name, chunk))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(resp.model_version, "1");
            assert_eq!(resp.outputs[0].shape, vec![chunk.len() as i64, 1]);
            assert_eq!(resp.outputs[0].datatype, "FP32");
            for (j, got) in outputs(&resp).iter().enumerate() {
                worst = worst.max((f64::from(*got) - want[k * max + j]).abs());
            }
        }
        assert!(worst <= TOLERANCE, "{name} batches: max abs error {worst}");

        // One row per request, 16 callers at a time, the first 256 rows.
        let mut worst = 0f64;
        for (k, chunk) in rows[..256].chunks(16).enumerate() {
            let calls = chunk.iter().map(|x| {
                let mut c = c.clone();
                let req = raw_request(name, std::slice::from_ref(x));
                async move { c.model_infer(req).await.unwrap().into_inner() }
            });
            for (j, resp) in futures::future::join_all(calls).await.iter().enumerate() {
                worst = worst.max((f64::from(outputs(resp)[0]) - want[k * 16 + j]).abs());
            }
        }
        assert!(worst <= TOLERANCE, "{name} one row: max abs error {worst}");

        // Typed contents carry NaN in a declared missing column too.
        let i = rows
            .iter()
            .position(|r| r[4].is_nan())
            .expect("a row missing f4");
        let mut typed = raw_request(name, &rows[i..=i]);
        typed.raw_input_contents.clear();
        typed.inputs[0].contents = Some(pb::InferTensorContents {
            fp32_contents: rows[i].clone(),
            ..Default::default()
        });
        let resp = c.model_infer(typed).await.unwrap().into_inner();
        let got = f64::from(outputs(&resp)[0]);
        assert!(
            (got - want[i]).abs() <= TOLERANCE,
            "{name} row {i}: {got} vs {}",
            want[i]
        );

        // Refusals name the row and the column.
        let bad = |col: usize, x: f32| {
            let mut two = rows[..2].to_vec();
            two[1][col] = x;
            raw_request(name, &two)
        };
        for (what, req, needle) in [
            ("NaN in f0", bad(0, f32::NAN), "row 1 column 0 is NaN"),
            (
                "inf in f4",
                bad(4, f32::INFINITY),
                "row 1 column 4 is infinite",
            ),
            (
                "fractional mcc",
                bad(32, 3.5),
                "row 1 column 32 is categorical",
            ),
            (
                "negative country",
                bad(33, -1.0),
                "row 1 column 33 is categorical",
            ),
        ] {
            let err = c.model_infer(req).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{name} {what}: {err:?}");
            assert!(
                err.message().contains(needle),
                "{name} {what}: '{}' lacks '{needle}'",
                err.message()
            );
        }
    }
    server.shutdown().await;
}
