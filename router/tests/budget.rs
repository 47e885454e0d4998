//! The in-flight request budget ([server] max_inflight_bytes) on a real server:
//! a body larger than the whole pool is refused on both ports (RESOURCE_EXHAUSTED
//! over gRPC, 429 over HTTP), and requests that fit are answered, before and after.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;

use mesh_proto::inference as pb;
use mesh_router::config::ServerConfig;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;
use tonic::Code;

fn request(rows: usize) -> pb::ModelInferRequest {
    let raw: Vec<u8> = std::iter::repeat_n(0.25f32.to_le_bytes(), rows * 32)
        .flatten()
        .collect();
    pb::ModelInferRequest {
        model_name: "fraud_mlp".into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 32],
            ..Default::default()
        }],
        raw_input_contents: vec![raw],
        ..Default::default()
    }
}

async fn post(addr: std::net::SocketAddr, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v2/models/fraud_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_budget_are_refused() {
    let cfg = ServerConfig {
        // 16 rows of 32 f32 fit; 64 rows (8 KiB of raw contents) do not.
        max_inflight_bytes: 4096,
        ..common::examples_server()
    };
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    c.model_infer(request(16)).await.unwrap();
    let e = c.model_infer(request(64)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("max_inflight_bytes"),
        "{}",
        e.message()
    );
    // The refused body gave its bytes back: the pool is whole again.
    c.model_infer(request(16)).await.unwrap();

    let row = vec!["0.25"; 32].join(",");
    let small = format!(
        "{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,32],\"datatype\":\"FP32\",\"data\":[{row}]}}]}}"
    );
    assert_eq!(post(server.http_addr, &small).await, 200);
    let rows = vec![row.as_str(); 40].join(",");
    let big = format!(
        "{{\"inputs\":[{{\"name\":\"input\",\"shape\":[40,32],\"datatype\":\"FP32\",\"data\":[{rows}]}}]}}"
    );
    assert_eq!(post(server.http_addr, &big).await, 429);
    assert_eq!(post(server.http_addr, &small).await, 200);
    server.shutdown().await;
}
