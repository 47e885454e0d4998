//! The sled backend's row cache (`StoreOptions::row_cache_max_bytes`): lookups
//! answer from it, every write drops what it replaced, a read racing a write never
//! leaves the older row behind, and its size stays within the bound.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use mesh_feature_store::{
    ColumnValues, Durability, FeatureStatus, FeatureStore, KeyColumn, LookupRequest, Micros,
    StoreOptions,
};

fn with_cache(bytes: usize) -> StoreOptions {
    StoreOptions {
        row_cache_max_bytes: bytes,
        ..Default::default()
    }
}

fn counts(store: &FeatureStore, ids: &[i64]) -> (Vec<FeatureStatus>, Vec<i64>, Vec<Micros>) {
    let req = LookupRequest::new(["card:count"]).with_keys("card_id", KeyColumn::Int64(ids.into()));
    let resp = store
        .get_online_features_blocking(&req, mesh_feature_store::now_micros())
        .unwrap();
    let c = resp.column("card:count").unwrap();
    let ColumnValues::I64(v) = &c.values else {
        panic!("count is i64")
    };
    (c.statuses.clone(), v.clone(), c.event_times.clone())
}

/// A store with a 1 MiB row cache and card 1 written at a fresh time `t`.
fn cached_with_card_1(dir: &tempfile::TempDir) -> (FeatureStore, Micros) {
    let store = open_with(dir, with_cache(1 << 20));
    let t = fresh();
    store
        .write_rows("card", &[card_row(1, t, 1)], Durability::Buffered)
        .unwrap();
    (store, t)
}

#[test]
fn lookups_fill_the_cache_and_writes_replace_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (store, t) = cached_with_card_1(&dir);
    assert_eq!(store.cache_bytes(), 0, "writes do not fill the cache");

    // 1 is stored, 2 is not: both are cached (2 as "not stored").
    let (st, v, _) = counts(&store, &[1, 2]);
    assert_eq!(st, vec![FeatureStatus::Present, FeatureStatus::NotFound]);
    assert_eq!(v[0], 11);
    let held = store.cache_bytes();
    assert!(held > 0);
    // A second lookup answers from the cache: it holds no more than before.
    assert_eq!(counts(&store, &[1, 2]).1[0], 11);
    assert_eq!(store.cache_bytes(), held);

    // A newer row for 1 and a first row for 2: both cached answers are replaced.
    store
        .write_rows(
            "card",
            &[card_row(1, t + 1, 5), card_row(2, t, 3)],
            Durability::Buffered,
        )
        .unwrap();
    assert_eq!(store.cache_bytes(), 0, "the write dropped both keys");
    let (st, v, et) = counts(&store, &[1, 2]);
    assert_eq!(st, vec![FeatureStatus::Present, FeatureStatus::Present]);
    assert_eq!(v, vec![15, 23]);
    assert_eq!(et, vec![t + 1, t]);

    // An older row is skipped by the event-time rule; the cached answer stays right.
    store
        .write_rows("card", &[card_row(1, t - 1, 9)], Durability::Buffered)
        .unwrap();
    assert_eq!(counts(&store, &[1]).1, vec![15]);
}

#[test]
fn a_cached_row_goes_stale_by_max_age_like_a_stored_one() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = cached_with_card_1(&dir);
    let req = LookupRequest::new(["card:count"]).with_keys("card_id", KeyColumn::Int64(vec![1]));
    let now = mesh_feature_store::now_micros();
    let fresh = store.get_online_features_blocking(&req, now).unwrap();
    assert_eq!(fresh.columns[0].statuses, vec![FeatureStatus::Present]);
    // The same cached bytes, judged two hours later (max_age is 1h).
    let later = store
        .get_online_features_blocking(&req, now + 2 * HOUR_MICROS)
        .unwrap();
    assert_eq!(
        later.columns[0].statuses,
        vec![FeatureStatus::OutsideMaxAge]
    );
}

#[test]
fn the_cache_stays_within_its_bound_and_answers_like_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let bound = 64 << 10;
    let cached = open_with(&dir, with_cache(bound));
    let t = fresh();
    let rows: Vec<_> = (0..5_000).map(|i| card_row(i, t, i % 7)).collect();
    cached
        .write_rows("card", &rows, Durability::Buffered)
        .unwrap();
    let ids: Vec<i64> = (0..6_000).step_by(3).collect(); // some past the stored ones
    let first = counts(&cached, &ids);
    assert!(cached.cache_bytes() > 0);
    assert!(cached.cache_bytes() <= bound, "{}", cached.cache_bytes());
    // Again, now partly from the cache: the same answer.
    assert_eq!(counts(&cached, &ids), first);
    drop(cached);
    // The same database without a cache gives the same answer.
    let plain = open_with(&dir, with_cache(0));
    assert_eq!(counts(&plain, &ids), first);
    assert_eq!(plain.cache_bytes(), 0);
}

/// Readers race a writer that keeps raising every key's row. sled answers each
/// key's latest write, so a reader must never see a key go back to an older row
/// (that would be a read from before a write, cached after it), and once the
/// writer stops every key must read its last row.
#[test]
fn a_read_racing_a_write_never_leaves_the_older_row_cached() {
    let dir = tempfile::tempdir().unwrap();
    // Small enough that entries also come and go by eviction.
    let store = open_with(&dir, with_cache(8 << 10));
    const KEYS: i64 = 64;
    let t0 = fresh() - 1_000_000;
    let ids: Vec<i64> = (0..KEYS).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (store, stop, ids) = (store.clone(), stop.clone(), ids.clone());
            std::thread::spawn(move || {
                let mut seen = vec![0 as Micros; KEYS as usize];
                let mut lookups = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Different subsets per reader and round.
                    let some: Vec<i64> = ids
                        .iter()
                        .copied()
                        .filter(|k| (k + lookups as i64 + r) % 3 != 0)
                        .collect();
                    let (_, _, times) = counts(&store, &some);
                    for (k, t) in some.iter().zip(times) {
                        let last = &mut seen[*k as usize];
                        assert!(t >= *last, "key {k} went back from {} to {t}", *last);
                        *last = t;
                    }
                    lookups += 1;
                }
                lookups
            })
        })
        .collect();
    let mut last = t0;
    for round in 0..400 {
        last = t0 + round;
        // Half the keys per write, alternating, so reads see both kinds of shard.
        let rows: Vec<_> = ids
            .iter()
            .filter(|k| (*k + round) % 2 == 0 || round == 399)
            .map(|&k| card_row(k, last, round))
            .collect();
        store
            .write_rows("card", &rows, Durability::Buffered)
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let (st, v, times) = counts(&store, &ids);
    assert!(st.iter().all(|s| *s == FeatureStatus::Present));
    assert!(times.iter().all(|t| *t == last), "{times:?}");
    assert_eq!(v, ids.iter().map(|k| k * 10 + 399).collect::<Vec<_>>());
}

/// With the row cache, a lookup asks the cache on the calling task and reads what
/// it did not hold there too, at once or (when more than `inline_max_keys`) a few
/// keys a turn; a lookup over `on_task_max_keys` hops as a whole.
/// Every path gives the answer of a store without a cache, key by key.
#[tokio::test]
async fn every_path_through_the_cache_answers_like_no_cache() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cached = open_with(
        &a,
        StoreOptions {
            inline_max_keys: 4,
            on_task_max_keys: 40,
            ..with_cache(1 << 20)
        },
    );
    let plain = open_with(&b, with_cache(0));
    let t = fresh();
    let cards: Vec<_> = (0..100)
        .filter(|i| i % 3 != 0)
        .map(|i| card_row(i, t, i % 4))
        .collect();
    let merchants: Vec<_> = (0..100)
        .filter(|i| i % 2 == 0)
        .map(|i| {
            merchant_row(
                &format!("m{i}"),
                t - i,
                i as f32 / 8.0,
                (i % 4 != 0).then_some(i),
            )
        })
        .collect();
    for s in [&cached, &plain] {
        s.write_rows("card", &cards, Durability::Buffered).unwrap();
        s.write_rows("merchant", &merchants, Durability::Buffered)
            .unwrap();
    }
    let lookup = |ids: &[i64]| {
        LookupRequest::new(["card:count", "merchant:tier", "card:country", "card:count"])
            .with_keys("card_id", KeyColumn::Int64(ids.to_vec()))
            .with_keys(
                "merchant_id",
                KeyColumn::String(ids.iter().map(|i| format!("m{i}")).collect()),
            )
    };
    // (keys, rows): 2 views, so keys = 2 x rows.
    let sizes: [&[i64]; 5] = [
        &[1, 2],                                // 4 keys: misses read inline
        &[5, 6, 7, 8, 9, 10],                   // 12 keys: misses read in turns
        &[5, 6, 7, 8, 9, 10, 11],               // mostly cached now: inline
        &[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], // 22 keys: some hits, misses in turns
        &[
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 99,
        ], // 44 keys: one hop
    ];
    for round in 0..2 {
        for ids in sizes {
            let want = plain.get_online_features(lookup(ids)).await.unwrap();
            let got = cached.get_online_features(lookup(ids)).await.unwrap();
            assert_eq!(got, want, "round {round}, rows {ids:?}");
        }
    }
    assert!(cached.cache_bytes() > 0);
    // A write in between: the next answers follow it on every path.
    let newer: Vec<_> = (0..30).map(|i| card_row(i, t + 1, 7)).collect();
    for s in [&cached, &plain] {
        s.write_rows("card", &newer, Durability::Buffered).unwrap();
    }
    for ids in sizes {
        let want = plain.get_online_features(lookup(ids)).await.unwrap();
        assert_eq!(cached.get_online_features(lookup(ids)).await.unwrap(), want);
    }
}

/// A caller that gives up on a lookup read in turns (its deadline passed) stops it
/// between turns: the lookup never finishes, so nothing it read enters the cache. (A
/// lookup on the blocking pool would read on, and cache, after its caller left.)
#[tokio::test]
async fn a_lookup_given_up_between_turns_stops_there() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(
        &dir,
        StoreOptions {
            inline_max_keys: 4,
            ..with_cache(1 << 20)
        },
    );
    let t = fresh();
    let rows: Vec<_> = (0..100).map(|i| card_row(i, t, 1)).collect();
    store
        .write_rows("card", &rows, Durability::Buffered)
        .unwrap();
    let req = || {
        LookupRequest::new(["card:count"])
            .with_keys("card_id", KeyColumn::Int64((0..100).collect()))
    };
    // Polled once, as a caller whose deadline passes at the lookup's first yield
    // polls it: the first turn reads, the lookup yields, and the caller drops it.
    {
        let mut lookup = std::pin::pin!(store.get_online_features(req()));
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(lookup.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "the lookup finished in one turn");
    }
    // Time for reads that went on elsewhere to finish, as a pool's would.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        store.cache_bytes(),
        0,
        "a lookup given up cached what it read"
    );
    let resp = store.get_online_features(req()).await.unwrap();
    assert_eq!(resp.rows, 100);
    assert!(
        store.cache_bytes() > 0,
        "a lookup that finished caches what it read"
    );
}
