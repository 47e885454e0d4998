//! Lookup, push and ingest figures for the README (not a criterion bench: the
//! figures wanted are tail latencies under a concurrent writer, which criterion
//! does not report).
//!
//! cargo bench -p mesh-feature-store --bench lookup -- [--entities N] [--seconds S] [--db DIR] [--skip-grpc] [--cache-ab] [--writer-batch ROWS] [--writer-rate ROWS_PER_S]
//!
//! A value out of range (N 1 to 100,000,000; S more than 0, at most 3,600; ROWS 1 to
//! 1,000; ROWS_PER_S 1 to 100,000) stops the bench, naming the flag: a run never
//! measures something other than what was asked.
//!
//! 1. Loads N entities x 16 f32 features from a generated Parquet file with
//!    `ingest_file` (rows/s), and ingests a 200k-row CSV (rows/s). With `--db`, an
//!    already loaded store is reused.
//! 2. In process: 2 concurrent readers doing lookups of 1, 10, 100, 1000 random
//!    keys while 1 writer pushes 1,000 rows/s (`--writer-rate`), 10 rows a push
//!    (`--writer-batch`); p50/p99/p99.9. Repeated for each
//!    fetch strategy (key order: up to 128 keys on the calling task, sled read 16
//!    keys a turn; parallel on 2 blocking tasks) and for the blocking call on the
//!    reader thread (no runtime at all), for reference; then with every read hopping
//!    to the blocking pool (`inline_max_keys = 0`, as key order did before it read in
//!    turns) at 1, 10 and 100 keys.
//!    The store runs with its default row cache (none), then with one that holds
//!    every entity (as Redis holds every key in memory), then with none again.
//!    With `--cache-ab`, only this: 100 keys in process and over gRPC with a row
//!    cache of a quarter of the entities, then with none, twice, alternating.
//! 3. Over gRPC (server and clients in this process, on 127.0.0.1): 8 concurrent
//!    callers, 10 and 100 keys per call, same writer; throughput and p50/p99. The
//!    callers' decoding shares the server's runtime and cores here: for the
//!    comparison with Redis, `bench/features_compare.sh` drives `mesh serve --role
//!    features` from another process (`mesh bench --target lookup`). With
//!    every entity cached, 100 keys also with `event_times_per_view` (each view's
//!    event times once instead of in each of the 16 columns).
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use hdrhistogram::Histogram;
use mesh_feature_store::service::FeatureStoreService;
use mesh_feature_store::{
    ingest_file, now_micros, Durability, EntityKey, FeatureStore, FetchStrategy, IngestOptions,
    KeyColumn, Limits, LookupRequest, Row, StoreOptions, Value, DEFAULT_INLINE_MAX_KEYS,
    DEFAULT_ROW_CACHE_MAX_BYTES,
};
use mesh_proto::mesh::v1 as pb;
use rand::Rng;

mod common;
use common::{views, FEATURES};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    entities: i64,
    seconds: f64,
    db: Option<PathBuf>,
    skip_grpc: bool,
    cache_ab: bool,
    /// Rows in each of the writer's pushes.
    writer_batch: usize,
    /// Rows the writer pushes a second.
    writer_rate: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        entities: 1_000_000,
        seconds: 5.0,
        db: None,
        skip_grpc: false,
        cache_ab: false,
        writer_batch: 10,
        writer_rate: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--entities" => a.entities = i64::try_from(count(it.next(), x.as_str(), 100_000_000)?)?,
            "--seconds" => a.seconds = seconds(it.next(), x.as_str())?,
            "--db" => a.db = it.next().map(PathBuf::from),
            "--skip-grpc" => a.skip_grpc = true,
            "--cache-ab" => a.cache_ab = true,
            "--writer-batch" => a.writer_batch = count(it.next(), x.as_str(), 1_000)?,
            "--writer-rate" => a.writer_rate = count(it.next(), x.as_str(), 100_000)?,
            _ => {} // cargo bench passes --bench
        }
    }
    Ok(a)
}

/// The value of `flag`: a whole number from 1 to `max`.
fn count(value: Option<String>, flag: &str, max: usize) -> Result<usize> {
    match value.as_deref().map(|v| (v, v.parse::<usize>())) {
        Some((_, Ok(n))) if (1..=max).contains(&n) => Ok(n),
        Some((v, _)) => anyhow::bail!("{flag} takes a whole number from 1 to {max}, not {v:?}"),
        None => anyhow::bail!("{flag} takes a whole number from 1 to {max}, and none was given"),
    }
}

/// The value of `flag`: seconds, more than 0 and at most an hour.
fn seconds(value: Option<String>, flag: &str) -> Result<f64> {
    match value.as_deref().map(|v| (v, v.parse::<f64>())) {
        Some((_, Ok(s))) if s > 0.0 && s <= 3600.0 => Ok(s),
        Some((v, _)) => {
            anyhow::bail!("{flag} takes seconds, more than 0 and at most 3600, not {v:?}")
        }
        None => {
            anyhow::bail!("{flag} takes seconds, more than 0 and at most 3600, and none was given")
        }
    }
}

fn write_parquet(path: &Path, n: i64) -> Result<()> {
    let file = std::fs::File::create(path)?;
    let now = now_micros();
    let mut writer = None;
    let chunk = 100_000i64;
    let mut start = 0;
    while start < n {
        let end = (start + chunk).min(n);
        let mut cols: Vec<(String, ArrayRef)> = vec![
            (
                "entity_id".into(),
                Arc::new(Int64Array::from_iter_values(start..end)),
            ),
            (
                "event_timestamp".into(),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    (start..end).map(|_| now),
                )),
            ),
        ];
        for f in 0..FEATURES {
            let vals = (start..end).map(|i| (i % 1000) as f32 + f as f32);
            cols.push((
                format!("f{f}"),
                Arc::new(Float32Array::from_iter_values(vals)),
            ));
        }
        let batch = RecordBatch::try_from_iter(cols)?;
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(parquet::arrow::ArrowWriter::try_new(
                file.try_clone()?,
                batch.schema(),
                None,
            )?),
        };
        w.write(&batch)?;
        start = end;
    }
    if let Some(w) = writer {
        w.close()?;
    }
    Ok(())
}

fn write_csv(path: &Path, n: i64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let head: Vec<String> = (0..FEATURES).map(|i| format!("f{i}")).collect();
    writeln!(f, "entity_id,event_timestamp,{}", head.join(","))?;
    let now = now_micros() / 1_000_000;
    for i in 0..n {
        write!(f, "{i},{now}")?;
        for j in 0..FEATURES {
            write!(f, ",{}.25", (i + j as i64) % 1000)?;
        }
        writeln!(f)?;
    }
    Ok(())
}

fn pct(h: &Histogram<u64>, q: f64) -> String {
    format!("{:.0}", h.value_at_quantile(q) as f64 / 1000.0)
}

/// Pushes `rate` rows/s of random keys, `batch` rows a push (at 1,000 rows/s, 10: a
/// push every 10 ms; 1,000: one a second), until `stop`.
fn spawn_writer(
    store: FeatureStore,
    entities: i64,
    (batch, rate): (usize, usize),
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let period = Duration::from_secs_f64(batch as f64 / rate as f64);
        let mut tick = tokio::time::interval(period);
        let mut written = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let rows: Vec<Row> = {
                let mut rng = rand::rng();
                (0..batch)
                    .map(|_| Row {
                        key: EntityKey::Int64(rng.random_range(0..entities)),
                        event_time: now_micros(),
                        values: (0..FEATURES).map(|f| Some(Value::F32(f as f32))).collect(),
                    })
                    .collect()
            };
            if let Ok(w) = store.push("bench", rows, Durability::Buffered).await {
                written += w.rows_written;
            }
        }
        written
    })
}

fn random_keys(n: usize, entities: i64) -> KeyColumn {
    let mut rng = rand::rng();
    KeyColumn::Int64((0..n).map(|_| rng.random_range(0..entities)).collect())
}

fn features() -> Vec<String> {
    (0..FEATURES).map(|i| format!("bench:f{i}")).collect()
}

async fn in_process(
    store: &FeatureStore,
    label: &str,
    keys: usize,
    a: &Args,
    blocking: bool,
) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(
        store.clone(),
        a.entities,
        (a.writer_batch, a.writer_rate),
        stop.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut readers = Vec::new();
    for _ in 0..2 {
        let store = store.clone();
        let entities = a.entities;
        readers.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
            while Instant::now() < deadline {
                let req = LookupRequest {
                    features: features().into(),
                    entities: vec![("entity_id".into(), random_keys(keys, entities))],
                };
                let t = Instant::now();
                let resp = if blocking {
                    let s = store.clone();
                    // Measured around the call only: the runtime hop is what the
                    // blocking variant leaves out.
                    tokio::task::block_in_place(|| {
                        s.get_online_features_blocking(&req, now_micros())
                    })
                } else {
                    store.get_online_features(req).await
                };
                h.record(t.elapsed().as_nanos() as u64).ok();
                assert_eq!(resp.map(|r| r.rows).unwrap_or(0), keys);
            }
            h
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for r in readers {
        h.add(r.await?)?;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await?;
    println!(
        "in-process {label:<22} keys={keys:<5} lookups/s={:<8.0} p50={:>5}us p99={:>5}us p99.9={:>6}us max={:>6}us  (writer: {:.0} rows/s)",
        h.len() as f64 / a.seconds,
        pct(&h, 0.5),
        pct(&h, 0.99),
        pct(&h, 0.999),
        h.max() / 1000,
        written as f64 / a.seconds
    );
    Ok(())
}

/// `per_view`: the callers ask for each view's event times once
/// (`event_times_per_view`) instead of in every column.
async fn grpc(store: &FeatureStore, keys: usize, a: &Args, per_view: bool) -> Result<()> {
    let svc = FeatureStoreService::new(Arc::new(store.clone()), Limits::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            // TCP_NODELAY on accepted connections: without it, Nagle plus delayed ACKs
            // add ~40 ms to small responses.
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(
        store.clone(),
        a.entities,
        (a.writer_batch, a.writer_rate),
        stop.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut callers = Vec::new();
    for _ in 0..8 {
        let mut client = pb::feature_store_client::FeatureStoreClient::new(channel.clone());
        let entities = a.entities;
        callers.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
            while Instant::now() < deadline {
                let KeyColumn::Int64(ks) = random_keys(keys, entities) else {
                    unreachable!()
                };
                let req = pb::GetOnlineFeaturesRequest {
                    features: features(),
                    entities: vec![pb::EntityKeyColumn {
                        join_key: "entity_id".into(),
                        int64_keys: ks,
                        string_keys: vec![],
                    }],
                    event_times_per_view: per_view,
                };
                let t = Instant::now();
                let r = client.get_online_features(req).await;
                h.record(t.elapsed().as_nanos() as u64).ok();
                let shape = r.map(|r| {
                    let r = r.into_inner();
                    (r.columns.len(), r.view_event_times.len())
                });
                assert_eq!(shape.ok(), Some((FEATURES, usize::from(per_view))));
            }
            h
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for c in callers {
        h.add(c.await?)?;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await?;
    server.abort();
    let times = if per_view { "per view" } else { "per column" };
    println!(
        "grpc c=8 keys={keys:<4} calls/s={:<7.0} keys/s={:<8.0} p50={:>5}us p99={:>5}us p99.9={:>6}us  (event times {times})",
        h.len() as f64 / a.seconds,
        h.len() as f64 * keys as f64 / a.seconds,
        pct(&h, 0.5),
        pct(&h, 0.99),
        pct(&h, 0.999)
    );
    Ok(())
}

fn open(path: &Path, fetch: FetchStrategy, inline_max_keys: usize) -> Result<FeatureStore> {
    open_with(
        path,
        StoreOptions {
            fetch,
            inline_max_keys,
            ..Default::default()
        },
    )
}

fn with_row_cache(bytes: usize) -> StoreOptions {
    StoreOptions {
        row_cache_max_bytes: bytes,
        ..Default::default()
    }
}

fn open_with(path: &Path, options: StoreOptions) -> Result<FeatureStore> {
    // A reopen waits for the previous handle's last clones (aborted server tasks)
    // to drop and release sled's lock.
    let mut tries = 0;
    loop {
        match FeatureStore::open_with(path, &views()?, options.clone()) {
            Err(mesh_feature_store::FeatureStoreError::Open {
                kind: mesh_feature_store::OpenFailure::LockHeld,
                ..
            }) if tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return Ok(other?),
        }
    }
}

/// A row cache of about a quarter of the default 1M entities.
const ROW_CACHE_QUARTER: usize = 64 << 20;

/// The row cache that holds every entity of the default 1M: about 270 bytes an
/// entry (16 f32 and the event time, the key, bookkeeping).
const ROW_CACHE_ALL: usize = 384 << 20;

/// One lookup of 1,000 keys after another over every entity.
fn fill_row_cache(store: &FeatureStore, entities: i64) -> Result<()> {
    let mut start = 0;
    while start < entities {
        let end = (start + 1_000).min(entities);
        let req = LookupRequest {
            features: features().into(),
            entities: vec![("entity_id".into(), KeyColumn::Int64((start..end).collect()))],
        };
        store.get_online_features_blocking(&req, now_micros())?;
        start = end;
    }
    Ok(())
}

/// Quiet reference: one thread, no writer, no runtime hop: the intrinsic cost.
fn quiet(store: &FeatureStore, keys: usize, a: &Args) -> Result<()> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds.min(3.0));
    tokio::task::block_in_place(|| {
        while Instant::now() < deadline {
            let req = LookupRequest {
                features: features().into(),
                entities: vec![("entity_id".into(), random_keys(keys, a.entities))],
            };
            let t = Instant::now();
            let r = store.get_online_features_blocking(&req, now_micros());
            h.record(t.elapsed().as_nanos() as u64).ok();
            assert!(r.is_ok());
        }
    });
    println!(
        "quiet 1 thread, no writer          keys={keys:<5} p50={:>5}us p99={:>5}us p99.9={:>6}us",
        pct(&h, 0.5),
        pct(&h, 0.99),
        pct(&h, 0.999)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    // As every `mesh` process runs: without transparent huge pages (README "Allocator").
    rustix::thread::disable_transparent_huge_pages(true)?;
    let a = args()?;
    let tmp = tempfile::tempdir()?;
    let db = a.db.clone().unwrap_or_else(|| tmp.path().join("db"));
    let loaded = db.exists();
    println!(
        "cores={} entities={} features={FEATURES} x f32, {} s per figure",
        std::thread::available_parallelism()?,
        a.entities,
        a.seconds
    );
    if a.cache_ab {
        anyhow::ensure!(
            loaded,
            "--cache-ab reads a loaded store: run once with --db DIR, then with --db DIR --cache-ab"
        );
        for _ in 0..2 {
            for bytes in [ROW_CACHE_QUARTER, 0] {
                let store = open_with(&db, with_row_cache(bytes))?;
                tokio::task::block_in_place(|| store.scan_view("bench").map(|it| it.count()))?;
                println!("row cache {} MiB", bytes >> 20);
                quiet(&store, 100, &a)?;
                in_process(&store, "key-order", 100, &a, false).await?;
                if !a.skip_grpc {
                    grpc(&store, 100, &a, false).await?;
                }
                println!("  held {} MB", store.cache_bytes() / 1_000_000);
            }
        }
        return Ok(());
    }
    {
        let store = open(&db, FetchStrategy::KeyOrder, DEFAULT_INLINE_MAX_KEYS)?;
        if !loaded {
            let pq = tmp.path().join("bench.parquet");
            write_parquet(&pq, a.entities)?;
            let r = tokio::task::block_in_place(|| {
                ingest_file(&store, "bench", &pq, &IngestOptions::default())
            })?;
            println!(
                "ingest parquet: {} rows in {:.1} s = {:.0} rows/s",
                r.rows_read,
                r.elapsed.as_secs_f64(),
                r.rows_per_sec
            );
            let csv = tmp.path().join("bench.csv");
            write_csv(&csv, 200_000)?;
            let r = tokio::task::block_in_place(|| {
                ingest_file(&store, "bench", &csv, &IngestOptions::default())
            })?;
            println!(
                "ingest csv:     {} rows in {:.1} s = {:.0} rows/s",
                r.rows_read,
                r.elapsed.as_secs_f64(),
                r.rows_per_sec
            );
        }
        println!(
            "store size on disk: {} MB",
            store.size_on_disk()? / 1_000_000
        );
        // Warm sled's cache: one pass over the view.
        let t = Instant::now();
        let n = tokio::task::block_in_place(|| store.scan_view("bench").map(|it| it.count()))?;
        println!(
            "warm-up scan: {n} rows in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        println!(
            "row cache: {} MiB (the default)",
            DEFAULT_ROW_CACHE_MAX_BYTES >> 20
        );
        for keys in [1, 100] {
            quiet(&store, keys, &a)?;
        }
        for keys in [1, 10, 100, 1000] {
            in_process(&store, "key-order (default)", keys, &a, false).await?;
        }
        for keys in [10, 100, 1000] {
            in_process(&store, "blocking, no hop", keys, &a, true).await?;
        }
        if !a.skip_grpc {
            for keys in [10, 100] {
                grpc(&store, keys, &a, false).await?;
            }
        }
    }
    let par = FetchStrategy::Parallel {
        tasks: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        min_keys: 1,
    };
    {
        let store = open(&db, par, DEFAULT_INLINE_MAX_KEYS)?;
        tokio::task::block_in_place(|| store.scan_view("bench").map(|it| it.count()))?;
        for keys in [10, 100, 1000] {
            in_process(&store, "parallel x2", keys, &a, false).await?;
        }
    }
    // The row cache sized for the whole working set, as Redis holds every key in
    // memory; filled by one pass of lookups over every entity.
    {
        let store = open_with(&db, with_row_cache(ROW_CACHE_ALL))?;
        let t = Instant::now();
        tokio::task::block_in_place(|| fill_row_cache(&store, a.entities))?;
        println!(
            "row cache: {} MiB, filled by lookups of every entity in {:.1} s: holds {} MB",
            ROW_CACHE_ALL >> 20,
            t.elapsed().as_secs_f64(),
            store.cache_bytes() / 1_000_000
        );
        quiet(&store, 100, &a)?;
        in_process(&store, "key-order, all cached", 100, &a, false).await?;
        if !a.skip_grpc {
            grpc(&store, 10, &a, true).await?;
            grpc(&store, 100, &a, false).await?;
            grpc(&store, 100, &a, true).await?;
        }
    }
    // The baseline of the row cache: every key read from sled.
    {
        let store = open_with(&db, with_row_cache(0))?;
        tokio::task::block_in_place(|| store.scan_view("bench").map(|it| it.count()))?;
        println!("row cache: off");
        quiet(&store, 100, &a)?;
        if !a.skip_grpc {
            grpc(&store, 100, &a, false).await?;
        }
    }
    // The baseline of the inline path: every lookup hops to the blocking pool (at
    // 100 keys, the baseline of reading in turns on the calling task).
    let store = open(&db, FetchStrategy::KeyOrder, 0)?;
    tokio::task::block_in_place(|| store.scan_view("bench").map(|it| it.count()))?;
    for keys in [1, 10, 100] {
        in_process(&store, "every lookup hops", keys, &a, false).await?;
    }
    if !a.skip_grpc {
        grpc(&store, 10, &a, false).await?;
    }
    Ok(())
}
