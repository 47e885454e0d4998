//! Generated inputs (proptest) against real servers and the real decision engine:
//! - OIP ModelInfer over gRPC and the REST mirror: whatever the tensors, names,
//!   shapes and contents, the answer is a success or a caller error (never
//!   INTERNAL/UNKNOWN or a 5xx), and the server keeps answering.
//! - Decide: the invariant that an APPROVE only ever comes from a finite
//!   probability from a named source (the model, a previous version or the batch
//!   score), whatever the request's features (huge, tiny, negative, NaN, missing).
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;

use std::collections::HashMap;
use std::sync::OnceLock;

use mesh_proto::inference as pb;
use mesh_proto::mesh::v1 as mpb;
use mesh_router::config::MeshConfig;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;
use proptest::prelude::*;
use tonic::Code;

struct World {
    rt: tokio::runtime::Runtime,
    running: mesh_router::server::Running,
    _dir: tempfile::TempDir,
}

/// One mesh for every case: the example model repository (whose fraud_mlp has an
/// input spec over the card and merchant views) and an empty feature store.
fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = common::root();
        let cfg: MeshConfig = toml::from_str(&format!(
            "[server]\ngrpc_port = 0\nhttp_port = 0\nmodels = \"{}\"\n\
             [features]\npath = \"{}\"\nviews = \"{}\"\n\
             [decisions]\ndeadline = \"2s\"\n[[decisions.deployments]]\nmodel = \"fraud_mlp\"\n",
            root.join("examples/models").display(),
            dir.path().join("features").display(),
            root.join("examples/features/views.toml").display(),
        ))
        .unwrap();
        let running = rt.block_on(mesh_router::server::start_mesh(&cfg)).unwrap();
        World {
            rt,
            running,
            _dir: dir,
        }
    })
}

fn caller_error(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::NotFound | Code::ResourceExhausted | Code::OutOfRange
    )
}

fn datatype() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("FP32".to_owned()),
        Just("FP64".to_owned()),
        Just("INT32".to_owned()),
        Just("INT64".to_owned()),
        Just("BYTES".to_owned()),
        Just("BOOL".to_owned()),
        "[A-Z0-9]{0,6}",
    ]
}

fn finite_or_not() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<f32>(),
        Just(f32::NAN),
        Just(f32::INFINITY),
        -10.0f32..10.0,
    ]
}

fn tensor() -> impl Strategy<Value = InferInputTensor> {
    (
        prop_oneof![Just("input".to_owned()), "[a-z]{0,8}"],
        datatype(),
        prop::collection::vec(-3i64..70, 0..4),
        prop::option::of(prop::collection::vec(finite_or_not(), 0..80)),
    )
        .prop_map(|(name, datatype, shape, fp32)| InferInputTensor {
            name,
            datatype,
            shape,
            parameters: HashMap::new(),
            contents: fp32.map(|v| pb::InferTensorContents {
                fp32_contents: v,
                ..Default::default()
            }),
        })
}

fn infer_request() -> impl Strategy<Value = pb::ModelInferRequest> {
    (
        prop_oneof![Just("fraud_mlp".to_owned()), "[a-z_]{0,12}"],
        prop_oneof![Just(String::new()), Just("1".to_owned()), "[0-9a-z]{0,4}"],
        prop::collection::vec(tensor(), 0..3),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..3),
    )
        .prop_map(
            |(model_name, model_version, inputs, raw)| pb::ModelInferRequest {
                model_name,
                model_version,
                inputs,
                raw_input_contents: raw,
                ..Default::default()
            },
        )
}

/// A REST body: valid JSON of the right shape with generated values, or not.
fn rest_body() -> impl Strategy<Value = String> {
    let data = prop::collection::vec(
        prop_oneof![
            (-1e40f64..1e40).prop_map(|x| format!("{x}")),
            Just("1e999".to_owned()),
            Just("\"x\"".to_owned()),
            Just("[1,[2]]".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
        ],
        0..70,
    );
    prop_oneof![
        (datatype(), prop::collection::vec(-2i64..40, 0..3), data).prop_map(|(dt, shape, d)| {
            format!(
                "{{\"inputs\":[{{\"name\":\"input\",\"shape\":{shape:?},\"datatype\":\"{dt}\",\"data\":[{}]}}]}}",
                d.join(",")
            )
        }),
        "\\PC{0,60}",
    ]
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn oip_grpc_answers_or_refuses_never_fails(req in infer_request()) {
        let w = world();
        let code = w.rt.block_on(async {
            let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", w.running.grpc_addr)).await.unwrap();
            match c.model_infer(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    // An answer is the model's: probabilities.
                    for chunk in r.raw_output_contents.iter().flat_map(|b| b.chunks_exact(4)) {
                        let p = f32::from_le_bytes(chunk.try_into().unwrap());
                        assert!((0.0..=1.0).contains(&p), "answer {p}");
                    }
                    Code::Ok
                }
                Err(s) => s.code(),
            }
        });
        prop_assert!(code == Code::Ok || caller_error(code), "{code:?}");
    }

    #[test]
    fn rest_answers_or_refuses_never_fails(body in rest_body()) {
        let w = world();
        let status = w.rt.block_on(post(w.running.http_addr, "/v2/models/fraud_mlp/infer", &body));
        prop_assert!(status == 200 || (400..500).contains(&status), "{status} for {body}");
    }

    #[test]
    fn an_approve_comes_only_from_a_finite_probability_from_a_named_source(
        features in prop::collection::hash_map(
            prop_oneof![Just("amount".to_owned()), Just("f18".to_owned()), "[a-z]{1,6}"],
            prop_oneof![any::<f64>(), -1e6f64..1e6, Just(f64::NAN), Just(1e300), Just(-0.0)],
            0..6,
        ),
        card in any::<i64>(),
        category in prop_oneof![Just("grocery".to_owned()), Just("gaming".to_owned()), "[a-z]{0,5}"],
    ) {
        let w = world();
        let engine = w.running.engine.clone().unwrap();
        let req = mpb::DecideRequest {
            request_id: "p".into(),
            model: "fraud_mlp".into(),
            entities: [
                ("card_id".to_owned(), mpb::EntityKey { key: Some(mpb::entity_key::Key::Int64Key(card)) }),
                ("merchant_id".to_owned(), mpb::EntityKey { key: Some(mpb::entity_key::Key::StringKey("m000001".into())) }),
            ].into(),
            features,
            categorical: [("merchant_category".to_owned(), category)].into(),
            ..Default::default()
        };
        let out = w.rt.block_on(engine.decide_batch(std::slice::from_ref(&req), (std::time::Instant::now(), None)));
        match out {
            Err(e) => prop_assert!(caller_error(e.code()), "{e}"),
            Ok(outcomes) => {
                for o in outcomes {
                    let p = o.to_proto();
                    if p.decision == mpb::Decision::Approve as i32 {
                        let named = [mpb::AnswerSource::Model, mpb::AnswerSource::PreviousVersion, mpb::AnswerSource::BatchScore]
                            .iter().any(|s| *s as i32 == p.source);
                        prop_assert!(named, "approve from source {}: {:?}", p.source, p.reasons);
                        let s = p.score.unwrap_or(f32::NAN);
                        prop_assert!(s.is_finite() && (0.0..=1.0).contains(&s), "approve with score {s}");
                    }
                }
            }
        }
    }
}
