//! The prediction log behind a running mesh: N decisions and M OIP predictions
//! served -> exactly N + M records, with the right versions, roles, sources and
//! stage timings that add up to no more than the total.
use std::collections::HashMap;

use mesh_proto::inference as oip;
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_prediction_is_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    // The example model with an input spec of 32 request features.
    // The model part only: this test brings its own input spec.
    let mut toml_text = common::example_model_part();
    toml_text += "\n[input_spec]\n";
    for i in 0..32 {
        toml_text += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
    }
    common::model_repo(&dir.path().join("models"), &[3], &toml_text);
    let logs = dir.path().join("predictions");
    let cfg: MeshConfig = toml::from_str(&format!(
        // A generous decision deadline: this test is about logging, and a debug build
        // under a parallel test run can take longer than the default 50 ms.
        "[server]\ngrpc_port = 0\nhttp_port = 0\nmodels = \"{}\"\n[decisions]\ndeadline = \"5s\"\n[prediction_log]\ndir = \"{}\"\n",
        dir.path().join("models").display(),
        logs.display()
    ))
    .unwrap();
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let url = format!("http://{}", running.grpc_addr);
    let mut d = pb::decisions_client::DecisionsClient::connect(url.clone())
        .await
        .unwrap();
    let mut o = oip::grpc_inference_service_client::GrpcInferenceServiceClient::connect(url)
        .await
        .unwrap();
    const N: usize = 300;
    for i in 0..N {
        let features: HashMap<String, f64> = (0..32)
            .map(|j| (format!("f{j}"), ((i * 7 + j) % 11) as f64 / 10.0 - 0.5))
            .collect();
        let r = d
            .decide(pb::DecideRequest {
                request_id: format!("d{i}"),
                model: "fraud_mlp".into(),
                features,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.model_version, "3", "{:?}", r.reasons);
    }
    const M: usize = 20;
    for i in 0..M {
        let req = oip::ModelInferRequest {
            model_name: "fraud_mlp".into(),
            id: format!("o{i}"),
            inputs: vec![oip::model_infer_request::InferInputTensor {
                name: "input".into(),
                datatype: "FP32".into(),
                shape: vec![1, 32],
                contents: Some(oip::InferTensorContents {
                    fp32_contents: vec![0.1; 32],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        o.model_infer(req).await.unwrap();
    }
    running.shutdown().await;

    let records =
        mesh_prediction_log::read_all(&logs, mesh_prediction_log::ReadOptions::default()).unwrap();
    assert_eq!(records.len(), N + M);
    let decisions: Vec<_> = records
        .iter()
        .filter(|r| r.request_id.starts_with('d'))
        .collect();
    assert_eq!(decisions.len(), N);
    let mut ids: Vec<&str> = decisions.iter().map(|r| r.request_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N, "duplicate records");
    for r in &records {
        assert_eq!(r.version, "3");
        assert_eq!(r.source, "MODEL");
        let s = &r.stages;
        assert!(
            s.validate + s.features + s.preprocess + s.queue + s.compute + s.postprocess
                <= s.total + 1,
            "{s:?}"
        );
        assert!(r.score.is_some_and(|p| (0.0..=1.0).contains(&p)));
    }
    for r in decisions {
        assert!(r.decision.is_some());
        assert_eq!(r.features.as_ref().map(Vec::len), Some(32));
    }
}
