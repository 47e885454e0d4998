//! End to end over gRPC: the service on 127.0.0.1:0, called with the generated
//! client.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::sync::Arc;

use common::*;
use mesh_feature_store::service::FeatureStoreService;
use mesh_feature_store::{Durability, Limits};
use mesh_proto::mesh::v1 as pb;
use pb::feature_store_client::FeatureStoreClient;
use tonic::transport::Channel;
use tonic::Code;

async fn serve(
    env: &Env,
    limits: Limits,
) -> (
    FeatureStoreClient<Channel>,
    Arc<mesh_feature_store::FeatureStore>,
) {
    let store = Arc::new(env.open());
    let svc = FeatureStoreService::new(store.clone(), limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            // TCP_NODELAY on accepted connections: without it, Nagle plus delayed ACKs
            // add ~40 ms to small responses.
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    let client = FeatureStoreClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, store)
}

fn int_keys(join_key: &str, keys: Vec<i64>) -> pb::EntityKeyColumn {
    pb::EntityKeyColumn {
        join_key: join_key.into(),
        int64_keys: keys,
        string_keys: vec![],
    }
}

fn nv(name: &str, v: pb::feature_value::Value) -> pb::NamedFeatureValue {
    pb::NamedFeatureValue {
        name: name.into(),
        value: Some(pb::FeatureValue { value: Some(v) }),
    }
}

fn push_row(id: i64, t: i64, amount: f32) -> pb::PushRow {
    use pb::feature_value::Value as V;
    pb::PushRow {
        key: Some(pb::EntityKey {
            key: Some(pb::entity_key::Key::Int64Key(id)),
        }),
        event_time_unix_micros: t,
        values: vec![
            nv("amount", V::F32Value(amount)),
            nv("count", V::I64Value(id)),
        ],
    }
}

both_backends!(async fn push_then_lookup_with_statuses(env) {
    let (mut client, store) = serve(&env, Limits::default()).await;
    let t = fresh();
    // Stale row written in process; fresh rows pushed over gRPC.
    store
        .write_rows(
            "card",
            &[card_row(3, t - 2 * HOUR_MICROS, 1)],
            Durability::Buffered,
        )
        .unwrap();
    let resp = client
        .push(pb::PushRequest {
            view: "card".into(),
            rows: vec![push_row(1, t, 1.5), push_row(2, t, 2.5)],
            wait_for_sync: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // sled fsyncs before answering; Redis's durability is the server's own
    // (appendonly/appendfsync), so a Redis store never claims a sync.
    assert_eq!(
        (resp.rows_written, resp.rows_skipped_older, resp.synced),
        (2, 0, env.kind == Kind::Sled)
    );
    // An older push for key 1 is skipped.
    let resp = client
        .push(pb::PushRequest {
            view: "card".into(),
            rows: vec![push_row(1, t - 1, 9.0)],
            wait_for_sync: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (resp.rows_written, resp.rows_skipped_older, resp.synced),
        (0, 1, false)
    );

    let resp = client
        .get_online_features(pb::GetOnlineFeaturesRequest {
            features: vec!["card:amount".into(), "card:ratio".into()],
            entities: vec![int_keys("card_id", vec![1, 4, 3, 2])],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.columns.len(), 2);
    let amount = &resp.columns[0];
    assert_eq!(amount.name, "card:amount");
    assert_eq!(amount.r#type, pb::FeatureType::F32 as i32);
    let st = |s: pb::FeatureStatus| s as i32;
    assert_eq!(
        amount.statuses,
        vec![
            st(pb::FeatureStatus::Present),
            st(pb::FeatureStatus::NotFound),
            st(pb::FeatureStatus::OutsideMaxAge),
            st(pb::FeatureStatus::Present)
        ]
    );
    assert_eq!(amount.f32_values, vec![1.5, 0.0, 3.5, 2.5]);
    assert_eq!(
        amount.event_time_unix_micros,
        vec![t, 0, t - 2 * HOUR_MICROS, t]
    );
    // ratio was not pushed: NULL for pushed rows.
    assert_eq!(resp.columns[1].statuses[0], st(pb::FeatureStatus::Null));
    assert_eq!(resp.columns[1].f64_values.len(), 4);

    let views = client
        .list_views(pb::ListViewsRequest {})
        .await
        .unwrap()
        .into_inner()
        .views;
    let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["card", "merchant"]);
    assert_eq!(views[1].key_type, pb::EntityKeyType::String as i32);
    assert_eq!(views[0].max_age_millis, 3_600_000);
    assert_eq!(views[0].features.len(), 6);
});

both_backends!(async fn bad_input_gets_clear_status_codes(env) {
    use pb::feature_value::Value as V;
    let (mut client, store) = serve(&env, Limits {
        max_keys_per_lookup: 5,
        max_rows_per_push: 3,
        ..Limits::default()
    })
    .await;
    let t = fresh();
    let get =
        |features: Vec<&str>, entities: Vec<pb::EntityKeyColumn>| pb::GetOnlineFeaturesRequest {
            features: features.into_iter().map(String::from).collect(),
            entities,
            ..Default::default()
        };
    let code =
        |r: Result<tonic::Response<pb::GetOnlineFeaturesResponse>, tonic::Status>| r.unwrap_err();

    let e = code(
        client
            .get_online_features(get(vec!["nope:x"], vec![int_keys("card_id", vec![1])]))
            .await,
    );
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = code(
        client
            .get_online_features(get(vec!["card:nope"], vec![int_keys("card_id", vec![1])]))
            .await,
    );
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = code(client.get_online_features(get(vec![], vec![])).await);
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = code(
        client
            .get_online_features(get(vec!["card:amount"], vec![int_keys("card_id", vec![])]))
            .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Malformed key: a string key for an int64 entity.
    let strings = pb::EntityKeyColumn {
        join_key: "card_id".into(),
        int64_keys: vec![],
        string_keys: vec!["x".into()],
    };
    let e = code(
        client
            .get_online_features(get(vec!["card:amount"], vec![strings]))
            .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = code(
        client
            .get_online_features(get(
                vec!["card:amount"],
                vec![int_keys("card_id", (0..6).collect())],
            ))
            .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("max_keys_per_lookup") && e.message().contains('5'),
        "{}",
        e.message()
    );

    // Pushes: every rejection writes nothing.
    let push = |rows: Vec<pb::PushRow>| pb::PushRequest {
        view: "card".into(),
        rows,
        wait_for_sync: true,
        ..Default::default()
    };
    let mut wrong_type = push_row(2, t, 1.0);
    wrong_type.values.push(nv("flag", V::I64Value(1)));
    let e = client
        .push(push(vec![push_row(1, t, 1.0), wrong_type]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut unknown = push_row(2, t, 1.0);
    unknown.values.push(nv("nope", V::I64Value(1)));
    let e = client
        .push(push(vec![push_row(1, t, 1.0), unknown]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let mut no_key = push_row(2, t, 1.0);
    no_key.key = None;
    let e = client
        .push(push(vec![push_row(1, t, 1.0), no_key]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut bad_key = push_row(2, t, 1.0);
    bad_key.key = Some(pb::EntityKey {
        key: Some(pb::entity_key::Key::StringKey("2".into())),
    });
    let e = client
        .push(push(vec![push_row(1, t, 1.0), bad_key]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = client
        .push(push(vec![push_row(1, t, f32::NAN)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = client
        .push(push((0..4).map(|i| push_row(i, t, 1.0)).collect()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_rows_per_push"), "{}", e.message());
    let e = client.push(push(vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = client
        .push(pb::PushRequest {
            view: "nope".into(),
            rows: vec![push_row(1, t, 1.0)],
            wait_for_sync: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(
        store.scan_view("card").unwrap().count(),
        0,
        "rejected pushes wrote nothing"
    );

    // And a good push still works afterwards.
    client.push(push(vec![push_row(1, t, 1.0)])).await.unwrap();
    assert_eq!(store.scan_view("card").unwrap().count(), 1);
});

/// `rows` of the card view as one columnar push.
fn columns_of(
    store: &mesh_feature_store::FeatureStore,
    rows: &[mesh_feature_store::Row],
) -> pb::PushColumns {
    mesh_feature_store::service::push_columns(store.view("card").unwrap(), rows)
}

/// A columnar push to `view`, buffered.
fn columnar(view: &str, columns: pb::PushColumns) -> pb::PushRequest {
    pb::PushRequest {
        view: view.into(),
        columns: Some(columns),
        ..Default::default()
    }
}

both_backends!(async fn columnar_push_stores_each_row_as_given(env) {
    let (mut client, store) = serve(&env, Limits::default()).await;
    let t = fresh();
    let mut rows: Vec<_> = (1..=5).map(|id| card_row(id, t - id, id + 10)).collect();
    // Nulls at the first, a middle and the last row, and a feature null everywhere.
    rows[0].values[0] = None;
    rows[2].values[4] = None;
    rows[4].values[5] = None;
    for r in &mut rows {
        r.values[3] = None;
    }
    let columns = columns_of(&store, &rows);
    assert_eq!(columns.features.len(), 5, "flag has no column: null in every row");
    let resp = client
        .push(pb::PushRequest {
            wait_for_sync: true,
            ..columnar("card", columns)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.rows_written, resp.rows_skipped_older), (5, 0));
    for want in &rows {
        let got = store.read_row("card", &want.key).unwrap().unwrap();
        assert_eq!(&got, want);
    }
    // Event-time order holds as for rows: an older columnar push is skipped.
    let older = columns_of(&store, &[card_row(1, t - 100, 0)]);
    let resp = client
        .push(columnar("card", older))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.rows_written, resp.rows_skipped_older), (0, 1));
    // String keys.
    let m = [
        merchant_row("m1", t, 0.5, Some(3)),
        merchant_row("m2", t, 1.5, None),
    ];
    let resp = client
        .push(columnar(
            "merchant",
            pb::PushColumns {
                string_keys: vec!["m1".into(), "m2".into()],
                event_time_unix_micros: vec![t, t],
                features: vec![
                    pb::PushColumn {
                        name: "rate".into(),
                        f32_values: vec![0.5, 1.5],
                        ..Default::default()
                    },
                    pb::PushColumn {
                        name: "tier".into(),
                        null_rows: vec![1],
                        i64_values: vec![3],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.rows_written, 2);
    for want in &m {
        assert_eq!(&store.read_row("merchant", &want.key).unwrap().unwrap(), want);
    }
});

both_backends!(async fn columnar_push_refuses_lists_that_do_not_line_up(env) {
    let (mut client, store) = serve(&env, Limits {
        max_rows_per_push: 3,
        ..Limits::default()
    })
    .await;
    let t = fresh();
    let good = || columns_of(&store, &[card_row(1, t, 1), card_row(2, t, 2)]);
    let four = columns_of(&store, &(1..=4).map(|i| card_row(i, t, 1)).collect::<Vec<_>>());
    fn amount(c: &mut pb::PushColumns) -> &mut pb::PushColumn {
        c.features.iter_mut().find(|f| f.name == "amount").unwrap()
    }
    type Edit = Box<dyn Fn(&mut pb::PushColumns)>;
    let cases: Vec<(&str, Edit, Code, &str)> = vec![
        ("an event time missing", Box::new(move |c| {
            c.event_time_unix_micros.pop();
        }), Code::InvalidArgument, "1 event times for 2 keys"),
        ("an event time of 0", Box::new(move |c| {
            c.event_time_unix_micros[1] = 0;
        }), Code::InvalidArgument, "row 1: event_time_unix_micros must be set"),
        ("both key lists", Box::new(move |c| {
            c.string_keys = vec!["a".into()];
        }), Code::InvalidArgument, "both int64_keys and string_keys"),
        ("string keys for an int64 view", Box::new(move |c| {
            c.string_keys = vec!["1".into(), "2".into()];
            c.int64_keys.clear();
        }), Code::InvalidArgument, "card_id is a int64 key"),
        ("a value missing", Box::new(move |c| {
            amount(c).f32_values.pop();
        }), Code::InvalidArgument, "column \"amount\": 1 values for 2 rows that are not null"),
        ("a value too many", Box::new(move |c| {
            amount(c).null_rows = vec![0];
        }), Code::InvalidArgument, "column \"amount\": 2 values for 1 rows"),
        ("null rows out of order", Box::new(move |c| {
            let a = amount(c);
            a.f32_values.clear();
            a.null_rows = vec![1, 0];
        }), Code::InvalidArgument, "strictly increasing row numbers below 2; 0 is not"),
        ("a null row past the rows", Box::new(move |c| {
            let a = amount(c);
            a.f32_values.pop();
            a.null_rows = vec![2];
        }), Code::InvalidArgument, "below 2; 2 is not"),
        ("a null row twice", Box::new(move |c| {
            let a = amount(c);
            a.f32_values.clear();
            a.null_rows = vec![0, 0];
        }), Code::InvalidArgument, "0 is not"),
        ("values of another type", Box::new(move |c| {
            amount(c).f64_values = vec![1.0, 2.0];
        }), Code::InvalidArgument, "feature \"amount\" is f32, got f64 values"),
        ("a feature twice", Box::new(move |c| {
            let a = amount(c).clone();
            c.features.push(a);
        }), Code::InvalidArgument, "feature \"amount\" has two columns"),
        ("an unknown feature", Box::new(move |c| {
            amount(c).name = "nope".into();
        }), Code::NotFound, "nope"),
        ("a NaN", Box::new(move |c| {
            amount(c).f32_values[1] = f32::NAN;
        }), Code::InvalidArgument, "NaN"),
        ("more rows than max_rows_per_push", Box::new(move |c| {
            *c = four.clone();
        }), Code::InvalidArgument, "max_rows_per_push"),
        ("no rows", Box::new(move |c| {
            *c = pb::PushColumns::default();
        }), Code::InvalidArgument, "push has no rows"),
    ];
    for (what, edit, code, says) in cases {
        let mut c = good();
        edit(&mut c);
        let e = client
            .push(columnar("card", c))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(e.message().contains(says), "{what}: {}", e.message());
    }
    // Rows and columns in one push.
    let e = client
        .push(pb::PushRequest {
            rows: vec![push_row(3, t, 1.0)],
            ..columnar("card", good())
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("both rows and columns"), "{}", e.message());
    assert_eq!(
        store.scan_view("card").unwrap().count(),
        0,
        "refused pushes wrote nothing"
    );
    // The unedited push is written.
    client
        .push(columnar("card", good()))
        .await
        .unwrap();
    assert_eq!(store.scan_view("card").unwrap().count(), 2);
});

// `event_times_per_view`: each view's event times once, the columns without them;
// the same times a lookup without the flag puts in every column.
both_backends!(async fn event_times_per_view_match_the_columns(env) {
    let (mut client, store) = serve(&env, Limits::default()).await;
    let t = fresh();
    store
        .write_rows("card", &[card_row(1, t, 1), card_row(2, t - 5, 2)], Durability::Buffered)
        .unwrap();
    store
        .write_rows("merchant", &[merchant_row("m2", t - 9, 0.5, None)], Durability::Buffered)
        .unwrap();
    let ask = |per_view: bool| pb::GetOnlineFeaturesRequest {
        features: vec![
            "card:amount".into(),
            "merchant:rate".into(),
            "card:count".into(),
            "card:amount".into(),
        ],
        entities: vec![
            int_keys("card_id", vec![2, 7, 1]),
            pb::EntityKeyColumn {
                join_key: "merchant_id".into(),
                int64_keys: vec![],
                string_keys: vec!["m2".into(), "m2".into(), "m9".into()],
            },
        ],
        event_times_per_view: per_view,
    };
    let plain = client.get_online_features(ask(false)).await.unwrap().into_inner();
    assert!(plain.view_event_times.is_empty());
    let per_view = client.get_online_features(ask(true)).await.unwrap().into_inner();
    let views: Vec<(&str, &[i64])> = per_view
        .view_event_times
        .iter()
        .map(|v| (v.view.as_str(), &v.event_time_unix_micros[..]))
        .collect();
    assert_eq!(views, [("card", &[t - 5, 0, t][..]), ("merchant", &[t - 9, t - 9, 0][..])]);
    assert_eq!(plain.columns.len(), per_view.columns.len());
    for (a, b) in plain.columns.iter().zip(&per_view.columns) {
        assert!(b.event_time_unix_micros.is_empty(), "{}", b.name);
        let view = a.name.split(':').next().unwrap();
        let (_, times) = views.iter().find(|(v, _)| *v == view).unwrap();
        assert_eq!(a.event_time_unix_micros, *times, "{}", a.name);
        let without_times = pb::FeatureColumn {
            event_time_unix_micros: vec![],
            ..a.clone()
        };
        assert_eq!(&without_times, b);
    }
});
