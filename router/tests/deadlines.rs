//! Deadlines from arrival and admission by deadline, on real servers: a request
//! whose answer is expected after its deadline is refused at once (OIP:
//! RESOURCE_EXHAUSTED naming the model, the expected answer time and the time
//! left; Decide: the fallback chain, with the reason), and the deadline counts from
//! when the request arrived, not from when its handler ran.
#![allow(clippy::unwrap_used)] // tests may unwrap
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_model_actor::{ActorSystem, ModelRepository};
use mesh_proto::inference as pb;
use mesh_proto::mesh::v1 as mpb;
use mesh_router::config::MeshConfig;
use mesh_router::decide::{AnswerSource, Engine, Outcome, OutcomeSink};
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

mod common;

/// Hidden width of the heavy model: a 64-row batch is about 275 M multiply-adds,
/// tens of milliseconds on one core.
const HIDDEN: usize = 2048;

/// Writes a safetensors file of f32 tensors (name, shape, values).
fn write_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, shape, data) in tensors {
        let end = offset + data.len() * 4;
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    for (_, _, data) in tensors {
        for x in data {
            f.write_all(&x.to_le_bytes()).unwrap();
        }
    }
}

/// Small pseudo-random weights (xorshift), scaled by 1/sqrt(fan-in).
fn weights(n: usize, fan_in: usize, seed: &mut u64) -> Vec<f32> {
    let scale = 1.0 / (fan_in as f32).sqrt();
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `<dir>/models/heavy`: an MLP 32 -> 2048 -> 2048 -> 1, one runner, batches of up
/// to 64 rows, decided from 32 request features (`f0`..`f31`).
fn heavy_repo(dir: &Path) -> PathBuf {
    let m = dir.join("models/heavy");
    std::fs::create_dir_all(m.join("1")).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15;
    let sizes = [32, HIDDEN, HIDDEN, 1];
    let mut tensors = Vec::new();
    for i in 0..3 {
        let (n_in, n_out) = (sizes[i], sizes[i + 1]);
        tensors.push((
            ["l0.weight", "l1.weight", "l2.weight"][i],
            vec![n_out, n_in],
            weights(n_in * n_out, n_in, &mut seed),
        ));
        tensors.push((
            ["l0.bias", "l1.bias", "l2.bias"][i],
            vec![n_out],
            vec![0.0; n_out],
        ));
    }
    write_safetensors(&m.join("1/model.safetensors"), &tensors);
    let mut spec = String::from("[input_spec]\non_missing = \"default\"\n");
    for i in 0..32 {
        spec += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
    }
    std::fs::write(
        m.join("model.toml"),
        format!(
            r#"
kind = "mlp"
[[inputs]]
name = "input"
datatype = "FP32"
dims = [32]
[[outputs]]
name = "probability"
datatype = "FP32"
dims = [1]
[mlp]
activations = ["relu", "relu"]
output_activation = "sigmoid"
[batching]
max_batch_size = 64
queue_capacity = 1024
runner_instances = 1
default_timeout_ms = 30000
[warmup]
batches = 2
batch_size = 64
{spec}
[decision]
review_at = 0.5
decline_at = 0.9
"#
        ),
    )
    .unwrap();
    dir.join("models")
}

fn infer_request(rows: usize) -> pb::ModelInferRequest {
    let raw: Vec<u8> = (0..rows * 32)
        .flat_map(|i| ((i % 7) as f32 * 0.1).to_le_bytes())
        .collect();
    pb::ModelInferRequest {
        model_name: "heavy".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 32],
            ..Default::default()
        }],
        raw_input_contents: vec![raw],
        ..Default::default()
    }
}

type Client = GrpcInferenceServiceClient<tonic::transport::Channel>;

/// Queues `n` requests of 64 rows with no deadline of their own (the model's 30 s),
/// and waits until all are admitted: several batches of work ahead of anything
/// that comes next.
async fn fill(c: &Client, repo: &ModelRepository, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let tasks = (0..n)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move {
                c.model_infer(infer_request(64)).await.unwrap();
            })
        })
        .collect();
    let h = repo.get("heavy", None).unwrap();
    let t = Instant::now();
    while h.in_flight() < n {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "only {} admitted",
            h.in_flight()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tasks
}

fn assert_names_the_refusal(msg: &str) {
    assert!(
        msg.contains("model 'heavy' version 1 cannot answer in time: expected answer in "),
        "{msg}"
    );
    assert!(msg.contains("batches ahead of"), "{msg}");
    assert!(msg.contains("of the request's deadline is left"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oip_refuses_at_once_what_its_model_cannot_answer_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = mesh_router::config::ServerConfig::on_any_port(heavy_repo(dir.path()));
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let repo = server.core.as_ref().unwrap().repo.clone();
    let c = Client::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let queued = fill(&c, &repo, 12).await;

    // gRPC: 30 ms left, a dozen batches of tens of milliseconds ahead.
    let mut req = tonic::Request::new(infer_request(1));
    req.set_timeout(Duration::from_millis(30));
    let t = Instant::now();
    let s = c.clone().model_infer(req).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_names_the_refusal(s.message());
    assert!(t.elapsed() < Duration::from_millis(30), "{:?}", t.elapsed());

    // REST: the same refusal, 429 with the message.
    let body = serde_json::json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": vec![0.0; 32]}]});
    let (status, text) = http_post(
        server.http_addr,
        "/v2/models/heavy/infer",
        &[("x-mesh-timeout-ms", "30")],
        body.to_string().as_bytes(),
        Duration::ZERO,
    )
    .await;
    assert_eq!(status, 429, "{text}");
    assert_names_the_refusal(&text);

    // Those with time enough are answered.
    for q in queued {
        q.await.unwrap();
    }
    let metrics = mesh_router::telemetry::metrics().render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("mesh_model_dropped_requests_total")
                && l.contains("model=\"heavy\"")
                && l.contains("reason=\"cannot_meet_deadline\"")),
        "no cannot_meet_deadline count in /metrics"
    );
    server.shutdown().await;
}

/// One ModelInfer call over a raw HTTP/2 connection with a `grpc-timeout` header but
/// no timer of the client's own (tonic's client and the other stock clients end the
/// call themselves when it passes): what the server answers. Returns the
/// `grpc-status` and `grpc-message` and how long the answer took.
async fn raw_grpc_infer(
    addr: std::net::SocketAddr,
    req: &pb::ModelInferRequest,
    grpc_timeout: &str,
) -> (String, String, Duration) {
    use prost::Message as _;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let http = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/inference.GRPCInferenceService/ModelInfer"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", grpc_timeout)
        .body(())
        .unwrap();
    let body = req.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(0);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    let t = Instant::now();
    let (response, mut send) = client.send_request(http, false).unwrap();
    send.send_data(bytes::Bytes::from(frame), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let took = t.elapsed();
    let fields = common::grpc_status_fields(response).await.unwrap();
    let get = |k: &str| {
        fields
            .get(k)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    (get("grpc-status"), get("grpc-message"), took)
}

/// A gRPC request admitted on a wrong estimate (no warmup: the model's batch time
/// is not learned yet) whose `grpc-timeout` passes while it waits behind slow
/// batches: the server answers DEADLINE_EXCEEDED (4) naming the wait, never CANCELLED
/// (1) and never an answer. (A tonic client reports CANCELLED "Timeout expired" when
/// its own timer for the header fires first: that status is the client's, not the
/// server's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_request_that_times_out_in_the_queue_is_deadline_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let models = heavy_repo(dir.path());
    let toml = models.join("heavy/model.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(&toml, text.replace("batches = 2", "batches = 0")).unwrap();
    let cfg = mesh_router::config::ServerConfig::on_any_port(models);
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let c = Client::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let mut deadline_exceeded = 0;
    for round in 0..6 {
        // Full batches ahead (each tens of milliseconds), then one row with 20 ms.
        let ahead: Vec<_> = (0..3)
            .map(|_| {
                let mut c = c.clone();
                tokio::spawn(async move { c.model_infer(infer_request(64)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (status, message, took) =
            raw_grpc_infer(server.grpc_addr, &infer_request(1), "20m").await;
        for a in ahead {
            a.await.unwrap().unwrap();
        }
        match status.as_str() {
            "4" => {
                deadline_exceeded += 1;
                assert!(took < Duration::from_millis(60), "round {round}: {took:?}");
                // grpc-message is percent-encoded.
                let message = message.replace("%20", " ");
                assert!(message.contains("waiting for the model"), "{message}");
            }
            // Refused at once, on the estimate learned from earlier rounds' batches.
            "8" if round > 0 => {}
            other => panic!("round {round}: grpc-status {other:?} ({message}) after {took:?}"),
        }
    }
    assert!(deadline_exceeded >= 1);
    server.shutdown().await;
}

/// A raw HTTP/1.1 POST whose body is sent `body_after` after its headers (a slow
/// client, or a request that waits before its handler runs). Answers the status and
/// the response body.
async fn http_post(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    body_after: Duration,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    s.flush().await.unwrap();
    tokio::time::sleep(body_after).await;
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_counts_from_arrival_not_from_the_handler() {
    let cfg = common::examples_server();
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let body = serde_json::json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": vec![0.0; 32]}]})
        .to_string();
    let path = "/v2/models/fraud_mlp/infer";
    let timeout = [("x-mesh-timeout-ms", "100")];
    // Sent at once: answered well within 100 ms.
    let (status, text) = http_post(
        server.http_addr,
        path,
        &timeout,
        body.as_bytes(),
        Duration::ZERO,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    // Headers now, body 200 ms later: the handler runs after the deadline, which
    // counts from the headers' arrival. Not computed, not OK.
    let (status, text) = http_post(
        server.http_addr,
        path,
        &timeout,
        body.as_bytes(),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(status, 504, "{text}");
    assert!(
        text.contains("deadline of 100.000 ms after its arrival passed before its work started"),
        "{text}"
    );
    let metrics = mesh_router::telemetry::metrics().render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("mesh_router_requests_total")
                && l.contains("model=\"fraud_mlp\"")
                && l.contains("protocol=\"http\"")
                && l.contains("code=\"deadline_exceeded\"")),
        "the late request is not counted as deadline_exceeded"
    );
    server.shutdown().await;
}

/// Keeps every outcome the engine logs.
#[derive(Default)]
struct Kept(parking_lot::Mutex<Vec<Outcome>>);

impl OutcomeSink for Kept {
    fn record(&self, o: &Outcome) {
        self.0.lock().push(o.clone());
    }
}

fn decide_request(id: &str) -> mpb::DecideRequest {
    mpb::DecideRequest {
        request_id: id.into(),
        model: "heavy".into(),
        features: (0..32).map(|i| (format!("f{i}"), 0.1 * i as f64)).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_goes_to_the_fallbacks_when_the_model_cannot_answer_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let models = heavy_repo(dir.path());
    let cfg: MeshConfig = toml::from_str(&format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{}"
        [decisions]
        deadline = "50ms"
        default_decision = "review"
        [decisions.stack]
        per_try_timeout = "40ms"
        "#,
        models.display()
    ))
    .unwrap();
    let server = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let repo = server.core.as_ref().unwrap().repo.clone();
    let c = Client::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    // An idle model answers the decision itself.
    let mut d =
        mpb::decisions_client::DecisionsClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
    let a = d.decide(decide_request("idle")).await.unwrap().into_inner();
    assert_eq!(a.source, mpb::AnswerSource::Model as i32, "{:?}", a.reasons);
    let queued = fill(&c, &repo, 12).await;
    let t = Instant::now();
    let a = d.decide(decide_request("busy")).await.unwrap().into_inner();
    let took = t.elapsed();
    assert_eq!(
        a.source,
        mpb::AnswerSource::Default as i32,
        "{:?}",
        a.reasons
    );
    assert!(
        a.reasons
            .iter()
            .any(|r| r.contains("cannot answer in time")),
        "{:?}",
        a.reasons
    );
    // Refused at admission: answered at once, not at the deadline.
    assert!(took < Duration::from_millis(40), "{took:?}");
    for q in queued {
        q.await.unwrap();
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_past_its_deadline_is_not_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Arc::new(
        ModelRepository::new(heavy_repo(dir.path()), ActorSystem::start().unwrap()).unwrap(),
    );
    repo.load_all().await.unwrap();
    let kept = Arc::new(Kept::default());
    let engine = Engine::new(
        repo,
        None,
        Default::default(),
        Some(kept.clone() as Arc<dyn OutcomeSink>),
        Arc::new(mesh_router::decide::discovery::SystemResolver),
    )
    .unwrap();
    // Arrived 80 ms ago with the default 50 ms budget: DEADLINE_EXCEEDED without
    // any work, logged as not answered.
    let arrived = Instant::now() - Duration::from_millis(80);
    let e = engine
        .decide_batch(&[decide_request("late")], (arrived, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(
        e.message().contains("passed before its work started"),
        "{e}"
    );
    let logged = std::mem::take(&mut *kept.0.lock());
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].source, AnswerSource::Deadline);
    assert_eq!(logged[0].source.as_str(), "DEADLINE");
    assert!(
        logged[0].reasons[0].starts_with("not answered: "),
        "{:?}",
        logged[0].reasons
    );
    // Arrived in time: answered by the model, logged as such.
    let ok = engine
        .decide_batch(
            &[decide_request("ok")],
            (Instant::now(), Some(Duration::from_secs(1))),
        )
        .await
        .unwrap();
    assert_eq!(ok[0].source, AnswerSource::Model, "{:?}", ok[0].reasons);
    assert_eq!(kept.0.lock()[0].source, AnswerSource::Model);
}
