//! What only the Redis backend has, against real `redis-server` processes: the
//! key layout, a 3-master Redis Cluster, the cache (age bound, invalidation by
//! this process's writes), the event-time script with several writers, and the
//! failure behaviour: a stalled server and a killed master answer within the
//! lookup budget, marked, never with an error.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{RedisCluster, RedisServer};
use common::*;
use mesh_feature_store::{
    ColumnValues, Durability, FeatureStatus, FeatureStore, KeyColumn, LookupRequest, RedisOptions,
    RedisPassword, RedisTarget, StoreOptions,
};

/// A store on `server`; the lookup budget is generous (tests about semantics must
/// never see a degraded answer on a loaded machine) unless `tune` sets it.
fn server_store(server: &RedisServer, tune: impl FnOnce(&mut RedisOptions)) -> FeatureStore {
    let mut o = RedisOptions::new(RedisTarget::Server(server.url()));
    o.lookup_budget = Duration::from_secs(10);
    tune(&mut o);
    FeatureStore::open_redis(&views(), o, StoreOptions::default()).unwrap()
}

fn cluster_store(cluster: &RedisCluster, tune: impl FnOnce(&mut RedisOptions)) -> FeatureStore {
    let mut o = RedisOptions::new(RedisTarget::Cluster(cluster.urls()));
    o.lookup_budget = Duration::from_secs(10);
    tune(&mut o);
    FeatureStore::open_redis(&views(), o, StoreOptions::default()).unwrap()
}

fn amounts(ids: Vec<i64>) -> LookupRequest {
    LookupRequest::new(["card:amount", "card:count"]).with_keys("card_id", KeyColumn::Int64(ids))
}

fn f32s(c: &ColumnValues) -> &[f32] {
    match c {
        ColumnValues::F32(v) => v,
        other => panic!("not f32: {other:?}"),
    }
}

fn write_cards(store: &FeatureStore, ids: std::ops::RangeInclusive<i64>, t: i64, seed: i64) {
    let rows: Vec<_> = ids.map(|i| card_row(i, t, seed)).collect();
    for chunk in rows.chunks(1000) {
        store
            .write_rows("card", chunk, Durability::Buffered)
            .unwrap();
    }
}

#[test]
fn one_hash_per_entity_and_view_under_the_entity_hash_tag() {
    let server = RedisServer::start();
    let store = server_store(&server, |_| {});
    let t = fresh();
    store
        .write_rows("card", &[card_row(42, t, 3)], Durability::Buffered)
        .unwrap();
    let view_id = store.view("card").unwrap().id;
    let mut conn = ::redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let key = format!("mesh:{view_id}:{{i42}}");
    let fields: std::collections::HashMap<String, Vec<u8>> =
        ::redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap();
    let mut names: Vec<&str> = fields.keys().map(|s| s.as_str()).collect();
    names.sort();
    assert_eq!(names, ["t", "v"], "{key}");
    let time = String::from_utf8(fields["t"].clone()).unwrap();
    assert_eq!(time, format!("{:016x}", (t as u64) ^ (1 << 63)));
    // The registry is one JSON key next to the rows.
    let reg: String = ::redis::cmd("GET")
        .arg("mesh:registry")
        .query(&mut conn)
        .unwrap();
    assert!(
        reg.contains("\"card\"") && reg.contains("\"merchant\""),
        "{reg}"
    );
    // The row reads back through the store's own decoding.
    let row = store
        .read_row("card", &mesh_feature_store::EntityKey::Int64(42))
        .unwrap()
        .unwrap();
    assert_eq!(row, card_row(42, t, 3));
    // And a scan finds it.
    let scanned: Vec<_> = store.scan_view("card").unwrap().collect();
    assert_eq!(scanned.len(), 1);
}

#[test]
fn the_write_script_keeps_the_newest_across_writers_and_refuses_future_rows() {
    let server = RedisServer::start();
    let a = Arc::new(server_store(&server, |_| {}));
    let b = Arc::new(server_store(&server, |_| {}));
    let base = fresh() - 3_600_000;
    // Two processes' worth of writers interleave times for the same keys; the
    // newest event time must win for every key, whatever order they land in.
    let handles: Vec<_> = [(a.clone(), 0i64), (b.clone(), 1i64)]
        .into_iter()
        .map(|(s, parity)| {
            std::thread::spawn(move || {
                for round in 0..20i64 {
                    let t = base + (round * 2 + parity) * 1000;
                    let rows: Vec<_> = (1..=50)
                        .map(|i| card_row(i, t, round * 2 + parity))
                        .collect();
                    s.write_rows("card", &rows, Durability::Buffered).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for i in 1..=50 {
        let row = a
            .read_row("card", &mesh_feature_store::EntityKey::Int64(i))
            .unwrap()
            .unwrap();
        assert_eq!(row.event_time, base + 39 * 1000, "key {i}");
        assert_eq!(row, card_row(i, base + 39 * 1000, 39));
    }
    // The script itself refuses a row dated past the server clock's horizon
    // (max future skew passed as ARGV[3]), whatever the writer's clock said.
    let mut conn = ::redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let future = mesh_feature_store::now_micros() + 600_000_000;
    let got: i64 = ::redis::cmd("EVAL")
        .arg(mesh_feature_store::WRITE_SCRIPT)
        .arg(1)
        .arg("mesh:1:{i999}")
        .arg(format!("{:016x}", (future as u64) ^ (1 << 63)))
        .arg("x")
        .arg(300_000_000i64)
        .arg(future)
        .query(&mut conn)
        .unwrap();
    assert_eq!(got, -1);
    let exists: i64 = ::redis::cmd("EXISTS")
        .arg("mesh:1:{i999}")
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 0);
}

/// A server with `requirepass`: the store authenticates with the password it was
/// given; without it, or with a wrong one, opening fails with Redis's reason and the
/// password appears in no message.
#[tokio::test]
async fn a_password_protected_server_needs_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "pw-Secret-123"]);
    let password = RedisPassword::from_file_contents("pw-Secret-123\n").unwrap();
    let store = server_store(&server, |o| o.password = Some(password.clone()));
    let t = fresh();
    store
        .push("card", vec![card_row(1, t, 1)], Durability::Buffered)
        .await
        .unwrap();
    let got = store.get_online_features(amounts(vec![1])).await.unwrap();
    assert_eq!(f32s(&got.column("card:amount").unwrap().values), [1.5]);

    for given in [None, Some("wrong-password")] {
        let mut o = RedisOptions::new(RedisTarget::Server(server.url()));
        o.connect_timeout = Duration::from_secs(2);
        o.password = given.map(|p| RedisPassword::from_file_contents(p).unwrap());
        // Opening blocks (the mesh opens the store off the async threads too).
        let e = tokio::task::spawn_blocking(move || {
            FeatureStore::open_redis(&views(), o, StoreOptions::default())
                .err()
                .map(|e| e.to_string())
        })
        .await
        .unwrap()
        .expect("opening without the right password fails");
        let lower = e.to_lowercase();
        assert!(
            lower.contains("auth") || lower.contains("password"),
            "{given:?}: {e}"
        );
        assert!(
            !e.contains("pw-Secret-123") && !e.contains("wrong-password"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn the_cache_answers_until_its_max_age_and_own_pushes_invalidate_it() {
    let server = RedisServer::start();
    let reader = server_store(&server, |o| o.cache_max_age = Duration::from_millis(400));
    let other = server_store(&server, |o| o.cache_max_bytes = 0);
    let t = fresh();
    other
        .write_rows("card", &[card_row(1, t, 1)], Durability::Buffered)
        .unwrap();
    let got = reader.get_online_features(amounts(vec![1])).await.unwrap();
    assert_eq!(f32s(&got.column("card:amount").unwrap().values), [1.5]);
    // Another process writes a newer row: the cached one still answers...
    other
        .write_rows("card", &[card_row(1, t + 1, 2)], Durability::Buffered)
        .unwrap();
    let got = reader.get_online_features(amounts(vec![1])).await.unwrap();
    assert_eq!(f32s(&got.column("card:amount").unwrap().values), [1.5]);
    assert_eq!(got.degraded, None);
    // ...until it is older than cache_max_age.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let got = reader.get_online_features(amounts(vec![1])).await.unwrap();
    assert_eq!(f32s(&got.column("card:amount").unwrap().values), [2.0]);
    // A write through this store is seen at once.
    reader
        .push("card", vec![card_row(1, t + 2, 3)], Durability::Buffered)
        .await
        .unwrap();
    let got = reader.get_online_features(amounts(vec![1])).await.unwrap();
    assert_eq!(f32s(&got.column("card:amount").unwrap().values), [2.5]);
    // Negative answers are cached too, and a push clears them.
    let got = reader.get_online_features(amounts(vec![7])).await.unwrap();
    assert_eq!(
        got.column("card:amount").unwrap().statuses,
        [FeatureStatus::NotFound]
    );
    reader
        .push("card", vec![card_row(7, t, 1)], Durability::Buffered)
        .await
        .unwrap();
    let got = reader.get_online_features(amounts(vec![7])).await.unwrap();
    assert_eq!(
        got.column("card:amount").unwrap().statuses,
        [FeatureStatus::Present]
    );
}

#[tokio::test]
async fn a_stalled_server_answers_within_the_budget_from_the_cache_marked() {
    let server = RedisServer::start();
    let budget = Duration::from_millis(30);
    let store = server_store(&server, |o| {
        o.lookup_budget = budget;
        o.cache_max_age = Duration::from_millis(50);
    });
    let t = fresh();
    write_cards(&store, 1..=10, t, 1);
    // Rows 1-5 are read once (and so cached); 6-10 never.
    let warm = store
        .get_online_features(amounts((1..=5).collect()))
        .await
        .unwrap();
    assert!(warm
        .column("card:amount")
        .unwrap()
        .statuses
        .iter()
        .all(|s| *s == FeatureStatus::Present));
    tokio::time::sleep(Duration::from_millis(60)).await; // past cache_max_age
    server.pause(true);
    for _ in 0..5 {
        let start = Instant::now();
        let got = store
            .get_online_features(amounts((1..=10).collect()))
            .await
            .unwrap();
        let took = start.elapsed();
        assert!(took < budget + Duration::from_millis(100), "took {took:?}");
        let amount = got.column("card:amount").unwrap();
        let want: Vec<FeatureStatus> = (1..=10)
            .map(|i| {
                if i <= 5 {
                    FeatureStatus::OutsideMaxAge
                } else {
                    FeatureStatus::Unavailable
                }
            })
            .collect();
        assert_eq!(amount.statuses, want);
        // The cached values come with their event times, for diagnosis.
        assert_eq!(&f32s(&amount.values)[..5], [1.5, 2.5, 3.5, 4.5, 5.5]);
        assert_eq!(&amount.event_times[..5], [t; 5]);
        let d = got.degraded.as_ref().expect("marked degraded");
        assert_eq!(d.rows, vec![true; 10]);
        assert!(
            d.reason.contains("redis") && d.reason.contains("5 entity rows served from the cache"),
            "{}",
            d.reason
        );
    }
    // Writes fail with a clear error instead of waiting forever.
    let e = store
        .push("card", vec![card_row(1, t + 1, 2)], Durability::Buffered)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not written"), "{e}");
    server.pause(false);
    // Back: complete answers again.
    let start = Instant::now();
    loop {
        let got = store
            .get_online_features(amounts((1..=10).collect()))
            .await
            .unwrap();
        if got.degraded.is_none() {
            assert!(got
                .column("card:amount")
                .unwrap()
                .statuses
                .iter()
                .all(|s| *s == FeatureStatus::Present));
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_cluster_spreads_entities_over_its_masters_and_answers_in_one_batch() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, |_| {});
    let t = fresh();
    write_cards(&store, 1..=300, t, 1);
    store
        .write_rows(
            "merchant",
            &(0..50)
                .map(|i| merchant_row(&format!("m{i}"), t, i as f32, Some(i)))
                .collect::<Vec<_>>(),
            Durability::Buffered,
        )
        .unwrap();
    // Every master holds some of them.
    for n in &cluster.nodes {
        let size = common::redis::command(n.port, "DBSIZE").unwrap();
        let keys: i64 = size.trim().trim_start_matches(':').parse().unwrap();
        assert!(keys > 10, "node {} holds {keys} keys", n.port);
    }
    // 100 keys of two views in one lookup.
    let req = LookupRequest::new(["card:amount", "merchant:tier"])
        .with_keys("card_id", KeyColumn::Int64((101..=200).collect()))
        .with_keys(
            "merchant_id",
            KeyColumn::String((0..100).map(|i| format!("m{}", i % 60)).collect()),
        );
    let got = store.get_online_features(req).await.unwrap();
    assert_eq!(got.degraded, None);
    let amount = got.column("card:amount").unwrap();
    assert!(amount.statuses.iter().all(|s| *s == FeatureStatus::Present));
    let want: Vec<f32> = (101..=200).map(|i| i as f32 + 0.5).collect();
    assert_eq!(f32s(&amount.values), want.as_slice());
    let tier = got.column("merchant:tier").unwrap();
    let ColumnValues::I64(tiers) = &tier.values else {
        panic!("tier is not i64: {:?}", tier.values)
    };
    for (i, (status, value)) in tier.statuses.iter().zip(tiers).enumerate() {
        let m = i % 60;
        if m < 50 {
            assert_eq!(*status, FeatureStatus::Present);
            assert_eq!(*value, m as i64, "m{m}");
        } else {
            assert_eq!(*status, FeatureStatus::NotFound, "m{m}");
        }
    }
    let scanned = store.scan_view("card").unwrap().count();
    assert_eq!(scanned, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_during_lookups_keeps_every_answer_within_the_budget() {
    let mut cluster = RedisCluster::start();
    let budget = Duration::from_millis(40);
    let store = Arc::new(cluster_store(&cluster, |o| {
        o.lookup_budget = budget;
        o.cache_max_age = Duration::from_millis(100);
    }));
    let t = fresh();
    write_cards(&store, 1..=300, t, 1);
    // Warm the cache with every key.
    for chunk in (1..=300).collect::<Vec<i64>>().chunks(100) {
        store
            .get_online_features(amounts(chunk.to_vec()))
            .await
            .unwrap();
    }
    // Generous: the bound is "never waits on the dead master" (its connect timeout is
    // seconds), not a latency figure; a loaded 2-core CI machine took 142 ms once.
    let margin = Duration::from_millis(400);
    let stop = Instant::now() + Duration::from_secs(4);
    let killed_at = Instant::now() + Duration::from_millis(500);
    let mut killed = false;
    let (mut answers, mut degraded, mut mixed) = (0u64, 0u64, 0u64);
    let mut seed = 7u64;
    while Instant::now() < stop {
        if !killed && Instant::now() >= killed_at {
            cluster.nodes[0].kill();
            killed = true;
        }
        let ids: Vec<i64> = (0..100)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                1 + ((seed >> 33) % 300) as i64
            })
            .collect();
        let start = Instant::now();
        let got = store
            .get_online_features(amounts(ids.clone()))
            .await
            .expect("a lookup never fails for a dead master");
        let took = start.elapsed();
        assert!(took < budget + margin, "lookup took {took:?}");
        answers += 1;
        let amount = got.column("card:amount").unwrap();
        for (i, s) in amount.statuses.iter().enumerate() {
            match s {
                FeatureStatus::Present => {
                    assert_eq!(f32s(&amount.values)[i], ids[i] as f32 + 0.5)
                }
                // Every key was cached: a failed one comes from the cache, marked.
                FeatureStatus::OutsideMaxAge => {
                    assert_eq!(f32s(&amount.values)[i], ids[i] as f32 + 0.5);
                    assert!(got.degraded.as_ref().is_some_and(|d| d.rows[i]));
                }
                other => panic!("key {} answered {other:?}", ids[i]),
            }
        }
        if let Some(d) = &got.degraded {
            degraded += 1;
            assert!(d.reason.contains("redis"), "{}", d.reason);
            if amount.statuses.contains(&FeatureStatus::Present) {
                mixed += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(killed);
    assert!(answers > 20, "{answers} answers");
    assert!(degraded > 0, "the kill was never seen");
    // The live masters kept answering for their keys next to the dead one's.
    assert!(mixed > 0, "no answer mixed live and cached values");
    eprintln!("{answers} lookups, {degraded} degraded, {mixed} mixing live and cached");
}
