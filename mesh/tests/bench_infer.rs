//! `mesh bench --target infer` against a real mesh serving the example models: the
//! rows it sends follow each model's metadata (34 values with integer codes in the
//! categorical columns for the XGBoost model, 32 for the MLP), so every request
//! answers OK; an unknown model is named before any load is sent.
#![allow(clippy::unwrap_used)]

use mesh::bench::{BenchArgs, Target};
use mesh_router::config::ServerConfig;

mod common;
use common::root;

fn args(addr: &str, model: &str) -> BenchArgs {
    BenchArgs {
        addr: addr.to_owned(),
        tls_ca: None,
        target: Target::Infer,
        model: model.to_owned(),
        rate: None,
        concurrency: 4,
        connections: 2,
        threads: 1,
        seconds: None,
        requests: Some(300),
        cards: 10,
        merchants: 10,
        json: false,
        html: None,
        deadline_ms: None,
        view: "card".into(),
        keys: 10,
        event_times_per_view: false,
        decode_values: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_rows_are_sized_from_the_models_metadata() {
    // The example repository as it is (fraud_mlp, fraud_xgb, fraud_lgbm).
    let cfg = ServerConfig {
        grpc_port: 0,
        http_port: 0,
        models: root().join("examples/models"),
        ..ServerConfig::default()
    };
    let server = mesh_router::server::start(&cfg).await.unwrap();
    let addr = format!("http://{}", server.grpc_addr);
    for model in ["fraud_xgb", "fraud_lgbm", "fraud_mlp"] {
        let report = mesh::bench::run(args(&addr, model)).await.unwrap();
        assert_eq!(report.requests, 300, "{model}");
        assert_eq!(
            report.codes.into_iter().collect::<Vec<_>>(),
            [("OK".to_string(), 300)],
            "{model}"
        );
        // The server computed them: its statistics are in the report.
        assert!(report.stages_us.contains_key("compute_infer"), "{model}");
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
    let e = mesh::bench::run(args(&addr, "nope")).await.unwrap_err();
    assert!(e.to_string().contains("ModelMetadata of 'nope'"), "{e:#}");
    server.shutdown().await;
}
