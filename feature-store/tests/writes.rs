//! Writes over a real sled database: event-time order for push and ingest,
//! atomicity of rejected and interrupted batches, view evolution, and how opening
//! a locked or corrupt store fails.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::io::Write;
use std::sync::Arc;

use common::*;
use mesh_feature_store::{
    ingest_file, Durability, EntityKey, FeatureStore, FeatureStoreError, IngestOptions,
    OpenFailure, Row, StoreOptions, Value, ViewsConfig,
};

fn amount(store: &FeatureStore, id: i64) -> Option<(i64, Option<Value>)> {
    store
        .read_row("card", &EntityKey::Int64(id))
        .unwrap()
        .map(|r| (r.event_time, r.values[0].clone()))
}

both_backends!(fn push_never_overwrites_a_newer_row(env) {
    let store = env.open();
    let t = fresh();
    let w = store
        .write_rows("card", &[card_row(1, t, 4)], Durability::Buffered)
        .unwrap();
    assert_eq!((w.rows_written, w.rows_skipped_older), (1, 0));
    // Older: skipped.
    let w = store
        .write_rows("card", &[card_row(1, t - 1, 8)], Durability::Buffered)
        .unwrap();
    assert_eq!((w.rows_written, w.rows_skipped_older), (0, 1));
    assert_eq!(amount(&store, 1), Some((t, Some(Value::F32(3.0)))));
    // Equal time: the later write wins (replays are idempotent).
    store
        .write_rows("card", &[card_row(1, t, 6)], Durability::Buffered)
        .unwrap();
    assert_eq!(amount(&store, 1), Some((t, Some(Value::F32(4.0)))));
    // Newer: written.
    store
        .write_rows("card", &[card_row(1, t + 1, 10)], Durability::Sync)
        .unwrap();
    assert_eq!(amount(&store, 1), Some((t + 1, Some(Value::F32(6.0)))));
    // Within one batch, the newest row per key wins whatever its position.
    let w = store
        .write_rows(
            "card",
            &[
                card_row(2, t + 5, 2),
                card_row(2, t + 9, 4),
                card_row(2, t + 7, 8),
            ],
            Durability::Buffered,
        )
        .unwrap();
    assert_eq!((w.rows_written, w.rows_skipped_older), (1, 2));
    assert_eq!(amount(&store, 2), Some((t + 9, Some(Value::F32(4.0)))));
});

both_backends!(async fn concurrent_pushes_keep_the_newest(env) {
    // Many tasks push rows of the same keys with shuffled event times; whatever the
    // interleaving, each key ends with its newest row.
    let store = Arc::new(env.open());
    let t = fresh();
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..20i64 {
                let et = t + ((round * 8 + w) * 7919) % 160; // scrambled, distinct per (w, round)
                let rows = (0..10).map(|k| card_row(k, et, et - t)).collect();
                store
                    .push("card", rows, Durability::Buffered)
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let newest = (0..8i64)
        .flat_map(|w| (0..20i64).map(move |r| t + ((r * 8 + w) * 7919) % 160))
        .max()
        .unwrap();
    for k in 0..10 {
        let row = store
            .read_row("card", &EntityKey::Int64(k))
            .unwrap()
            .unwrap();
        assert_eq!(row.event_time, newest);
        assert_eq!(row.values[1], Some(Value::I64(k * 10 + (newest - t))));
    }
});

/// A large write does not hold readers up. sled's `apply_batch` would make every read
/// in the process wait until the whole batch is in (a lock of sled's, global to the
/// process), so a reader could never see part of a batch. The store writes a batch's
/// rows one at a time, in the batch's order: a reader that reads the first key of a
/// 10,000-row write and then the last sees the first already rewritten while the last
/// is not yet, which an atomic batch rules out.
#[test]
fn readers_run_alongside_a_large_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const N: i64 = 10_000; // max_rows_per_push
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let t = fresh();
    let rows: Vec<Row> = (0..N).map(|i| card_row(i, t, 0)).collect();
    store
        .write_rows("card", &rows, Durability::Buffered)
        .unwrap();
    let (writing, seen) = (AtomicBool::new(true), AtomicBool::new(false));
    let mut rounds = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            while writing.load(Ordering::Relaxed) {
                let (first, _) = amount(&store, 0).unwrap();
                let (last, _) = amount(&store, N - 1).unwrap();
                if first > last {
                    seen.store(true, Ordering::Relaxed);
                    return;
                }
            }
        });
        while rounds < 10 && !seen.load(Ordering::Relaxed) {
            rounds += 1;
            let rows: Vec<Row> = (0..N).map(|i| card_row(i, t + rounds, rounds)).collect();
            let w = store
                .write_rows("card", &rows, Durability::Buffered)
                .unwrap();
            assert_eq!(w.rows_written, N as u64);
        }
        writing.store(false, Ordering::Relaxed);
    });
    assert!(
        seen.load(Ordering::Relaxed),
        "in {rounds} writes of {N} rows, no read ever ran while one was applied"
    );
}

both_backends!(fn a_rejected_batch_writes_nothing(env) {
    let store = env.open();
    let t = fresh();
    let mut rows: Vec<Row> = (0..1000).map(|i| card_row(i, t, 1)).collect();
    rows[700].values[1] = Some(Value::F32(1.0)); // count is i64
    let e = store
        .write_rows("card", &rows, Durability::Sync)
        .unwrap_err();
    assert!(
        matches!(e, FeatureStoreError::InvalidArgument(ref m) if m.contains("row 700")),
        "{e}"
    );
    rows[700] = card_row(700, t, 1);
    rows[900].values[0] = Some(Value::F32(f32::NAN));
    assert!(store.write_rows("card", &rows, Durability::Sync).is_err());
    rows[900] = card_row(900, t, 1);
    rows[10].key = EntityKey::String("10".into());
    assert!(store.write_rows("card", &rows, Durability::Sync).is_err());
    rows[10].values.pop(); // wrong arity too
    assert!(store.write_rows("card", &rows, Durability::Sync).is_err());
    assert_eq!(store.scan_view("card").unwrap().count(), 0);
    assert!(matches!(
        store.write_rows("nope", &rows, Durability::Sync),
        Err(FeatureStoreError::UnknownView(_))
    ));
});

fn write_csv(path: &std::path::Path, rows: impl IntoIterator<Item = String>) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(
        f,
        "card_id,event_timestamp,amount,count,ratio,flag,country,emb,extra"
    )
    .unwrap();
    for r in rows {
        writeln!(f, "{r}").unwrap();
    }
}

both_backends!(fn csv_ingest_respects_event_time_and_stops_at_a_bad_row_between_batches(env) {
    let dir = &env.dir;
    let store = env.open();
    let t = fresh();
    // Stored first: key 1 newer than the file's, key 2 older.
    store
        .write_rows(
            "card",
            &[card_row(1, t + 1_000_000, 9), card_row(2, t - 1_000_000, 9)],
            Durability::Buffered,
        )
        .unwrap();
    let secs = |m: i64| format!("{}.{:06}", m / 1_000_000, m % 1_000_000);
    let path = dir.path().join("cards.csv");
    write_csv(
        &path,
        (1..=25)
            .map(|i| format!("{i},{},{}.5,{i},0.25,true,\"FR\",\"[1,2]\",x", secs(t), i))
            .chain([
                // Key 3 again, older: must not overwrite the row above; key 4 null amount.
                format!("3,{},99.0,0,0,false,US,,x", secs(t - 5_000_000)),
                format!("4,{},,4,,,,,x", secs(t + 2_000_000)),
            ]),
    );
    let opts = IngestOptions {
        batch_rows: 10,
        ..Default::default()
    };
    let report = ingest_file(&store, "card", &path, &opts).unwrap();
    assert_eq!(report.rows_read, 27);
    assert_eq!(report.batches, 3);
    assert_eq!(report.rows_skipped_older, 2); // key 1 (store newer) and the late key 3
    assert_eq!(report.ignored_columns, vec!["extra".to_owned()]);
    assert!(report.rows_per_sec > 0.0);
    assert_eq!(
        amount(&store, 1),
        Some((t + 1_000_000, Some(Value::F32(5.5))))
    );
    assert_eq!(amount(&store, 2), Some((t, Some(Value::F32(2.5)))));
    assert_eq!(amount(&store, 3), Some((t, Some(Value::F32(3.5)))));
    assert_eq!(amount(&store, 4), Some((t + 2_000_000, None)));
    let r25 = store
        .read_row("card", &EntityKey::Int64(25))
        .unwrap()
        .unwrap();
    assert_eq!(r25.values[4], Some(Value::String("FR".into())));
    assert_eq!(r25.values[5], Some(Value::F32Vector(vec![1.0, 2.0])));

    // A file whose line 16 (row 15) is bad: batch 1 (rows 1-10) is written, batch 2
    // (rows 11-20) is not, not even its first rows.
    let bad = dir.path().join("bad.csv");
    write_csv(
        &bad,
        (101..=120).map(|i| {
            let count = if i == 115 {
                "fifteen".to_owned()
            } else {
                i.to_string()
            };
            format!("{i},{},1.0,{count},0,true,US,,x", secs(t))
        }),
    );
    let e = ingest_file(&store, "card", &bad, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 16") && e.contains("count"), "{e}");
    assert!(amount(&store, 101).is_some() && amount(&store, 110).is_some());
    assert!((111..=120).all(|i| amount(&store, i).is_none()));
});

// The file is parsed on a reader thread while batches are written: a write that
// fails (here a row dated past the future-time horizon, in batch 2 of 4) stops the
// ingest with the write's own error, and nothing after that batch is written even
// though the reader had parsed ahead.
both_backends!(fn a_failed_write_stops_the_ingest_with_its_own_error(env) {
    let dir = &env.dir;
    let store = env.open();
    let t = fresh();
    let secs = |m: i64| format!("{}.{:06}", m / 1_000_000, m % 1_000_000);
    let path = dir.path().join("future.csv");
    write_csv(
        &path,
        (201..=240).map(|i| {
            let when = if i == 215 { t + 3_600_000_000 } else { t };
            format!("{i},{},1.0,{i},0,true,US,,x", secs(when))
        }),
    );
    let opts = IngestOptions {
        batch_rows: 10,
        ..Default::default()
    };
    let e = ingest_file(&store, "card", &path, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_future_skew"), "{e}");
    assert!((201..=210).all(|i| amount(&store, i).is_some()));
    assert!((211..=240).all(|i| amount(&store, i).is_none()));
});

both_backends!(fn csv_ingest_refuses_files_without_the_view_columns(env) {
    let dir = &env.dir;
    let store = env.open();
    let path = dir.path().join("short.csv");
    std::fs::write(
        &path,
        "card_id,event_timestamp,amount\n1,2024-05-01T00:00:00Z,1.0\n",
    )
    .unwrap();
    let e = ingest_file(&store, "card", &path, &IngestOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("count") && e.contains("allow_missing_columns"),
        "{e}"
    );
    let opts = IngestOptions {
        allow_missing_columns: true,
        ..Default::default()
    };
    let report = ingest_file(&store, "card", &path, &opts).unwrap();
    assert_eq!(report.missing_columns.len(), 5);
    let row = store
        .read_row("card", &EntityKey::Int64(1))
        .unwrap()
        .unwrap();
    assert_eq!(row.values[0], Some(Value::F32(1.0)));
    assert_eq!(row.values[1], None);
    let path = dir.path().join("nokey.csv");
    std::fs::write(&path, "id,event_timestamp\n1,0\n").unwrap();
    assert!(ingest_file(&store, "card", &path, &opts)
        .unwrap_err()
        .to_string()
        .contains("card_id"));
});

both_backends!(fn adding_a_feature_needs_no_rewrite_and_type_changes_are_refused(env) {
    let t = fresh();
    {
        let store = env.open();
        store
            .write_rows("card", &[card_row(1, t, 2)], Durability::Sync)
            .unwrap();
    }
    // Add a feature in the middle, drop "ratio".
    let evolved = VIEWS.replace(
        "{ name = \"ratio\", type = \"f64\" },",
        "{ name = \"velocity\", type = \"f32\" },",
    );
    let cfg = ViewsConfig::from_toml_str(&evolved).unwrap();
    {
        let store = env.try_open(&cfg, StoreOptions::default()).unwrap();
        let v = store.view("card").unwrap();
        let names: Vec<&str> = v.features.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["amount", "count", "velocity", "flag", "country", "emb"]
        );
        let row = store
            .read_row("card", &EntityKey::Int64(1))
            .unwrap()
            .unwrap();
        // Old data kept for the old features; the new one reads as null.
        assert_eq!(row.values[0], Some(Value::F32(2.0)));
        assert_eq!(row.values[2], None);
        assert_eq!(row.values[4], Some(Value::String("c2".into())));
        // The new feature's id is fresh: it is not ratio's.
        let ratio_id = 2;
        assert_ne!(v.features[2].id, ratio_id);
    }
    // Changing a live feature's type is refused, with the rebuild hint.
    let retyped = VIEWS.replace(
        "{ name = \"count\", type = \"i64\" }",
        "{ name = \"count\", type = \"f64\" }",
    );
    let e = env
        .try_open(
            &ViewsConfig::from_toml_str(&retyped).unwrap(),
            StoreOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(e, FeatureStoreError::RegistryConflict { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("rebuild"), "{e}");
    let rekeyed = VIEWS.replacen("key_type = \"int64\"", "key_type = \"string\"", 1);
    let e = env
        .try_open(
            &ViewsConfig::from_toml_str(&rekeyed).unwrap(),
            StoreOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(e, FeatureStoreError::RegistryConflict { .. }),
        "{e}"
    );
});

#[test]
fn a_locked_store_fails_to_open_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(&dir);
    let e = FeatureStore::open(dir.path().join("db"), &views()).unwrap_err();
    assert!(
        matches!(
            e,
            FeatureStoreError::Open {
                kind: OpenFailure::LockHeld,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("locked by another process") && msg.contains("mesh features ingest"),
        "{msg}"
    );
}

/// A store closed while another open of it waits (as sled's I/O threads may still hold
/// the lock for a moment after a close) opens once the lock is let go, instead of
/// failing with LockHeld at the first try.
#[test]
fn an_open_waits_briefly_for_a_lock_being_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(&dir);
    let (tx, rx) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(first);
    });
    tx.send(()).unwrap();
    let t0 = std::time::Instant::now();
    let second = FeatureStore::open(dir.path().join("db"), &views());
    closer.join().unwrap();
    let second = second.unwrap_or_else(|e| panic!("after {:?}: {e}", t0.elapsed()));
    assert!(t0.elapsed() >= std::time::Duration::from_millis(100));
    drop(second);
}

#[test]
fn a_corrupt_store_fails_to_open_with_a_message_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        let rows: Vec<Row> = (0..2000).map(|i| card_row(i, fresh(), 1)).collect();
        store.write_rows("card", &rows, Durability::Sync).unwrap();
    }
    // Overwrite every file of the database with garbage of the same size.
    for entry in walk(&dir.path().join("db")) {
        let len = std::fs::metadata(&entry).unwrap().len() as usize;
        let garbage: Vec<u8> = (0..len.max(64)).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&entry, garbage).unwrap();
    }
    let e = FeatureStore::open(dir.path().join("db"), &views()).unwrap_err();
    let msg = e.to_string();
    eprintln!("corrupt store: {msg}");
    assert!(matches!(e, FeatureStoreError::Open { .. }), "{msg}");
    assert!(
        msg.contains("To rebuild") && msg.contains("mesh features ingest"),
        "{msg}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

both_backends!(fn parquet_ingest_reads_arrow_types_and_keeps_the_newest(env) {
    use arrow_array::builder::{Float32Builder, ListBuilder};
    use arrow_array::{
        ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch,
        StringArray, TimestampMicrosecondArray,
    };

    let dir = &env.dir;
    let store = env.open();
    let t = fresh();
    let n = 50i64;
    // Keys 0..50 then keys 0..50 again, the second time half older and half newer.
    let ids: Vec<i64> = (0..n).chain(0..n).collect();
    let times: Vec<i64> = (0..n)
        .map(|_| t)
        .chain((0..n).map(|i| if i % 2 == 0 { t - 10 } else { t + 10 }))
        .collect();
    let amounts: Vec<Option<f32>> = (0..2 * n)
        .map(|i| {
            if i == 7 {
                None
            } else if i == 9 {
                Some(f32::NAN)
            } else {
                Some(i as f32)
            }
        })
        .collect();
    let mut emb = ListBuilder::new(Float32Builder::new());
    for i in 0..2 * n {
        emb.values().append_slice(&[i as f32, 1.0]);
        emb.append(true);
    }
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("card_id", Arc::new(Int64Array::from(ids))),
        (
            "event_timestamp",
            Arc::new(TimestampMicrosecondArray::from(times).with_timezone("UTC")),
        ),
        ("amount", Arc::new(Float32Array::from(amounts))),
        (
            "count",
            Arc::new(Int32Array::from_iter_values(
                (0..2 * n as i32).map(|i| i * 2),
            )),
        ),
        (
            "ratio",
            Arc::new(Float64Array::from_iter_values(
                (0..2 * n).map(|i| i as f64 / 8.0),
            )),
        ),
        (
            "flag",
            Arc::new(BooleanArray::from_iter(
                (0..2 * n).map(|i| Some(i % 3 == 0)),
            )),
        ),
        (
            "country",
            Arc::new(StringArray::from_iter_values(
                (0..2 * n).map(|i| format!("k{i}")),
            )),
        ),
        ("emb", Arc::new(emb.finish())),
    ];
    let batch = RecordBatch::try_from_iter(cols).unwrap();
    let path = dir.path().join("cards.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(30))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let opts = IngestOptions {
        batch_rows: 16,
        ..Default::default()
    };
    let report = ingest_file(&store, "card", &path, &opts).unwrap();
    assert_eq!(report.rows_read, 100);
    assert_eq!(report.rows_written + report.rows_skipped_older, 100);
    assert_eq!(report.rows_skipped_older, 25); // the older half of the second pass
    for i in 0..n {
        let row = store
            .read_row("card", &EntityKey::Int64(i))
            .unwrap()
            .unwrap();
        let src = if i % 2 == 0 { i } else { i + n }; // which source row must win
        assert_eq!(
            row.event_time,
            if i % 2 == 0 { t } else { t + 10 },
            "key {i}"
        );
        let want_amount = if src == 7 || src == 9 {
            None
        } else {
            Some(Value::F32(src as f32))
        };
        assert_eq!(row.values[0], want_amount, "key {i}");
        assert_eq!(row.values[1], Some(Value::I64(src * 2)));
        assert_eq!(row.values[2], Some(Value::F64(src as f64 / 8.0)));
        assert_eq!(row.values[3], Some(Value::Bool(src % 3 == 0)));
        assert_eq!(row.values[4], Some(Value::String(format!("k{src}"))));
        assert_eq!(row.values[5], Some(Value::F32Vector(vec![src as f32, 1.0])));
    }
});

#[test]
fn damaged_data_files_never_panic_on_open() {
    // The config file intact, the log and snapshots damaged in their middle: sled
    // may recover a prefix or refuse; either way opening returns, never panics.
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        for chunk in 0..5 {
            let rows: Vec<Row> = (0..2000)
                .map(|i| card_row(chunk * 2000 + i, fresh(), 1))
                .collect();
            store.write_rows("card", &rows, Durability::Sync).unwrap();
        }
    }
    for path in walk(&dir.path().join("db")) {
        if path.file_name().is_some_and(|n| n == "conf") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        for b in bytes.iter_mut().skip(mid).take(4096) {
            *b ^= 0x5a;
        }
        std::fs::write(&path, bytes).unwrap();
    }
    match FeatureStore::open(dir.path().join("db"), &views()) {
        Ok(store) => eprintln!(
            "sled recovered {} rows",
            store.scan_view("card").map(|it| it.count()).unwrap_or(0)
        ),
        Err(e) => {
            eprintln!("damaged store: {e}");
            assert!(
                matches!(
                    e,
                    FeatureStoreError::Open { .. } | FeatureStoreError::Storage(_)
                ),
                "{e}"
            );
        }
    }
}

both_backends!(fn future_event_times_are_refused_and_never_stored(env) {
    let dir = &env.dir;
    let store = env.open();
    let now = mesh_feature_store::now_micros();
    let hour = 3_600_000_000i64;
    // A century ahead, an hour ahead (past the default 5 min skew), and the largest
    // time there is: each refused whole, naming the row and the setting.
    for (i, far) in [now + 100 * 365 * 24 * hour, now + hour, i64::MAX]
        .into_iter()
        .enumerate()
    {
        let rows = [card_row(1, now - 1_000_000, 2), card_row(7, far, 4)];
        let e = store
            .write_rows("card", &rows, Durability::Buffered)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 1") && e.contains("max_future_skew"),
            "case {i}: {e}"
        );
        // Nothing of the write was stored, not even the good row before it.
        assert_eq!(amount(&store, 1), None, "case {i}");
        assert_eq!(amount(&store, 7), None, "case {i}");
    }
    // Within the skew (clocks of producers drift): accepted.
    let soon = now + 60_000_000;
    store
        .write_rows("card", &[card_row(7, soon, 4)], Durability::Buffered)
        .unwrap();
    assert_eq!(amount(&store, 7).map(|(t, _)| t), Some(soon));
    // And the key is not frozen: a later correct row still wins.
    store
        .write_rows("card", &[card_row(7, soon + 1, 6)], Durability::Buffered)
        .unwrap();
    assert_eq!(amount(&store, 7).map(|(t, _)| t), Some(soon + 1));

    // Ingest follows the same rule: the file's batch with the future row is refused.
    let path = dir.path().join("future.csv");
    let secs = |us: i64| format!("{}", us / 1_000_000);
    write_csv(
        &path,
        [
            format!("20,{},1.0,1,0,true,US,,x", secs(now - 1_000_000)),
            format!("21,{},1.0,1,0,true,US,,x", secs(now + 1000 * hour)),
        ],
    );
    let e = ingest_file(&store, "card", &path, &IngestOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_future_skew"), "{e}");
    assert_eq!(amount(&store, 21), None);
});
