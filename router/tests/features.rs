//! The feature store through `mesh serve` (in-process, real gRPC on 127.0.0.1:0,
//! sled in a temp dir): push, batched lookup with statuses, list views, bad input.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
use std::path::Path;

use mesh_proto::mesh::v1 as pb;
use mesh_router::config::{MeshConfig, Role};
use pb::feature_store_client::FeatureStoreClient;
use tonic::Code;

fn views(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("views.toml");
    std::fs::write(
        &p,
        r#"
        [[entities]]
        name = "card"
        join_key = "card_id"
        key_type = "int64"
        [[views]]
        name = "card"
        entity = "card"
        max_age = "1h"
        features = [{ name = "amount_sum_24h", type = "f32" }, { name = "txn_count_1h", type = "i64" }]
        "#,
    )
    .unwrap();
    p
}

fn value_f32(x: f32) -> Option<pb::FeatureValue> {
    Some(pb::FeatureValue {
        value: Some(pb::feature_value::Value::F32Value(x)),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_store_over_grpc_through_mesh_serve() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = MeshConfig::default();
    cfg.server.grpc_port = 0;
    cfg.server.http_port = 0;
    cfg.server.role = Role::Features;
    cfg.features.path = Some(dir.path().join("db"));
    cfg.features.views = Some(views(dir.path()));
    cfg.features.max_keys_per_lookup = Some(100);
    // Push is the writer plane: it needs the writer token.
    let token = dir.path().join("writer.token");
    std::fs::write(&token, "writer-token-for-this-test-0123456789").unwrap();
    cfg.writer.token_file = Some(token);
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = FeatureStoreClient::with_interceptor(channel, |mut req: tonic::Request<()>| {
        req.metadata_mut().insert(
            "authorization",
            "Bearer writer-token-for-this-test-0123456789"
                .parse()
                .unwrap(),
        );
        Ok(req)
    });

    let listed = c
        .list_views(pb::ListViewsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.views.len(), 1);
    assert_eq!(listed.views[0].join_key, "card_id");

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let row = |k: i64, t: i64, x: f32| pb::PushRow {
        key: Some(pb::EntityKey {
            key: Some(pb::entity_key::Key::Int64Key(k)),
        }),
        event_time_unix_micros: t,
        values: vec![pb::NamedFeatureValue {
            name: "amount_sum_24h".into(),
            value: value_f32(x),
        }],
    };
    let two_hours = 2 * 3600 * 1_000_000;
    let pushed = c
        .push(pb::PushRequest {
            view: "card".into(),
            rows: vec![row(1, now, 10.0), row(2, now - two_hours, 20.0)],
            wait_for_sync: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pushed.rows_written, 2);
    assert!(pushed.synced);
    // An older event never overwrites a newer one.
    let older = c
        .push(pb::PushRequest {
            view: "card".into(),
            rows: vec![row(1, now - 1000, 99.0)],
            wait_for_sync: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(older.rows_skipped_older, 1);

    let get = |keys: Vec<i64>| pb::GetOnlineFeaturesRequest {
        features: vec!["card:amount_sum_24h".into(), "card:txn_count_1h".into()],
        entities: vec![pb::EntityKeyColumn {
            join_key: "card_id".into(),
            int64_keys: keys,
            string_keys: vec![],
        }],
        ..Default::default()
    };
    let resp = c
        .get_online_features(get(vec![1, 2, 3]))
        .await
        .unwrap()
        .into_inner();
    let amount = &resp.columns[0];
    use pb::FeatureStatus as S;
    assert_eq!(
        amount.statuses,
        vec![
            S::Present as i32,
            S::OutsideMaxAge as i32,
            S::NotFound as i32
        ]
    );
    assert_eq!(amount.f32_values[0], 10.0);
    // A feature the push did not name is NULL for a stored row.
    assert_eq!(resp.columns[1].statuses[0], S::Null as i32);

    for (what, req, code, needle) in [
        (
            "unknown view",
            pb::GetOnlineFeaturesRequest {
                features: vec!["nope:x".into()],
                ..get(vec![1])
            },
            Code::NotFound,
            "nope",
        ),
        (
            "unknown feature",
            pb::GetOnlineFeaturesRequest {
                features: vec!["card:x".into()],
                ..get(vec![1])
            },
            Code::NotFound,
            "x",
        ),
        (
            "empty",
            pb::GetOnlineFeaturesRequest::default(),
            Code::InvalidArgument,
            "",
        ),
        (
            "too many keys",
            get((0..101).collect()),
            Code::InvalidArgument,
            "100",
        ),
    ] {
        let e = c.get_online_features(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(e.message().contains(needle), "{what}: {}", e.message());
    }
    // A push with one bad row writes nothing.
    let mut bad = row(5, now, 1.0);
    bad.values[0].name = "not_a_feature".into();
    let e = c
        .push(pb::PushRequest {
            view: "card".into(),
            rows: vec![row(4, now, 1.0), bad],
            wait_for_sync: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::NotFound | Code::InvalidArgument),
        "{e:?}"
    );
    let resp = c
        .get_online_features(get(vec![4]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.columns[0].statuses, vec![S::NotFound as i32]);
    running.shutdown().await;
}
