//! A model's decision config is checked where it is written: at start and at every
//! load, `[input_spec]` sources must name features the store has (with a type the
//! entry can use), the spec must parse and fill the model's width, or the version is
//! refused and what was served keeps serving. Decisions that use defaults say so.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mesh_feature_store::{Durability, EntityKey, Row, Value};
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use pb::decisions_client::DecisionsClient;

mod common;

/// The reference model reading f0..f30 from the request and `card_source` (f31).
fn model_toml(card_source: &str) -> String {
    let base: String = common::example_model_part()
        .lines()
        .filter(|l| !l.starts_with("latest"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut spec = String::from("\n[input_spec]\non_missing = \"default\"\n");
    for i in 0..31 {
        spec += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
    }
    spec += &format!("[[input_spec.features]]\nsource = \"{card_source}\"\n");
    base.replace("[version_policy]", "[version_policy]\nall = true") + &spec
}

fn setup(dir: &Path, card_source: &str, versions: &[u64], extra: &str) -> MeshConfig {
    common::model_repo(&dir.join("models"), versions, &model_toml(card_source));
    std::fs::write(
        dir.join("views.toml"),
        r#"
        [[entities]]
        name = "card"
        join_key = "card_id"
        key_type = "int64"
        [[views]]
        name = "card"
        entity = "card"
        max_age = "1h"
        features = [{ name = "txn_count_1h", type = "f32" }, { name = "home_country", type = "string" }]
        "#,
    )
    .unwrap();
    let text = format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [features]
        path = "{db}"
        views = "{views}"
        [decisions]
        deadline = "2s"
        [decisions.stack]
        per_try_timeout = "1s"   # a debug build under a parallel test run is slow
        [[decisions.deployments]]
        model = "fraud_mlp"
        {extra}
        "#,
        models = dir.join("models").display(),
        db = dir.join("db").display(),
        views = dir.join("views.toml").display(),
    );
    toml::from_str(&text).unwrap()
}

fn models(dir: &Path) -> PathBuf {
    dir.join("models/fraud_mlp")
}

fn request(id: &str, card: i64) -> pb::DecideRequest {
    let x = &common::samples()[0].0;
    let features: HashMap<String, f64> = (0..31)
        .map(|i| (format!("f{i}"), f64::from(x[i])))
        .collect();
    pb::DecideRequest {
        request_id: id.into(),
        model: "fraud_mlp".into(),
        entities: [(
            "card_id".to_string(),
            pb::EntityKey {
                key: Some(pb::entity_key::Key::Int64Key(card)),
            },
        )]
        .into(),
        features,
        ..Default::default()
    }
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_in_a_store_source_refuses_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "card:txn_count_1hr", &[1], "");
    let e = match mesh_router::server::start_mesh(&cfg).await {
        Ok(_) => panic!("a spec reading card:txn_count_1hr started"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("fraud_mlp"), "{e}");
    assert!(
        e.contains("[input_spec].features[31] source = \"card:txn_count_1hr\""),
        "{e}"
    );
    assert!(
        e.contains("view 'card' has no feature 'txn_count_1hr'"),
        "{e}"
    );
    assert!(e.contains("did you mean 'card:txn_count_1h'"), "{e}");

    // A string feature used as a number, an unknown view: refused the same way.
    for (source, says) in [
        (
            "card:home_country",
            "is of type string, which is not a number",
        ),
        ("cards:txn_count_1h", "has no view 'cards'"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = setup(dir.path(), source, &[1], "");
        let e = mesh_router::server::start_mesh(&cfg).await.err().unwrap();
        assert!(e.to_string().contains(says), "{source}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_broken_spec_leaves_the_old_version_serving() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "card:txn_count_1h", &[1], "");
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let repo = running.core.as_ref().unwrap().repo.clone();
    let mut client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    assert_eq!(get(running.http_addr, "/readyz").await.0, 200);

    // v2 arrives with a model.toml whose spec names a feature the store lacks, then
    // with an unknown key, then with the wrong width: each load is refused.
    let m = models(dir.path());
    std::fs::create_dir_all(m.join("2")).unwrap();
    std::fs::copy(common::reference_weights(), m.join("2/model.safetensors")).unwrap();
    let good = model_toml("card:txn_count_1h");
    let broken = [
        (model_toml("card:txn_count_1hr"), "card:txn_count_1hr"),
        (
            good.replace(
                "on_missing = \"default\"",
                "on_missing = \"default\"\nonmissing = 1",
            ),
            "onmissing",
        ),
        (
            good.replace("[[input_spec.features]]\nsource = \"request:f0\"\n", ""),
            "fills 31 positions",
        ),
    ];
    for (text, says) in broken {
        std::fs::write(m.join("model.toml"), &text).unwrap();
        let e = repo.load("fraud_mlp").await.unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
        // The old version still serves and decides with the old spec.
        assert_eq!(
            repo.model("fraud_mlp")
                .unwrap()
                .versions
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1]
        );
        let r = client.decide(request("r", 1)).await.unwrap().into_inner();
        assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
        assert_eq!(r.model_version, "1");
        // The index says why v2 is not served.
        let v2 = repo.index().into_iter().find(|e| e.version == 2).unwrap();
        assert_eq!(v2.state, "UNAVAILABLE");
        assert!(v2.reason.contains(says), "{}", v2.reason);
        assert_eq!(get(running.http_addr, "/readyz").await.0, 200);
    }
    // Fixed: v2 loads.
    std::fs::write(m.join("model.toml"), &good).unwrap();
    assert_eq!(repo.load("fraud_mlp").await.unwrap(), vec![1, 2]);

    // A deployment whose model is gone is not ready.
    repo.unload("fraud_mlp").await.unwrap();
    let (code, body) = get(running.http_addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_are_named_counted_and_limited_per_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "card:txn_count_1h", &[1], "");
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let metrics = mesh_router::telemetry::metrics();
    let now = mesh_feature_store::now_micros();
    running
        .store
        .as_ref()
        .unwrap()
        .push(
            "card",
            vec![Row {
                key: EntityKey::Int64(1),
                event_time: now,
                values: vec![Some(Value::F32(2.0)), None],
            }],
            Durability::Buffered,
        )
        .await
        .unwrap();
    let mut client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    let known = client.decide(request("k", 1)).await.unwrap().into_inner();
    assert!(
        !known.reasons.iter().any(|r| r.contains("default")),
        "{:?}",
        known.reasons
    );
    // An unknown card: scored on the default, and the answer says so.
    let unknown = client
        .decide(request("u", 424242))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unknown.source, pb::AnswerSource::Model as i32);
    assert!(
        unknown
            .reasons
            .iter()
            .any(|r| r == "1 feature took the spec's default: card NOT_FOUND: txn_count_1h"),
        "{:?}",
        unknown.reasons
    );
    // A request feature not sent is named too.
    let mut short = request("s", 1);
    short.features.remove("f3");
    let r = client.decide(short).await.unwrap().into_inner();
    assert!(
        r.reasons.iter().any(|r| r.contains("request MISSING: f3")),
        "{:?}",
        r.reasons
    );
    let text = metrics.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("mesh_router_defaulted_features_total{")
                && l.contains("model=\"fraud_mlp\"")
                && l.contains("view=\"card\"")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("mesh_router_requests_total{")
                && l.contains("protocol=\"decide\"")
                && l.contains("code=\"ok\"")),
        "{text}"
    );
    let mut bad = request("b", 1);
    bad.model = "no_such_model".into();
    client.decide(bad).await.unwrap_err();
    let text = metrics.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("mesh_router_requests_total{")
                && l.contains("protocol=\"decide\"")
                && l.contains("model=\"unknown\"")
                && l.contains("code=\"not_found\"")),
        "{text}"
    );
    running.shutdown().await;

    // With max_defaulted_features = 0 the unknown card is not scored: it falls back.
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(
        dir.path(),
        "card:txn_count_1h",
        &[1],
        "max_defaulted_features = 0",
    );
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let mut client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    let r = client
        .decide(request("u", 424242))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.source,
        pb::AnswerSource::Default as i32,
        "{:?}",
        r.reasons
    );
    assert!(
        r.reasons
            .iter()
            .any(|r| r.starts_with("not scored: 1 feature took defaults")),
        "{:?}",
        r.reasons
    );
    running.shutdown().await;
}
