//! The OIP v2 gRPC and REST servers, started for real on 127.0.0.1:0 with the
//! example repository (the reference fraud model), called with generated clients.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise

use std::time::Duration;

use mesh_proto::inference as pb;
use mesh_router::config::ServerConfig;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;
use tonic::Code;

mod common;
use common::samples;

async fn serve(max_message_bytes: usize) -> mesh_router::server::Running {
    let cfg = ServerConfig {
        max_message_bytes,
        ..common::examples_server()
    };
    mesh_router::server::start(&cfg).await.unwrap()
}

fn raw_request(model: &str, rows: &[&[f32]]) -> pb::ModelInferRequest {
    let mut raw = Vec::new();
    for r in rows {
        for x in *r {
            raw.extend_from_slice(&x.to_le_bytes());
        }
    }
    pb::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows.len() as i64, 32],
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
async fn model_infer_reproduces_the_reference_and_rejects_bad_input() {
    let server = serve(1 << 20).await;
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let rows = samples();

    assert!(
        c.server_live(pb::ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let meta = c
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(meta.extensions.contains(&"statistics".to_string()));
    let cfg = c
        .model_config(pb::ModelConfigRequest {
            name: "fraud_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(
        (cfg.max_batch_size, cfg.input[0].dims.clone()),
        (64, vec![32])
    );

    // One row per request, 16 callers at a time.
    let mut worst = 0f32;
    for chunk in rows.chunks(16) {
        let calls = chunk.iter().map(|(x, _)| {
            let mut c = c.clone();
            let req = raw_request("fraud_mlp", &[x]);
            async move { c.model_infer(req).await.unwrap().into_inner() }
        });
        for (resp, (_, want)) in futures::future::join_all(calls).await.iter().zip(chunk) {
            // The example serves versions 1 and 2 (the same weights); 2 answers.
            assert_eq!(resp.model_version, "2");
            worst = worst.max((outputs(resp)[0] - want).abs());
        }
    }
    assert!(worst <= 1e-5, "one-row max error {worst}");

    // Batches in one request, and typed contents instead of raw bytes.
    for size in [3usize, 64] {
        for chunk in rows.chunks(size) {
            let xs: Vec<&[f32]> = chunk.iter().map(|(x, _)| x.as_slice()).collect();
            let resp = c
                .model_infer(raw_request("fraud_mlp", &xs))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(resp.outputs[0].shape, vec![chunk.len() as i64, 1]);
            for (got, (_, want)) in outputs(&resp).iter().zip(chunk) {
                assert!((got - want).abs() <= 1e-5, "batch {size}: {got} vs {want}");
            }
        }
    }
    let mut typed = raw_request("fraud_mlp", &[&rows[0].0]);
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(pb::InferTensorContents {
        fp32_contents: rows[0].0.clone(),
        ..Default::default()
    });
    let resp = c.model_infer(typed).await.unwrap().into_inner();
    assert!((outputs(&resp)[0] - rows[0].1).abs() <= 1e-5);

    // Bad input: each answers with its status and a message naming the problem.
    let x = &rows[0].0[..];
    let mut cases: Vec<(&str, pb::ModelInferRequest, Code, &str)> = Vec::new();
    cases.push((
        "unknown model",
        raw_request("nope", &[x]),
        Code::NotFound,
        "nope",
    ));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.model_version = "9".into();
    cases.push(("unknown version", r, Code::NotFound, "9"));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.inputs[0].datatype = "FP64".into();
    cases.push(("wrong datatype", r, Code::InvalidArgument, "FP64"));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.inputs[0].shape = vec![1, 31];
    cases.push(("wrong shape", r, Code::InvalidArgument, "shape"));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.inputs[0].shape = vec![2, 32];
    cases.push(("wrong element count", r, Code::InvalidArgument, "bytes"));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.inputs[0].name = "features".into();
    cases.push(("wrong input name", r, Code::InvalidArgument, "features"));
    let mut nan = x.to_vec();
    nan[3] = f32::NAN;
    cases.push((
        "NaN",
        raw_request("fraud_mlp", &[&nan]),
        Code::InvalidArgument,
        "NaN",
    ));
    let many: Vec<&[f32]> = (0..65).map(|_| x).collect();
    cases.push((
        "too many rows",
        raw_request("fraud_mlp", &many),
        Code::InvalidArgument,
        "64",
    ));
    let big: Vec<&[f32]> = (0..9000).map(|_| x).collect();
    cases.push((
        "over the size limit",
        raw_request("fraud_mlp", &big),
        Code::ResourceExhausted,
        "too large",
    ));
    let mut r = raw_request("fraud_mlp", &[x]);
    r.outputs = vec![pb::model_infer_request::InferRequestedOutputTensor {
        name: "score".into(),
        ..Default::default()
    }];
    cases.push(("unknown output", r, Code::InvalidArgument, "score"));
    for (what, req, code, needle) in cases {
        let err = tokio::time::timeout(Duration::from_secs(10), c.model_infer(req))
            .await
            .expect(what)
            .unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{what}: message '{}' lacks '{needle}'",
            err.message()
        );
    }

    // Server-side statistics count what ran.
    let stats = c
        .model_statistics(pb::ModelStatisticsRequest {
            name: "fraud_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    // One entry per served version; version 2 answered everything.
    let versions: Vec<&str> = stats
        .model_stats
        .iter()
        .map(|s| s.version.as_str())
        .collect();
    assert_eq!(versions, ["1", "2"]);
    let s = &stats.model_stats[1];
    assert!(s.inference_count >= 3000, "{}", s.inference_count);
    assert!(s.execution_count > 0 && s.execution_count <= s.inference_count);
    let inf = s.inference_stats.unwrap();
    assert!(inf.queue.unwrap().count > 0 && inf.compute_infer.unwrap().ns > 0);

    // The REST mirror and the operational endpoints.
    let http = reqwest_lite(&server.http_addr.to_string());
    let body = serde_json::json!({
        "inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": rows[1].0}]
    });
    let (status, text) = http
        .post("/v2/models/fraud_mlp/infer", &body.to_string())
        .await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let got = v["outputs"][0]["data"][0].as_f64().unwrap() as f32;
    assert!((got - rows[1].1).abs() <= 1e-5);
    assert_eq!(v["model_version"], "2");
    let (status, text) = http.post("/v2/models/nope/infer", &body.to_string()).await;
    assert_eq!(status, 404);
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("nope")
    );
    let (status, text) = http.post("/v2/models/fraud_mlp/infer", "{not json").await;
    assert_eq!(status, 400, "{text}");
    let (status, metrics) = http.get("/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "mesh_router_requests_total",
        "mesh_model_queue_wait_seconds_bucket",
        "mesh_model_batch_size_bucket",
        "mesh_model_compute_seconds_bucket",
        "mesh_model_queue_length",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    assert_eq!(http.get("/readyz").await.0, 200);
    assert_eq!(http.get("/v2/health/ready").await.0, 200);
    server.shutdown().await;
}

/// A tiny HTTP/1.1 client over a TcpStream (one request per connection).
struct Http {
    addr: String,
}

fn reqwest_lite(addr: &str) -> Http {
    Http {
        addr: addr.to_owned(),
    }
}

impl Http {
    async fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text[9..12].parse().unwrap();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
    async fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path, "").await
    }
    async fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.request("POST", path, body).await
    }
}
