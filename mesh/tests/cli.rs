//! The hand-run paths of the `mesh` binary against a real mesh started here (the
//! example model, the example views, demo features in a sled store): `mesh decide`
//! from flags and from JSON, `mesh features get` and `mesh features list`, and a
//! user error that exits 1 with one line and no backtrace.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;
use common::{args, root};

use std::path::Path;

use mesh_router::config::MeshConfig;

/// A mesh on loopback over a copy of the example model and the example views,
/// with the demo's cards and merchants in its store.
async fn mesh(dir: &Path) -> mesh_router::server::Running {
    let m = dir.join("models/fraud_mlp");
    std::fs::create_dir_all(m.join("1")).unwrap();
    let ex = root().join("examples/models/fraud_mlp");
    std::fs::copy(ex.join("model.toml"), m.join("model.toml")).unwrap();
    std::fs::copy(
        ex.join("1/model.safetensors"),
        m.join("1/model.safetensors"),
    )
    .unwrap();
    let views = root().join("examples/features/views.toml");
    {
        let v = mesh_feature_store::ViewsConfig::from_path(&views).unwrap();
        let store = mesh_feature_store::FeatureStore::open(dir.join("db"), &v).unwrap();
        mesh_feature_store::generate_demo_features(&store, 50, 20, 7).unwrap();
        store.flush().unwrap();
    }
    let text = format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{}"
        [features]
        path = "{}"
        views = "{}"
        [decisions]
        deadline = "2s"
        [[decisions.deployments]]
        model = "fraud_mlp"
        "#,
        dir.join("models").display(),
        dir.join("db").display(),
        views.display()
    );
    let cfg: MeshConfig = toml::from_str(&text).unwrap();
    mesh_router::server::start_mesh(&cfg).await.unwrap()
}

/// Runs the binary with `stdin`: (exit code, stdout, stderr).
async fn mesh_cli(args: Vec<String>, stdin: Option<&str>) -> (i32, String, String) {
    common::run_mesh(args, stdin, vec![]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_and_read_features_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let running = mesh(dir.path()).await;
    let addr = format!("http://{}", running.grpc_addr);

    // From flags: a known card and merchant, scored by the model.
    let (code, out, err) = mesh_cli(
        args(&[
            "decide",
            "--addr",
            &addr,
            "--card-id",
            "17",
            "--merchant-id",
            "m000017",
            "--feature",
            "amount=42.5",
            "--feature",
            "merchant_category=travel",
            "--request-id",
            "by-hand-1",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("source MODEL"), "{out}");
    assert!(out.contains("model fraud_mlp v1 (primary)"), "{out}");
    assert!(out.contains("request by-hand-1"), "{out}");
    assert!(
        err.is_empty(),
        "a one-shot command logs nothing at info: {err}"
    );

    // From JSON on stdin, printed as JSON: an unknown card says it used defaults.
    let (code, out, err) = mesh_cli(
        args(&["decide", "--addr", &addr, "--json", "-", "--print-json"]),
        Some(
            r#"{"request_id": "by-hand-2", "model": "fraud_mlp",
                "entities": {"card_id": 999999, "merchant_id": "m000017"},
                "features": {"amount": 42.5}, "categorical": {"merchant_category": "travel"}}"#,
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["request_id"], "by-hand-2");
    assert_eq!(v["source"], "MODEL");
    assert!(
        v["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("card NOT_FOUND: txn_count_1h")),
        "{v}"
    );
    assert!(["APPROVE", "REVIEW", "DECLINE"].contains(&v["decision"].as_str().unwrap()));

    // features list: every view of the example views file.
    let (code, out, err) = mesh_cli(args(&["features", "list", "--addr", &addr]), None).await;
    assert_eq!(code, 0, "{err}");
    for want in [
        "card  (entity card, key card_id: int64",
        "merchant  (entity merchant",
        "fraud_scores",
        "txn_count_1h",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }

    // features get: one card, every feature with its status.
    let (code, out, err) = mesh_cli(
        args(&[
            "features", "get", "--addr", &addr, "--view", "card", "--key", "17", "--key", "999999",
            "--json",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let known = v[0]["features"].as_array().unwrap();
    let count = known
        .iter()
        .find(|f| f["name"] == "card:txn_count_1h")
        .unwrap();
    assert_eq!(count["type"], "i64");
    assert!(
        ["PRESENT", "NULL"].contains(&count["status"].as_str().unwrap()),
        "{count}"
    );
    let unknown = v[1]["features"].as_array().unwrap();
    assert!(
        unknown
            .iter()
            .all(|f| f["status"] == "NOT_FOUND" && f["value"].is_null()),
        "{unknown:?}"
    );
    let (code, out, _) = mesh_cli(
        args(&[
            "features",
            "get",
            "--addr",
            &addr,
            "--view",
            "merchant",
            "--key",
            "m000017",
            "--feature",
            "risk_tier",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("merchant merchant_id = \"m000017\"") && out.contains("merchant:risk_tier"),
        "{out}"
    );

    // A user error: one line on stderr, exit 1, no backtrace even with RUST_BACKTRACE=1.
    let (code, out, err) = mesh_cli(
        args(&[
            "features", "get", "--addr", &addr, "--view", "cards", "--key", "1",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err.trim(),
        "error: no view 'cards' (views: card, merchant, fraud_scores)"
    );
    let (code, _, err) = mesh_cli(
        args(&[
            "decide",
            "--addr",
            &addr,
            "--model",
            "nope",
            "--card-id",
            "1",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.starts_with("error: Decide failed: NotFound"), "{err}");
    assert!(!err.contains("stack backtrace"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_and_a_remote_features_role_together_are_refused() {
    let (code, _, err) = mesh_cli(
        args(&[
            "serve",
            "--features",
            "db",
            "--features-remote",
            "http://127.0.0.1:9",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--features-remote"), "{err}");
    // A file's path with the flag's remote: the same rule, said in one line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mesh.toml");
    std::fs::write(&file, "[features]\npath = \"db\"\nviews = \"v.toml\"\n").unwrap();
    let (code, _, err) = mesh_cli(
        args(&[
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--features-remote",
            "http://127.0.0.1:9",
        ]),
        None,
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: [features] path and remote"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// `mesh bench --target lookup`: every call of a view's random entities answered
/// with a column per feature and a status per entity, for an int64-keyed view and a
/// string-keyed one, read as statuses only and decoded whole; an unknown view is named with the ones served, before any load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_looks_up_random_entities_of_a_view() {
    let dir = tempfile::tempdir().unwrap();
    let running = mesh(dir.path()).await;
    let addr = format!("http://{}", running.grpc_addr);
    for (view, extra) in [
        (
            "card",
            ["--cards", "50", "--event-times-per-view"].as_slice(),
        ),
        ("card", ["--cards", "50", "--decode-values"].as_slice()),
        ("merchant", ["--merchants", "20"].as_slice()),
    ] {
        let mut a = args(&[
            "bench",
            "--addr",
            &addr,
            "--target",
            "lookup",
            "--view",
            view,
            "--keys",
            "25",
            "--requests",
            "200",
            "--concurrency",
            "4",
            "--json",
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        let (code, out, err) = mesh_cli(a, None).await;
        assert_eq!(code, 0, "{view}: {err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["target"], "lookup", "{view}");
        assert_eq!(r["requests"], 200, "{view}");
        assert_eq!(r["codes"], serde_json::json!({"OK": 200}), "{view}: {out}");
    }
    // More keys than the store's limit (refused by the bench itself) and an unknown
    // view (named with the views served): each said by name.
    for (flag, value, said) in [
        ("--keys", "4097", &["--keys 4097: must be 1 to 4096"][..]),
        (
            "--view",
            "nope",
            &["--view nope: the store serves no such view", "\"card\""][..],
        ),
    ] {
        let (code, _, err) = mesh_cli(
            args(&["bench", "--addr", &addr, "--target", "lookup", flag, value]),
            None,
        )
        .await;
        assert_ne!(code, 0, "{flag} {value}");
        assert!(
            said.iter().all(|s| err.contains(s)),
            "{flag} {value}: {err}"
        );
    }
    running.shutdown().await;
}
