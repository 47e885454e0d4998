//! Decisions end to end: a real mesh (gRPC on 127.0.0.1:0, sled feature store in a
//! temp dir, two local replicas per version of the reference fraud model), called
//! with the generated mesh.v1 client.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mesh_feature_store::{Durability, EntityKey, Row, Value};
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use pb::decisions_client::DecisionsClient;
use tonic::Code;

mod common;

/// The reference rows with features as f64 (the Decide request type).
fn samples() -> Vec<(Vec<f64>, f32)> {
    common::samples()
        .into_iter()
        .map(|(x, p)| (x.into_iter().map(f64::from).collect(), p))
        .collect()
}

/// Versions 1 and 2 of the reference model (same weights), two actor groups each,
/// reading f0..f30 from the request and f31 from the `card` view.
fn repo(dir: &Path) -> PathBuf {
    let text = common::card_f31_model_toml()
        .replace("[version_policy]", "[version_policy]\nall = true")
        .replace("runner_instances = 2", "runner_instances = 1\nreplicas = 2");
    common::model_repo(&dir.join("models"), &[1, 2], &text);
    let views = common::CARD_F31_VIEWS.to_owned()
        + r#"
[[views]]
name = "fraud_scores"
entity = "card"
max_age = "1d"
features = [{ name = "score", type = "f32" }]
"#;
    std::fs::write(dir.join("views.toml"), views).unwrap();
    dir.join("models")
}

fn config(dir: &Path, deadline_ms: u64, per_try_ms: u64, extra: &str) -> MeshConfig {
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
        deadline = "{deadline_ms}ms"
        default_decision = "review"
        max_batch_items = 500
        [decisions.stack]
        per_try_timeout = "{per_try_ms}ms"
        [[decisions.rules]]
        name = "large_amount"
        feature = "amount"
        above = 5000.0
        decision = "decline"
        {extra}
        "#,
        models = repo(dir).display(),
        db = dir.join("db").display(),
        views = dir.join("views.toml").display(),
    );
    toml::from_str(&text).unwrap()
}

struct Mesh {
    running: mesh_router::server::Running,
    client: DecisionsClient<tonic::transport::Channel>,
    rows: Vec<(Vec<f64>, f32)>,
    _dir: tempfile::TempDir,
}

/// A mesh whose decisions have `deadline_ms` in all and `per_try_ms` per attempt.
async fn mesh(deadline_ms: u64, per_try_ms: u64, extra: &str) -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), deadline_ms, per_try_ms, extra);
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let rows = samples();
    // f31 of each sample row lives in the store under card_id = row index.
    let store = running.store.clone().unwrap();
    let card = common::card_f31_rows(rows.len());
    store
        .push("card", card, Durability::Buffered)
        .await
        .unwrap();
    let client = DecisionsClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    Mesh {
        running,
        client,
        rows,
        _dir: dir,
    }
}

fn request(id: usize, x: &[f64]) -> pb::DecideRequest {
    let mut features: HashMap<String, f64> = (0..31).map(|i| (format!("f{i}"), x[i])).collect();
    features.insert("amount".into(), 12.5);
    pb::DecideRequest {
        request_id: format!("r{id}"),
        model: "fraud_mlp".into(),
        entities: [(
            "card_id".to_string(),
            pb::EntityKey {
                key: Some(pb::entity_key::Key::Int64Key(id as i64)),
            },
        )]
        .into(),
        features,
        ..Default::default()
    }
}

async fn set_fault(m: &Mesh, replica: &str, delay_ms: u64, fail: bool) {
    m.running
        .engine
        .as_ref()
        .unwrap()
        .fault(replica)
        .unwrap_or_else(|| panic!("no replica {replica}"))
        .set(Duration::from_millis(delay_ms), fail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_score_like_the_reference_and_reject_bad_input() {
    let mut m = mesh(1000, 200, "").await;
    for i in 0..100 {
        let r = m
            .client
            .decide(request(i, &m.rows[i].0))
            .await
            .unwrap()
            .into_inner();
        let want = m.rows[i].1;
        assert!(
            (r.score.unwrap() - want).abs() <= 1e-5,
            "row {i}: {} vs {want}",
            r.score.unwrap()
        );
        assert_eq!(r.source, pb::AnswerSource::Model as i32);
        assert_eq!(r.model_version, "2");
        let expected = if want >= 0.9 {
            pb::Decision::Decline
        } else if want >= 0.5 {
            pb::Decision::Review
        } else {
            pb::Decision::Approve
        };
        assert_eq!(r.decision, expected as i32, "row {i} score {want}");
        let t = r.timings.unwrap();
        assert!(
            t.validate_us
                + t.features_us
                + t.preprocess_us
                + t.queue_us
                + t.compute_us
                + t.postprocess_us
                <= t.total_us + 1,
            "{t:?}"
        );
    }
    // The rule escalates whatever the model says.
    let mut big = request(1, &m.rows[1].0);
    big.features.insert("amount".into(), 9000.0);
    let r = m.client.decide(big).await.unwrap().into_inner();
    assert_eq!(r.decision, pb::Decision::Decline as i32);
    assert!(r.reasons.iter().any(|x| x.contains("large_amount")));

    // Bad input.
    let mut c = m.client.clone();
    let mut unknown = request(0, &m.rows[0].0);
    unknown.model = "nope".into();
    let mut no_key = request(0, &m.rows[0].0);
    no_key.entities.clear();
    let mut nan = request(0, &m.rows[0].0);
    nan.features.insert("f3".into(), f64::NAN);
    let mut no_id = request(0, &m.rows[0].0);
    no_id.request_id.clear();
    let mut bad_key = request(0, &m.rows[0].0);
    bad_key.entities.insert(
        "card_id".into(),
        pb::EntityKey {
            key: Some(pb::entity_key::Key::StringKey("x".into())),
        },
    );
    for (what, req, code, needle) in [
        ("unknown model", unknown, Code::NotFound, "nope"),
        (
            "missing entity key",
            no_key,
            Code::InvalidArgument,
            "card_id",
        ),
        ("NaN feature", nan, Code::InvalidArgument, "f3"),
        (
            "empty request id",
            no_id,
            Code::InvalidArgument,
            "request_id",
        ),
        ("wrong key type", bad_key, Code::InvalidArgument, "int64"),
    ] {
        let e = c.decide(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(e.message().contains(needle), "{what}: {}", e.message());
    }
    let many = pb::DecideBatchRequest {
        requests: (0..501).map(|i| request(i, &m.rows[i].0)).collect(),
    };
    let e = c.decide_batch(many).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("500"), "{}", e.message());
    m.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_is_routed_around_within_the_deadline() {
    // 250 ms per decision, 60 ms per attempt: loose enough for a loaded debug build,
    // and the stall (10 s) is far past both.
    let mut m = mesh(250, 60, "").await;
    // Build the stacks, then stall one of the two actor groups of v2.
    m.client.decide(request(0, &m.rows[0].0)).await.unwrap();
    set_fault(&m, "fraud_mlp/v2/local0", 10_000, false).await;
    let mut worst = Duration::ZERO;
    for i in 0..200 {
        let t = Instant::now();
        let r = m
            .client
            .decide(request(i, &m.rows[i].0))
            .await
            .unwrap()
            .into_inner();
        worst = worst.max(t.elapsed());
        assert_eq!(
            r.source,
            pb::AnswerSource::Model as i32,
            "request {i}: {:?}",
            r.reasons
        );
        assert_eq!(r.model_version, "2");
        assert!((r.score.unwrap() - m.rows[i].1).abs() <= 1e-5);
    }
    // Within the 250 ms budget (plus the client's own overhead), far below the 10 s stall.
    assert!(
        worst < Duration::from_millis(350),
        "slowest answer took {worst:?}"
    );
    m.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_replicas_fall_back_in_order() {
    let mut m = mesh(1000, 200, "[[decisions.deployments]]\nmodel = \"fraud_mlp\"\nbatch_score = { view = \"fraud_scores\", feature = \"score\" }\n").await;
    let store = m.running.store.clone().unwrap();
    store
        .push(
            "fraud_scores",
            vec![Row {
                key: EntityKey::Int64(7),
                event_time: mesh_feature_store::now_micros(),
                values: vec![Some(Value::F32(0.95))],
            }],
            Durability::Buffered,
        )
        .await
        .unwrap();
    m.client.decide(request(7, &m.rows[7].0)).await.unwrap();
    // Version 2 fails everywhere: the previous version answers.
    set_fault(&m, "fraud_mlp/v2/local0", 0, true).await;
    set_fault(&m, "fraud_mlp/v2/local1", 0, true).await;
    let r = m
        .client
        .decide(request(7, &m.rows[7].0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.source,
        pb::AnswerSource::PreviousVersion as i32,
        "{:?}",
        r.reasons
    );
    assert_eq!(r.model_version, "1");
    assert!((r.score.unwrap() - m.rows[7].1).abs() <= 1e-5);
    // Version 1 too (stack built by the call above): the batch score answers.
    set_fault(&m, "fraud_mlp/v1/local0", 0, true).await;
    set_fault(&m, "fraud_mlp/v1/local1", 0, true).await;
    let r = m
        .client
        .decide(request(7, &m.rows[7].0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.source,
        pb::AnswerSource::BatchScore as i32,
        "{:?}",
        r.reasons
    );
    assert_eq!(r.score, Some(0.95));
    assert_eq!(r.decision, pb::Decision::Decline as i32);
    // No batch score for card 8: a large amount fires the rule...
    let mut big = request(8, &m.rows[8].0);
    big.features.insert("amount".into(), 7000.0);
    let r = m.client.decide(big).await.unwrap().into_inner();
    assert_eq!(r.source, pb::AnswerSource::Rules as i32, "{:?}", r.reasons);
    assert_eq!(r.decision, pb::Decision::Decline as i32);
    assert_eq!(r.score, None);
    // ...and otherwise the default decision.
    let r = m
        .client
        .decide(request(8, &m.rows[8].0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.source,
        pb::AnswerSource::Default as i32,
        "{:?}",
        r.reasons
    );
    assert_eq!(r.decision, pb::Decision::Review as i32);
    m.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_share_follows_its_weight_and_shadow_answers_stay_hidden() {
    let mut m = mesh(
        2000,
        1000,
        "[[decisions.deployments]]\nmodel = \"fraud_mlp\"\nprimary = 1\ncanary = { version = 2, weight = 0.3 }\nshadow = 2\n",
    )
    .await;
    let (mut canary, mut total) = (0usize, 0usize);
    for chunk in 0..40 {
        let reqs: Vec<_> = (0..250)
            .map(|i| {
                request(
                    (chunk * 250 + i) % 1000,
                    &m.rows[(chunk * 250 + i) % 1000].0,
                )
            })
            .collect();
        let out = m
            .client
            .decide_batch(pb::DecideBatchRequest { requests: reqs })
            .await
            .unwrap()
            .into_inner();
        for r in out.responses {
            assert_ne!(r.role, "shadow");
            assert_eq!(r.source, pb::AnswerSource::Model as i32, "{:?}", r.reasons);
            match (r.role.as_str(), r.model_version.as_str()) {
                ("canary", "2") => canary += 1,
                ("primary", "1") => {}
                other => panic!("unexpected answer {other:?}"),
            }
            total += 1;
        }
    }
    assert_eq!(total, 10_000);
    let share = canary as f64 / total as f64;
    assert!((share - 0.3).abs() <= 0.02, "canary share {share}");
    // The shadow got a copy of every primary request (counted, never returned).
    let primary = (total - canary) as f64;
    let shadow_count = || {
        mesh_router::telemetry::metrics()
            .render()
            .lines()
            .filter(|l| {
                l.starts_with("mesh_router_decisions_total") && l.contains("role=\"shadow\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let waited = Instant::now();
    while shadow_count() < primary && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shadow_count(), primary);
    m.running.shutdown().await;
}

/// An unloaded model is a model fault like any other: its decisions go down the
/// fallback chain (here to the rules and the default) with a reason, and never
/// fail the request; a model the mesh never served stays NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unloaded_model_decides_through_the_fallbacks() {
    let mut m = mesh(1000, 200, "").await;
    let r = m
        .client
        .decide(request(1, &m.rows[1].0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.source, pb::AnswerSource::Model as i32);
    let core = m.running.core.clone().unwrap();
    core.repo.unload("fraud_mlp").await.unwrap();
    let r = m
        .client
        .decide(request(2, &m.rows[2].0))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.source, pb::AnswerSource::Model as i32, "{r:?}");
    assert_ne!(r.decision, pb::Decision::Approve as i32, "{r:?}");
    assert!(
        r.reasons.iter().any(|x| x.contains("no ready version")),
        "{:?}",
        r.reasons
    );
    let mut other = request(3, &m.rows[3].0);
    other.model = "never_served".into();
    let e = m.client.decide(other).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Loaded again: the model answers again.
    core.repo.load("fraud_mlp").await.unwrap();
    let r = m
        .client
        .decide(request(4, &m.rows[4].0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.source, pb::AnswerSource::Model as i32, "{r:?}");
}
