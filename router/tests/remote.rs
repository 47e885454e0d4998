//! A router whose features and model replicas live in other processes' roles
//! (here: other servers of this test process, real gRPC on 127.0.0.1): stored
//! features read from a `--role features` (`[features] remote`), with its failures
//! and silences taking the spec's defaults within the decision's deadline; model
//! replicas found by a DNS name (a fake resolver over two real model roles on
//! 127.0.0.1 and 127.0.0.2), followed as the name's addresses change.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use mesh_feature_store::Durability;
use mesh_proto::inference as ipb;
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use mesh_router::decide::discovery::Resolve;
use mesh_router::server::{start_mesh, start_mesh_with, Running};
use pb::decisions_client::DecisionsClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(text: &str) -> Running {
    start_mesh(&MeshConfig::from_toml(text).unwrap())
        .await
        .unwrap()
}

/// A features role holding f31 of the first `n` reference rows (card id = row).
async fn features_role(dir: &Path, n: usize) -> Running {
    let (_, views) = common::card_f31_files(dir);
    let running = serve(&format!(
        r#"
        [server]
        role = "features"
        grpc_port = 0
        http_port = 0
        [server.connections]
        shutdown_grace = "100ms"
        [features]
        path = "{db}"
        views = "{views}"
        "#,
        db = dir.join("db").display(),
        views = views.display(),
    ))
    .await;
    let rows = common::card_f31_rows(n);
    let store = running.store.clone().unwrap();
    store
        .push("card", rows, Durability::Buffered)
        .await
        .unwrap();
    running
}

/// A router role over its own copy of the model, with `extra` in its mesh.toml.
fn router_config(dir: &Path, deadline_ms: u64, extra: &str) -> MeshConfig {
    let (models, _) = common::card_f31_files(dir);
    MeshConfig::from_toml(&format!(
        r#"
        [server]
        role = "router"
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [decisions]
        deadline = "{deadline_ms}ms"
        default_decision = "review"
        {extra}
        "#,
        models = models.display(),
    ))
    .unwrap()
}

async fn client(r: &Running) -> DecisionsClient<tonic::transport::Channel> {
    DecisionsClient::connect(format!("http://{}", r.grpc_addr))
        .await
        .unwrap()
}

/// One decision with a generous caller timeout; (answer, time the caller waited).
async fn decide(
    c: &mut DecisionsClient<tonic::transport::Channel>,
    id: usize,
    x: &[f32],
) -> (pb::DecideResponse, Duration) {
    let t = Instant::now();
    let mut req = tonic::Request::new(common::decide_request(id, x));
    req.set_timeout(Duration::from_secs(5));
    let r = c.decide(req).await.unwrap().into_inner();
    (r, t.elapsed())
}

/// The Prometheus text of a mesh's HTTP port.
async fn metrics_text(addr: SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of the first sample whose line starts with `series`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_reads_features_from_a_features_role_and_survives_its_loss() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::samples();
    let features = features_role(dir.path(), 50).await;
    let url = format!("http://{}", features.grpc_addr);
    // One router bounded by the decision only, one with a lookup cap of 20 ms.
    let deadline_ms = 300;
    let plain = start_mesh(&router_config(
        dir.path(),
        deadline_ms,
        &format!("[features]\nremote = \"{url}\"\n"),
    ))
    .await
    .unwrap();
    let capped = start_mesh(&router_config(
        dir.path(),
        deadline_ms,
        &format!("[features]\nremote = \"{url}\"\nlookup_timeout = \"20ms\"\n"),
    ))
    .await
    .unwrap();
    assert!(
        plain.store.is_none(),
        "a remote-features router opens no store"
    );
    let mut c = client(&plain).await;

    // f31 comes from the features role: the score is the reference's.
    for (i, (x, p)) in rows.iter().enumerate().take(20) {
        let (r, _) = decide(&mut c, i, x).await;
        assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
        assert!(
            (r.score.unwrap() - p).abs() <= 1e-5,
            "row {i}: {:?} vs {p}",
            r.score
        );
        assert!(
            !r.reasons.iter().any(|m| m.contains("default")),
            "{:?}",
            r.reasons
        );
    }
    // A card the store does not know: NOT_FOUND, said.
    let (r, _) = decide(&mut c, 999, &rows[0].0).await;
    assert!(
        r.reasons.iter().any(|m| m.contains("card NOT_FOUND: f31")),
        "{:?}",
        r.reasons
    );

    // The features role goes away: decisions still answer, from the model, with
    // f31 UNAVAILABLE and the failure counted.
    let port = features.grpc_addr.port();
    features.shutdown().await;
    for (i, (x, _)) in rows.iter().enumerate().take(5) {
        let (r, waited) = decide(&mut c, i, x).await;
        assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
        assert!(
            r.reasons
                .iter()
                .any(|m| m.contains("card UNAVAILABLE: f31")),
            "{:?}",
            r.reasons
        );
        assert!(
            waited < Duration::from_millis(deadline_ms + 200),
            "{waited:?}"
        );
    }
    let text = metrics_text(plain.http_addr).await;
    let failed = sample(
        &text,
        "mesh_router_feature_lookup_failures_total{store=\"remote\"}",
    )
    .unwrap();
    assert!(failed >= 5.0, "{failed}");

    // Something answers TCP on its port but never speaks: each lookup waits out
    // its time and no more, and every decision still answers by its deadline.
    let hole = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            conns.push(s);
        }
    });
    for (i, (x, _)) in rows.iter().enumerate().take(3) {
        let t = Instant::now();
        let mut req = tonic::Request::new(common::decide_request(i, x));
        req.set_timeout(Duration::from_secs(5));
        let answer = c.decide(req).await;
        let waited = t.elapsed();
        assert!(
            waited < Duration::from_millis(deadline_ms + 200),
            "{waited:?}"
        );
        match answer {
            Ok(r) => {
                let r = r.into_inner();
                let total = r.timings.unwrap().total_us;
                assert!(total <= deadline_ms * 1000 + 2_000, "total {total} us");
                // The lookup took the model call's time: the fallback chain answered.
                assert_ne!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
            }
            // The fallback chain has the last 5 ms (the reserve); on a loaded
            // machine it can miss them too, and then the late answer is refused,
            // never sent as if it were in time.
            Err(s) => assert!(
                s.code() == tonic::Code::DeadlineExceeded
                    && s.message().contains("after the request's deadline"),
                "{s:?}"
            ),
        }
    }
    // With lookup_timeout, the lookup gives up early and the model still scores.
    let mut cc = client(&capped).await;
    for (i, (x, _)) in rows.iter().enumerate().take(3) {
        let (r, waited) = decide(&mut cc, i, x).await;
        assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
        assert!(r.timings.unwrap().features_us < 60_000, "{:?}", r.timings);
        assert!(
            r.reasons
                .iter()
                .any(|m| m.contains("card UNAVAILABLE: f31")),
            "{:?}",
            r.reasons
        );
        assert!(
            waited < Duration::from_millis(deadline_ms + 200),
            "{waited:?}"
        );
    }
    held.abort();
    plain.shutdown().await;
    capped.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_features_are_checked_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    // path and remote together: refused when the file is read.
    let e = MeshConfig::from_toml("[features]\npath = \"db\"\nremote = \"http://10.0.0.1:8001\"\n")
        .unwrap_err();
    assert!(e.contains("both set"), "{e}");
    let e = MeshConfig::from_toml("[features]\nremote = \"10.0.0.1:8001\"\n").unwrap_err();
    assert!(e.contains("http://"), "{e}");
    // A features role reads its own store, never a remote.
    let mut cfg = MeshConfig::from_toml("[features]\nremote = \"http://127.0.0.1:9\"\n").unwrap();
    cfg.server.role = mesh_router::config::Role::Features;
    cfg.server.grpc_port = 0;
    cfg.server.http_port = 0;
    let e = start_mesh(&cfg).await.err().unwrap().to_string();
    assert!(e.contains("not remote"), "{e}");
    // Nothing there: the start fails after remote_wait, naming the URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let cfg = router_config(
        dir.path(),
        50,
        &format!("[features]\nremote = \"{url}\"\nremote_wait = \"300ms\"\n"),
    );
    let t = Instant::now();
    let e = start_mesh(&cfg).await.err().unwrap().to_string();
    assert!(e.contains(&url) && e.contains("ListViews"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// A resolver whose answer the test changes.
struct Names(parking_lot::Mutex<Result<Vec<SocketAddr>, String>>);

impl Resolve for Names {
    fn resolve(&self, host: &str, _: u16) -> BoxFuture<'static, Result<Vec<SocketAddr>, String>> {
        assert_eq!(host, "models.mesh.test");
        let r = self.0.lock().clone();
        Box::pin(async move { r })
    }
}

/// A model role on `host:port` (port 0: any).
async fn model_role(dir: &Path, host: &str, port: u16) -> Running {
    let (models, _) = common::card_f31_files(dir);
    serve(&format!(
        r#"
        [server]
        role = "model"
        host = "{host}"
        grpc_port = {port}
        http_port = 0
        models = "{models}"
        [server.connections]
        shutdown_grace = "100ms"
        "#,
        models = models.display(),
    ))
    .await
}

/// Inferences a model role has run.
async fn inferences(r: &Running) -> u64 {
    let mut c = ipb::grpc_inference_service_client::GrpcInferenceServiceClient::connect(format!(
        "http://{}",
        r.grpc_addr
    ))
    .await
    .unwrap();
    let s = c
        .model_statistics(ipb::ModelStatisticsRequest {
            name: "fraud_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    s.model_stats.iter().map(|m| m.inference_count).sum()
}

/// The remote replicas in the router's stack of fraud_mlp v1.
fn replica_ids(r: &Running) -> Vec<String> {
    r.engine
        .as_ref()
        .unwrap()
        .stack("fraud_mlp", 1)
        .unwrap()
        .breaker_states()
        .into_iter()
        .map(|(id, _)| id.to_string())
        .filter(|id| !id.contains("/local"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_by_name_follow_the_names_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::samples();
    // Two model roles on one port, as two pods behind one headless service.
    let a = model_role(dir.path(), "127.0.0.1", 0).await;
    let port = a.grpc_addr.port();
    let b = model_role(dir.path(), "127.0.0.2", port).await;
    let names = Arc::new(Names(parking_lot::Mutex::new(Ok(vec![
        a.grpc_addr,
        b.grpc_addr,
    ]))));
    let cfg = router_config(
        dir.path(),
        2000,
        &format!(
            "resolve_interval = \"100ms\"\n[decisions.stack]\nper_try_timeout = \"250ms\"\n[[decisions.deployments]]\nmodel = \"fraud_mlp\"\nremote = [\"http://models.mesh.test:{port}\"]\n"
        ),
    );
    let router = start_mesh_with(&cfg, names.clone()).await.unwrap();
    let mut c = client(&router).await;
    let run = |c: &mut DecisionsClient<tonic::transport::Channel>, n: usize| {
        let mut c = c.clone();
        let rows = rows.clone();
        async move {
            for i in 0..n {
                let (r, _) = decide(&mut c, i % 50, &rows[i % 50].0).await;
                assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
            }
        }
    };
    run(&mut c, 5).await;
    let id = |ip: &str| format!("fraud_mlp/v1/http://models.mesh.test:{port}@{ip}");
    assert_eq!(replica_ids(&router), vec![id("127.0.0.1"), id("127.0.0.2")]);
    // The router's own actor groups answer slowly (but within the per-try timeout,
    // so that a call the balancer still sends them answers), so the balancer sends
    // the calls to the remote replicas.
    let engine = router.engine.clone().unwrap();
    for local in engine.replicas().iter().filter(|r| r.contains("/local")) {
        engine
            .fault(local)
            .unwrap()
            .set(Duration::from_millis(30), false);
    }
    // Both addresses take calls.
    run(&mut c, 150).await;
    let (a0, b0) = (inferences(&a).await, inferences(&b).await);
    assert!(a0 > 0 && b0 > 0, "a {a0}, b {b0}");

    // The name loses 127.0.0.1: its replica leaves, decisions go on without it.
    *names.0.lock() = Ok(vec![b.grpc_addr]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    run(&mut c, 5).await;
    assert_eq!(replica_ids(&router), vec![id("127.0.0.2")]);
    let a1 = inferences(&a).await;
    run(&mut c, 150).await;
    assert_eq!(inferences(&a).await, a1, "a retired replica takes no call");
    assert!(inferences(&b).await > b0);

    // A failing resolver keeps the last good set.
    *names.0.lock() = Err("SERVFAIL".into());
    tokio::time::sleep(Duration::from_millis(400)).await;
    run(&mut c, 5).await;
    assert_eq!(replica_ids(&router), vec![id("127.0.0.2")]);
    let text = metrics_text(router.http_addr).await;
    let failures = sample(
        &text,
        "mesh_router_resolve_failures_total{name=\"models.mesh.test\"}",
    )
    .unwrap();
    assert!(failures >= 1.0, "{failures}");

    // It comes back: 127.0.0.1 is a replica again, and used.
    *names.0.lock() = Ok(vec![a.grpc_addr, b.grpc_addr]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    run(&mut c, 150).await;
    assert_eq!(replica_ids(&router), vec![id("127.0.0.1"), id("127.0.0.2")]);
    assert!(
        inferences(&a).await > a1,
        "the returning address takes calls again"
    );
    router.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
