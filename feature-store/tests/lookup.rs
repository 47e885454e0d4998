//! Lookup semantics over a real sled database: statuses, freshness, alignment,
//! several views in one call, and the errors bad requests get.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use common::*;
use mesh_feature_store::{
    ColumnValues, Durability, FeatureStatus, FeatureStoreError, KeyColumn, Limits, LookupRequest,
    StoreOptions,
};

both_backends!(async fn present_missing_null_and_stale(env) {
    let store = env.open();
    let t_fresh = fresh();
    let t_stale = t_fresh - 2 * HOUR_MICROS; // older than the 1h max_age
    let mut null_row = card_row(3, t_fresh, 7);
    null_row.values[0] = None; // amount is null
    store
        .write_rows(
            "card",
            &[card_row(1, t_fresh, 1), card_row(2, t_stale, 2), null_row],
            Durability::Buffered,
        )
        .unwrap();

    // Keys in a scrambled order, with one that was never written (99).
    let req = LookupRequest::new(["card:amount", "card:count"])
        .with_keys("card_id", KeyColumn::Int64(vec![2, 99, 1, 3]));
    let resp = store.get_online_features(req).await.unwrap();
    assert_eq!(resp.rows, 4);
    let amount = resp.column("card:amount").unwrap();
    assert_eq!(
        amount.statuses,
        vec![
            FeatureStatus::OutsideMaxAge,
            FeatureStatus::NotFound,
            FeatureStatus::Present,
            FeatureStatus::Null
        ]
    );
    assert_eq!(amount.event_times, vec![t_stale, 0, t_fresh, t_fresh]);
    // The stale value is returned for diagnosis, but never as PRESENT.
    assert_eq!(
        amount.values,
        ColumnValues::F32(vec![2.0 + 1.0, 0.0, 1.0 + 0.5, 0.0])
    );
    let count = resp.column("card:count").unwrap();
    assert_eq!(
        count.statuses,
        vec![
            FeatureStatus::OutsideMaxAge,
            FeatureStatus::NotFound,
            FeatureStatus::Present,
            FeatureStatus::Present
        ]
    );
    assert_eq!(count.values, ColumnValues::I64(vec![22, 0, 11, 37]));
});

both_backends!(async fn freshness_boundary_follows_max_age(env) {
    let store = env.open();
    let now = mesh_feature_store::now_micros();
    store
        .write_rows(
            "card",
            &[
                card_row(1, now - HOUR_MICROS + 5_000_000, 0),
                card_row(2, now - HOUR_MICROS - 5_000_000, 0),
            ],
            Durability::Buffered,
        )
        .unwrap();
    let req =
        LookupRequest::new(["card:amount"]).with_keys("card_id", KeyColumn::Int64(vec![1, 2]));
    let resp = store.get_online_features_blocking(&req, now).unwrap();
    assert_eq!(
        resp.columns[0].statuses,
        vec![FeatureStatus::Present, FeatureStatus::OutsideMaxAge]
    );
    // The same rows judged 10 s later: both stale.
    let resp = store
        .get_online_features_blocking(&req, now + 10_000_000)
        .unwrap();
    assert_eq!(
        resp.columns[0].statuses,
        vec![FeatureStatus::OutsideMaxAge; 2]
    );
});

both_backends!(async fn all_types_two_views_and_wildcard(env) {
    let store = env.open();
    let t = fresh();
    store
        .write_rows("card", &[card_row(5, t, 3)], Durability::Buffered)
        .unwrap();
    store
        .write_rows(
            "merchant",
            &[
                merchant_row("m1", t, 0.25, Some(2)),
                merchant_row("m2", t, 0.5, None),
            ],
            Durability::Sync,
        )
        .unwrap();
    let req = LookupRequest::new(["card:*", "merchant:tier", "merchant:rate"])
        .with_keys("card_id", KeyColumn::Int64(vec![5, 6]))
        .with_keys(
            "merchant_id",
            KeyColumn::String(vec!["m2".into(), "m1".into()]),
        );
    let resp = store.get_online_features(req).await.unwrap();
    let names: Vec<&str> = resp.columns.iter().map(|c| &*c.name).collect();
    assert_eq!(
        names,
        [
            "card:amount",
            "card:count",
            "card:ratio",
            "card:flag",
            "card:country",
            "card:emb",
            "merchant:tier",
            "merchant:rate"
        ]
    );
    let col = |n: &str| resp.column(n).unwrap();
    assert_eq!(col("card:ratio").values, ColumnValues::F64(vec![0.75, 0.0]));
    assert_eq!(
        col("card:flag").values,
        ColumnValues::Bool(vec![true, false])
    );
    assert_eq!(
        col("card:country").values,
        ColumnValues::String(vec!["c3".into(), String::new()])
    );
    assert_eq!(
        col("card:emb").values,
        ColumnValues::F32Vector(vec![vec![3.0, 5.0], vec![]])
    );
    assert_eq!(
        col("card:emb").statuses,
        vec![FeatureStatus::Present, FeatureStatus::NotFound]
    );
    assert_eq!(
        col("merchant:tier").statuses,
        vec![FeatureStatus::Null, FeatureStatus::Present]
    );
    assert_eq!(col("merchant:tier").values, ColumnValues::I64(vec![0, 2]));
    assert_eq!(
        col("merchant:rate").values,
        ColumnValues::F32(vec![0.5, 0.25])
    );
    // The column names are the store's, shared by every answer (not formatted in
    // each), and a request's list of features can be shared the same way.
    let features: std::sync::Arc<[String]> = vec!["merchant:rate".to_string()].into();
    let again = store
        .get_online_features(
            LookupRequest::shared(features.clone())
                .with_keys("merchant_id", KeyColumn::String(vec!["m1".into()])),
        )
        .await
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&again.columns[0].name, &col("merchant:rate").name));
    assert_eq!(again.columns[0].values, ColumnValues::F32(vec![0.25]));
});

both_backends!(async fn parallel_fetch_matches_key_order_fetch(env) {
    let opts = StoreOptions {
        fetch: mesh_feature_store::FetchStrategy::Parallel {
            tasks: std::num::NonZeroUsize::new(3).unwrap(),
            min_keys: 1,
        },
        ..Default::default()
    };
    let store = env.open_with(opts);
    let t = fresh();
    let rows: Vec<_> = (0..200)
        .filter(|i| i % 3 != 0)
        .map(|i| card_row(i, t, i % 5))
        .collect();
    store
        .write_rows("card", &rows, Durability::Buffered)
        .unwrap();
    let keys: Vec<i64> = (0..250).rev().collect();
    let req = LookupRequest::new(["card:count", "card:country"])
        .with_keys("card_id", KeyColumn::Int64(keys.clone()));
    let par = store.get_online_features(req.clone()).await.unwrap();
    let seq = store
        .get_online_features_blocking(&req, mesh_feature_store::now_micros())
        .unwrap();
    assert_eq!(par.rows, 250);
    assert_eq!(par.columns, seq.columns);
    let ColumnValues::I64(counts) = &par.columns[0].values else {
        panic!("i64 column")
    };
    for (i, k) in keys.iter().enumerate() {
        let want = if *k < 200 && k % 3 != 0 {
            k * 10 + k % 5
        } else {
            0
        };
        assert_eq!(counts[i], want, "key {k}");
    }
});

// Small lookups read sled at once, larger ones a few keys a turn: both give the
// same answer, key by key, on both sides of the bound.
both_backends!(async fn inline_and_pooled_lookups_answer_alike(env) {
    let store = env.open_with(StoreOptions {
        inline_max_keys: 4,
        ..Default::default()
    });
    let t = fresh();
    let rows: Vec<_> = (0..20).filter(|i| i % 2 == 0).map(|i| card_row(i, t, 1)).collect();
    store
        .write_rows("card", &rows, Durability::Buffered)
        .unwrap();
    let lookup = |keys: Vec<i64>| {
        LookupRequest::new(["card:count", "card:amount"]).with_keys("card_id", KeyColumn::Int64(keys))
    };
    // 2 views' worth of keys would be rows x views; here one view: 4 keys at once, 5 in turns.
    let inline = store.get_online_features(lookup(vec![3, 2, 1, 0])).await.unwrap();
    let pooled = store.get_online_features(lookup(vec![3, 2, 1, 0, 4])).await.unwrap();
    for (a, b) in inline.columns.iter().zip(&pooled.columns) {
        assert_eq!(a.statuses[..], b.statuses[..4], "{}", a.name);
        assert_eq!(a.event_times[..], b.event_times[..4], "{}", a.name);
    }
    assert_eq!(
        inline.columns[0].statuses,
        [FeatureStatus::NotFound, FeatureStatus::Present, FeatureStatus::NotFound, FeatureStatus::Present]
    );
    let (ColumnValues::I64(a), ColumnValues::I64(b)) = (&inline.columns[0].values, &pooled.columns[0].values) else {
        panic!("i64 columns")
    };
    assert_eq!(a[..], b[..4]);
    assert_eq!(b[4], 40 + 1);
});

both_backends!(async fn bad_requests_get_clear_errors(env) {
    let opts = StoreOptions {
        limits: Limits {
            max_keys_per_lookup: 10,
            ..Default::default()
        },
        ..Default::default()
    };
    let store = env.open_with(opts);
    let keys = |n: i64| KeyColumn::Int64((0..n).collect());
    let err = |req: LookupRequest| {
        let store = store.clone();
        async move { store.get_online_features(req).await.unwrap_err() }
    };

    let e = err(LookupRequest::new(["nope:amount"]).with_keys("card_id", keys(1))).await;
    assert!(
        matches!(e, FeatureStoreError::UnknownView(ref v) if v == "nope"),
        "{e}"
    );
    let e = err(LookupRequest::new(["card:nope"]).with_keys("card_id", keys(1))).await;
    assert!(matches!(e, FeatureStoreError::UnknownFeature { .. }), "{e}");
    let e = err(LookupRequest::new(["card"]).with_keys("card_id", keys(1))).await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    let e = err(LookupRequest::new(Vec::<String>::new()).with_keys("card_id", keys(1))).await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    let e = err(LookupRequest::new(["card:amount"]).with_keys("card_id", keys(0))).await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    // String keys for an int64 entity; a missing key column; an empty string key.
    let e = err(LookupRequest::new(["card:amount"])
        .with_keys("card_id", KeyColumn::String(vec!["1".into()])))
    .await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    let e = err(LookupRequest::new(["merchant:rate"]).with_keys("card_id", keys(1))).await;
    assert!(e.to_string().contains("merchant_id"), "{e}");
    let e = err(LookupRequest::new(["merchant:rate"])
        .with_keys("merchant_id", KeyColumn::String(vec![String::new()])))
    .await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    // Columns of unequal length.
    let e = err(LookupRequest::new(["card:amount", "merchant:rate"])
        .with_keys("card_id", keys(2))
        .with_keys("merchant_id", KeyColumn::String(vec!["a".into()])))
    .await;
    assert!(matches!(e, FeatureStoreError::InvalidArgument(_)), "{e}");
    // Too many keys: 6 rows x 2 views = 12 > 10; the message names the limit.
    let e = err(LookupRequest::new(["card:amount", "merchant:rate"])
        .with_keys("card_id", keys(6))
        .with_keys(
            "merchant_id",
            KeyColumn::String((0..6).map(|i| format!("m{i}")).collect()),
        ))
    .await;
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            FeatureStoreError::LimitExceeded {
                got: 12,
                limit: 10,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("max_keys_per_lookup") && msg.contains("10"),
        "{msg}"
    );
    // Exactly at the limit is fine.
    store
        .get_online_features(LookupRequest::new(["card:amount"]).with_keys("card_id", keys(10)))
        .await
        .unwrap();

    // The gRPC mapping of each kind.
    let code = |e: FeatureStoreError| tonic::Status::from(e).code();
    assert_eq!(
        code(FeatureStoreError::UnknownView("x".into())),
        tonic::Code::NotFound
    );
    assert_eq!(
        code(FeatureStoreError::InvalidArgument("x".into())),
        tonic::Code::InvalidArgument
    );
});

both_backends!(async fn demo_generator_fills_the_example_views(env) {
    let cfg = mesh_feature_store::ViewsConfig::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/views.toml"
    ))
    .unwrap();
    let store = env.try_open(&cfg, StoreOptions::default()).unwrap();
    let report = mesh_feature_store::generate_demo_features(&store, 1000, 50, 7).unwrap();
    assert_eq!((report.cards, report.merchants), (1000, 50));
    assert_eq!(store.scan_view("card").unwrap().count(), 1000);
    let req = LookupRequest::new(["card:*", "merchant:risk_tier"])
        .with_keys("card_id", KeyColumn::Int64((1..=1000).collect()))
        .with_keys(
            "merchant_id",
            KeyColumn::String(
                (0..1000)
                    .map(|i| mesh_feature_store::demo_merchant_key(i % 50 + 1))
                    .collect(),
            ),
        );
    let resp = store.get_online_features(req).await.unwrap();
    let count = |c: &str, s: FeatureStatus| {
        resp.column(c)
            .unwrap()
            .statuses
            .iter()
            .filter(|x| **x == s)
            .count()
    };
    // Every status but NOT_FOUND shows up in a demo; the seed makes this fixed.
    assert!(count("card:txn_count_1h", FeatureStatus::Present) > 900);
    assert!(count("card:txn_count_1h", FeatureStatus::OutsideMaxAge) > 0);
    assert!(count("card:amount_sum_24h", FeatureStatus::Null) > 0);
    assert_eq!(count("merchant:risk_tier", FeatureStatus::NotFound), 0);
    let ColumnValues::I64(tiers) = &resp.column("merchant:risk_tier").unwrap().values else {
        panic!("i64")
    };
    assert!(tiers.iter().all(|t| (0..4).contains(t)));
});

/// A lookup of more keys than `inline_max_keys` (and at most `on_task_max_keys`) reads
/// sled on the calling task, a few keys a turn with a yield between: on a runtime of
/// one thread, another task runs once a turn. Reads that held the worker throughout
/// would let it run not at all; a hop to the blocking pool would let it spin for as
/// long as the other thread read. The answer is the one of a store whose every read
/// hops, key by key.
#[tokio::test]
async fn large_lookups_read_in_turns_and_let_other_tasks_run() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let turns = open_with(
        &a,
        StoreOptions {
            inline_max_keys: 4,
            ..Default::default()
        },
    );
    let pooled = open_with(
        &b,
        StoreOptions {
            inline_max_keys: 0,
            ..Default::default()
        },
    );
    let t = fresh();
    let rows: Vec<_> = (0..100)
        .filter(|i| i % 3 != 0)
        .map(|i| card_row(i, t, i % 5))
        .collect();
    for s in [&turns, &pooled] {
        s.write_rows("card", &rows, Durability::Buffered).unwrap();
    }
    let req = || {
        LookupRequest::new(["card:count", "card:amount"])
            .with_keys("card_id", KeyColumn::Int64((0..100).rev().collect()))
    };
    let ticks = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = tokio::spawn({
        let (ticks, stop) = (ticks.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                ticks.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    tokio::task::yield_now().await;
    let before = ticks.load(Ordering::Relaxed);
    let got = turns.get_online_features(req()).await.unwrap();
    let during = ticks.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    ticker.await.unwrap();
    // 100 keys, 4 a turn: 25 turns, 24 yields.
    assert!(
        (20..=100).contains(&during),
        "the other task ran {during} times during the lookup"
    );
    assert_eq!(got, pooled.get_online_features(req()).await.unwrap());
    let count = got.column("card:count").unwrap();
    assert_eq!(count.statuses[99], FeatureStatus::NotFound, "key 0");
    assert_eq!(count.statuses[98], FeatureStatus::Present, "key 1");
}
