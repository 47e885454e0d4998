//! The ingest file formats as feature-store/README.md documents them: the README's
//! sample CSV ingested verbatim (so the doc cannot drift from the reader), and the
//! timestamp unit of integer timestamps (flag/option and the view's
//! `timestamp_unit`), in CSV and Parquet.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use mesh_feature_store::{
    ingest_file, EntityKey, IngestOptions, StoreOptions, TimestampUnit, Value, ViewsConfig,
};

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The first fenced ```csv block after the README's "### Sample" heading.
fn readme_sample_csv() -> String {
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    let after = readme
        .split_once("### Sample")
        .expect("feature-store/README.md has a '### Sample' section")
        .1;
    let block = after
        .split_once("```csv\n")
        .expect("the Sample section has a ```csv block")
        .1;
    block.split_once("```").unwrap().0.to_owned()
}

/// 2025-11-30T10:53:20Z in Unix microseconds.
const T_2025: i64 = 1_764_500_000_000_000;

both_backends!(fn readme_sample_csv_ingests_as_documented(env) {
    let dir = &env.dir;
    let views = ViewsConfig::from_path(repo_file("../examples/features/views.toml")).unwrap();
    let store = env.try_open(&views, StoreOptions::default()).unwrap();
    let path = dir.path().join("merchants.csv");
    std::fs::write(&path, readme_sample_csv()).unwrap();
    let r = ingest_file(&store, "merchant", &path, &IngestOptions::default()).unwrap();
    assert_eq!((r.rows_read, r.rows_written), (4, 4), "{r:?}");
    assert_eq!(r.ignored_columns, vec!["source_system".to_owned()]);

    let row = |k: &str| {
        store
            .read_row("merchant", &EntityKey::String(k.into()))
            .unwrap()
            .unwrap()
    };
    // chargeback_rate_90d, refund_rate_30d, txn_count_24h, avg_ticket_30d,
    // risk_tier, is_high_risk_mcc.
    let m1 = row("m000001");
    assert_eq!(m1.event_time, T_2025);
    assert_eq!(
        m1.values,
        vec![
            Some(Value::F32(0.002)),
            Some(Value::F32(0.01)),
            Some(Value::I64(340)),
            Some(Value::F32(42.5)),
            Some(Value::I64(1)),
            Some(Value::Bool(false)),
        ]
    );
    let m2 = row("m000002");
    assert_eq!(m2.event_time, T_2025, "+01:00 offset");
    assert_eq!(m2.values[1], None);
    assert_eq!(m2.values[5], Some(Value::Bool(true)));
    let m3 = row("m000003");
    assert_eq!(m3.event_time, T_2025, "Unix seconds");
    assert_eq!(
        (&m3.values[0], &m3.values[3], &m3.values[5]),
        (&None, &None, &None)
    );
    assert_eq!(m3.values[2], Some(Value::I64(0)));
    let m4 = row("m000004");
    assert_eq!(m4.event_time, T_2025 + 250_000, "fractional seconds");
    assert_eq!(m4.values[0], None, "NaN is null");
    assert_eq!(m4.values[4], None);
    assert_eq!(m4.values[5], Some(Value::Bool(false)), "0 is false");
});

fn card_csv(dir: &tempfile::TempDir, ts: &str) -> PathBuf {
    let path = dir.path().join(format!("cards-{ts}.csv"));
    std::fs::write(
        &path,
        format!(
            "card_id,event_timestamp,amount,count,ratio,flag,country,emb\n\
             1,{ts},1.5,2,0.25,true,US,\"[1.0, 2.0]\"\n"
        ),
    )
    .unwrap();
    path
}

both_backends!(fn millisecond_timestamps_need_their_unit(env) {
    let dir = &env.dir;
    let store = env.open();
    let path = card_csv(dir, "1764500000000");

    // Read as seconds (the default) it is ~year 57,900: refused by the future
    // horizon, nothing stored.
    let e = ingest_file(&store, "card", &path, &IngestOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_future_skew"), "{e}");
    assert!(store
        .read_row("card", &EntityKey::Int64(1))
        .unwrap()
        .is_none());

    // With the unit, it lands in 2025.
    let opts = IngestOptions {
        timestamp_unit: TimestampUnit::Millis,
        ..Default::default()
    };
    let r = ingest_file(&store, "card", &path, &opts).unwrap();
    assert_eq!(r.rows_written, 1);
    let row = store
        .read_row("card", &EntityKey::Int64(1))
        .unwrap()
        .unwrap();
    assert_eq!(row.event_time, T_2025);
    let year = 1970 + row.event_time / 1_000_000 / 31_556_952; // mean Gregorian year
    assert_eq!(year, 2025);

    // Microseconds too; RFC 3339 text ignores the unit.
    let opts = IngestOptions {
        timestamp_unit: TimestampUnit::Micros,
        ..Default::default()
    };
    ingest_file(&store, "card", card_csv(dir, "1764500000000001"), &opts).unwrap();
    ingest_file(
        &store,
        "card",
        card_csv(dir, "2025-11-30T10:53:20.000002Z"),
        &opts,
    )
    .unwrap();
    let row = store
        .read_row("card", &EntityKey::Int64(1))
        .unwrap()
        .unwrap();
    assert_eq!(row.event_time, T_2025 + 2);
});

#[test]
fn views_file_declares_the_timestamp_unit() {
    let with_unit = |unit: &str| {
        VIEWS.replacen(
            "name = \"card\"\nentity = \"card\"\nmax_age = \"1h\"\n",
            &format!(
                "name = \"card\"\nentity = \"card\"\nmax_age = \"1h\"\ntimestamp_unit = {unit}\n"
            ),
            1,
        )
    };
    let v = ViewsConfig::from_toml_str(&with_unit("\"ms\"")).unwrap();
    assert_eq!(
        v.view("card").unwrap().timestamp_unit,
        TimestampUnit::Millis
    );
    assert_eq!(
        v.view("merchant").unwrap().timestamp_unit,
        TimestampUnit::Seconds
    );
    assert_eq!(
        ViewsConfig::from_toml_str(&with_unit("\"us\""))
            .unwrap()
            .view("card")
            .unwrap()
            .timestamp_unit,
        TimestampUnit::Micros
    );
    let e = ViewsConfig::from_toml_str(&with_unit("\"ns\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("timestamp_unit") || e.contains("ns"), "{e}");
    assert_eq!("ms".parse::<TimestampUnit>(), Ok(TimestampUnit::Millis));
    assert!("sec".parse::<TimestampUnit>().is_err());
}

both_backends!(fn parquet_integer_and_float_timestamps_take_the_unit(env) {
    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};

    let dir = &env.dir;
    let store = env.open();
    let write = |name: &str, ts: ArrayRef| {
        let cols: Vec<(&str, ArrayRef)> = vec![
            (
                "merchant_id",
                Arc::new(arrow_array::StringArray::from(vec!["a", "b"])),
            ),
            ("event_timestamp", ts),
            (
                "rate",
                Arc::new(arrow_array::Float32Array::from(vec![0.5, 0.25])),
            ),
            ("tier", Arc::new(Int64Array::from(vec![1, 2]))),
        ];
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let path = dir.path().join(name);
        let file = std::fs::File::create(&path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    };
    let ms = write(
        "ms.parquet",
        Arc::new(Int64Array::from(vec![1_764_500_000_000, 1_764_500_000_001])),
    );
    let e = ingest_file(&store, "merchant", &ms, &IngestOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_future_skew"), "{e}");
    let opts = IngestOptions {
        timestamp_unit: TimestampUnit::Millis,
        ..Default::default()
    };
    assert_eq!(
        ingest_file(&store, "merchant", &ms, &opts)
            .unwrap()
            .rows_written,
        2
    );
    let t = |k: &str| {
        store
            .read_row("merchant", &EntityKey::String(k.into()))
            .unwrap()
            .unwrap()
            .event_time
    };
    assert_eq!((t("a"), t("b")), (T_2025, T_2025 + 1000));

    let secs = write(
        "secs.parquet",
        Arc::new(Float64Array::from(vec![1_764_500_001.5, 1_764_500_002.0])),
    );
    ingest_file(&store, "merchant", &secs, &IngestOptions::default()).unwrap();
    assert_eq!((t("a"), t("b")), (T_2025 + 1_500_000, T_2025 + 2_000_000));
});
