//! `mesh bench --target infer` against a real mesh serving the example models: the
//! rows it sends follow each model's metadata (34 values with integer codes in the
//! categorical columns for the XGBoost model, 32 for the MLP), so every request
//! answers OK, sent by the bench's own client and by tonic's; an unknown model is
//! named before any load is sent.
#![allow(clippy::unwrap_used)]

use mesh::bench::{BenchArgs, GrpcClient};

mod common;
use common::{bench_args, examples_server};

fn args(addr: &str, model: &str) -> BenchArgs {
    BenchArgs {
        model: model.to_owned(),
        connections: 2,
        ..bench_args(addr)
    }
}

/// Rows the server has answered for fraud_mlp (OIP ModelStatistics).
async fn inferences(addr: &str) -> u64 {
    use mesh_proto::inference as oip;
    let mut c =
        oip::grpc_inference_service_client::GrpcInferenceServiceClient::connect(addr.to_owned())
            .await
            .unwrap();
    let stats = c
        .model_statistics(oip::ModelStatisticsRequest {
            name: "fraud_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    stats.model_stats.iter().map(|m| m.inference_count).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_rows_are_sized_from_the_models_metadata() {
    // The example repository as it is (fraud_mlp, fraud_xgb, fraud_lgbm).
    let cfg = examples_server();
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let addr = format!("http://{}", server.grpc_addr);
    for model in ["fraud_xgb", "fraud_lgbm", "fraud_mlp"] {
        for grpc_client in [GrpcClient::Lean, GrpcClient::Tonic] {
            let report = mesh::bench::run(BenchArgs {
                grpc_client,
                ..args(&addr, model)
            })
            .await
            .unwrap();
            assert_eq!(report.requests, 300, "{model} {grpc_client:?}");
            assert_eq!(
                report.codes.into_iter().collect::<Vec<_>>(),
                [("OK".to_string(), 300)],
                "{model} {grpc_client:?}"
            );
            // The server computed them: its statistics are in the report.
            assert!(report.stages_us.contains_key("compute_infer"), "{model}");
        }
    }
    // The open loop, paced on a timerfd: every request sent and answered, on
    // schedule (a pacer that sent them all at once would end well before 0.2 s).
    let open = BenchArgs {
        rate: Some(2_000.0),
        requests: Some(400),
        ..args(&addr, "fraud_mlp")
    };
    let report = mesh::bench::run(open).await.unwrap();
    assert_eq!(report.requests, 400);
    assert_eq!(report.codes.get("OK"), Some(&400), "{:?}", report.codes);
    assert!(report.seconds >= 0.199, "{}", report.seconds);
    // A warm-up sends the same load first and leaves it out of the report: the
    // server answered about 500 more than the 400 reported.
    let before = inferences(&addr).await;
    let warmed = BenchArgs {
        rate: Some(2_000.0),
        requests: Some(400),
        warmup: 0.25,
        ..args(&addr, "fraud_mlp")
    };
    let report = mesh::bench::run(warmed).await.unwrap();
    assert_eq!(report.requests, 400);
    assert_eq!(report.codes.get("OK"), Some(&400), "{:?}", report.codes);
    let served = inferences(&addr).await - before;
    assert!((850..=950).contains(&served), "{served}");
    let e = mesh::bench::run(args(&addr, "nope")).await.unwrap_err();
    assert!(e.to_string().contains("ModelMetadata of 'nope'"), "{e:#}");
    server.shutdown().await;
}

/// `--alternate-addr`: one open loop, each second to the other of two real servers.
/// Each server computed exactly the rows of the seconds the report says went to it,
/// the report gives each its median per-second p99, and a closed loop is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alternating_run_sends_each_second_to_one_server_in_turn() {
    let cfg = examples_server();
    let a = mesh_router::server::start(&cfg).await.unwrap();
    let b = mesh_router::server::start(&cfg).await.unwrap();
    let (addr_a, addr_b) = (
        format!("http://{}", a.grpc_addr),
        format!("http://{}", b.grpc_addr),
    );
    let (before_a, before_b) = (inferences(&addr_a).await, inferences(&addr_b).await);
    let report = mesh::bench::run(BenchArgs {
        rate: Some(400.0),
        requests: None,
        seconds: Some(3.0),
        alternate_addr: Some(addr_b.clone()),
        ..args(&addr_a, "fraud_mlp")
    })
    .await
    .unwrap();
    assert_eq!(report.codes.get("OK"), Some(&1200), "{:?}", report.codes);
    let to: Vec<&str> = report
        .windows
        .iter()
        .map(|w| w.sent_to.as_deref().unwrap())
        .collect();
    assert_eq!(to, [&addr_a, &addr_b, &addr_a]);
    let sent = |addr: &str| -> u64 {
        report
            .windows
            .iter()
            .filter(|w| w.sent_to.as_deref() == Some(addr))
            .map(|w| w.requests)
            .sum()
    };
    assert_eq!(inferences(&addr_a).await - before_a, sent(&addr_a));
    assert_eq!(inferences(&addr_b).await - before_b, sent(&addr_b));
    assert_eq!((sent(&addr_a), sent(&addr_b)), (800, 400));
    let by = report.by_server();
    assert_eq!(
        by.iter()
            .map(|s| (s.addr.as_str(), s.seconds))
            .collect::<Vec<_>>(),
        [(addr_a.as_str(), 2), (addr_b.as_str(), 1)]
    );
    assert!(by.iter().all(|s| s.p99_us > 0), "{by:?}");
    assert!(
        report.to_string().contains(&format!("{addr_b}: 1 seconds")),
        "{report}"
    );
    let e = mesh::bench::run(BenchArgs {
        alternate_addr: Some(addr_b),
        ..args(&addr_a, "fraud_mlp")
    })
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("--alternate-addr needs --rate"),
        "{e:#}"
    );
    a.shutdown().await;
    b.shutdown().await;
}
