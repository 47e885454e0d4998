//! 100-key lookups on each backend, in one run, next to a raw Redis baseline
//! (not a criterion bench: the figures wanted are percentiles side by side).
//!
//! cargo bench -p mesh-feature-store --bench backends -- [--entities N] [--lookups L]
//!
//! Starts its own `redis-server` (one server) and a 3-master Redis Cluster on
//! loopback (Debian's redis-server/redis-tools), loads N entities x 16 f32
//! features into sled (temp dir), the server and the cluster, then times L
//! sequential lookups of 100 random keys (one caller) per line:
//! - sled, in process;
//! - Redis server and Redis cluster with the cache off (every lookup is one
//!   batched round trip: one pipeline, or one per master);
//! - Redis server with the cache on and warm (every key a hit);
//! - baselines on the same server: `redis-benchmark` running MGET of 100 keys
//!   holding the same encoded rows (one client, no pipelining), and the same 100
//!   HGETs pipelined through the `redis` crate alone (no store code).
//!
//! Prints one table: p50, p99, p99.9 (µs) and lookups/s.
#![allow(clippy::unwrap_used)]

#[path = "../tests/common/redis.rs"]
mod redis_server;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use mesh_feature_store::{
    now_micros, Durability, EntityKey, FeatureStore, KeyColumn, LookupRequest, RedisOptions,
    RedisTarget, Row, StoreOptions, Value,
};
use rand::Rng;

mod common;
use common::{views, FEATURES};

const KEYS: usize = 100;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load(store: &FeatureStore, n: i64) -> Result<Duration> {
    let start = Instant::now();
    let t = now_micros() - 60_000_000;
    let mut rng = rand::rng();
    let mut batch = Vec::with_capacity(10_000);
    for i in 1..=n {
        batch.push(Row {
            key: EntityKey::Int64(i),
            event_time: t,
            values: (0..FEATURES)
                .map(|_| Some(Value::F32(rng.random_range(0.0..100.0))))
                .collect(),
        });
        if batch.len() == 10_000 {
            store.write_rows("bench", &batch, Durability::Buffered)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        store.write_rows("bench", &batch, Durability::Buffered)?;
    }
    store.flush()?;
    Ok(start.elapsed())
}

fn random_keys(n: i64) -> Vec<i64> {
    let mut rng = rand::rng();
    (0..KEYS).map(|_| rng.random_range(1..=n)).collect()
}

struct Line {
    name: String,
    hist: Histogram<u64>,
    per_sec: f64,
}

fn line(name: &str, hist: Histogram<u64>, elapsed: Duration) -> Line {
    let per_sec = hist.len() as f64 / elapsed.as_secs_f64();
    Line {
        name: name.to_owned(),
        hist,
        per_sec,
    }
}

async fn time_store(name: &str, store: &FeatureStore, n: i64, lookups: usize) -> Result<Line> {
    for _ in 0..lookups / 10 {
        let req = LookupRequest::new(["bench:*"])
            .with_keys("entity_id", KeyColumn::Int64(random_keys(n)));
        store.get_online_features(req).await?;
    }
    let mut hist = Histogram::<u64>::new(3)?;
    let start = Instant::now();
    for _ in 0..lookups {
        let req = LookupRequest::new(["bench:*"])
            .with_keys("entity_id", KeyColumn::Int64(random_keys(n)));
        let t = Instant::now();
        let resp = store.get_online_features(req).await?;
        hist.record(t.elapsed().as_micros() as u64)?;
        anyhow::ensure!(resp.degraded.is_none(), "{name}: degraded lookup");
    }
    Ok(line(name, hist, start.elapsed()))
}

/// The same 100 HGETs per lookup, pipelined through the `redis` crate alone.
async fn time_raw_pipeline(url: &str, view_id: u32, n: i64, lookups: usize) -> Result<Line> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut hist = Histogram::<u64>::new(3)?;
    let start = Instant::now();
    for _ in 0..lookups {
        let mut pipe = redis::pipe();
        for k in random_keys(n) {
            pipe.cmd("HGET")
                .arg(format!("mesh:{view_id}:{{i{k}}}"))
                .arg("v");
        }
        let t = Instant::now();
        let _: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        hist.record(t.elapsed().as_micros() as u64)?;
    }
    Ok(line(
        "raw: 100 HGET pipelined (redis crate only)",
        hist,
        start.elapsed(),
    ))
}

/// `redis-benchmark` running MGET of 100 string keys holding the same encoded
/// rows (copied from 100 stored hashes), one client, no pipelining.
fn redis_benchmark_mget(port: u16, view_id: u32, lookups: usize) -> Result<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection()?;
    let mut keys = Vec::with_capacity(KEYS);
    for k in 1..=KEYS as i64 {
        let v: Vec<u8> = redis::cmd("HGET")
            .arg(format!("mesh:{view_id}:{{i{k}}}"))
            .arg("v")
            .query(&mut conn)?;
        let copy = format!("bench:mget:{k}");
        let _: () = redis::cmd("SET").arg(&copy).arg(v).query(&mut conn)?;
        keys.push(copy);
    }
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            "1",
            "-n",
            &lookups.to_string(),
        ])
        .args(["--csv", "MGET"])
        .args(&keys)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "redis-benchmark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = text
        .lines()
        .rfind(|l| l.starts_with("\"MGET"))
        .ok_or_else(|| anyhow::anyhow!("no MGET line in redis-benchmark output: {text}"))?;
    let f: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|c| c.trim_matches('"').parse().ok())
        .collect();
    anyhow::ensure!(f.len() >= 7, "unexpected redis-benchmark line: {row}");
    Ok(format!(
        "| {:<52} | {:>7.0} | {:>7.0} | {:>7} | {:>9.0} |",
        "raw: redis-benchmark MGET 100 keys (same bytes)",
        f[3] * 1000.0,
        f[5] * 1000.0,
        "-",
        f[0]
    ))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n = arg("--entities", 100_000) as i64;
    let lookups = arg("--lookups", 5_000);
    let views = views()?;
    println!("== {n} entities x {FEATURES} f32; {lookups} sequential lookups of {KEYS} random keys per line");

    let dir = tempfile::tempdir()?;
    let sled = FeatureStore::open(dir.path().join("db"), &views)?;
    let took = load(&sled, n)?;
    println!("loaded sled in {took:.1?}");

    let server = redis_server::RedisServer::start();
    let opts = |target: RedisTarget, cache: bool| {
        let mut o = RedisOptions::new(target);
        o.lookup_budget = Duration::from_secs(1);
        if cache {
            o.cache_max_age = Duration::from_secs(3600);
            // Room for every entity (a decoded row of 16 f32 is estimated at about
            // 650 bytes): the default 64 MiB held about half of 200k, and the
            // line said "all hits" of a cache that sent half of its keys to Redis.
            o.cache_max_bytes = n as usize * 1024;
        } else {
            o.cache_max_bytes = 0;
        }
        o
    };
    let redis_plain = FeatureStore::open_redis(
        &views,
        opts(RedisTarget::Server(server.url()), false),
        StoreOptions::default(),
    )?;
    let took = load(&redis_plain, n)?;
    println!("loaded the redis server in {took:.1?}");
    let redis_cached = FeatureStore::open_redis(
        &views,
        opts(RedisTarget::Server(server.url()), true),
        StoreOptions::default(),
    )?;
    // Warm the cache with every key.
    let all: Vec<i64> = (1..=n).collect();
    for chunk in all.chunks(1000) {
        let req = LookupRequest::new(["bench:*"])
            .with_keys("entity_id", KeyColumn::Int64(chunk.to_vec()));
        redis_cached.get_online_features(req).await?;
    }

    let cluster = redis_server::RedisCluster::start();
    let redis_cluster = FeatureStore::open_redis(
        &views,
        opts(RedisTarget::Cluster(cluster.urls()), false),
        StoreOptions::default(),
    )?;
    let took = load(&redis_cluster, n)?;
    println!("loaded the 3-master cluster in {took:.1?}");

    let view_id = redis_plain.view("bench")?.id;
    let mut lines = vec![
        time_store("sled, in process", &sled, n, lookups).await?,
        time_store(
            "redis server, cache off (1 pipeline)",
            &redis_plain,
            n,
            lookups,
        )
        .await?,
        time_store(
            "redis cluster x3, cache off (1 pipeline per master)",
            &redis_cluster,
            n,
            lookups,
        )
        .await?,
        time_store(
            "redis server, cache on and warm (all hits)",
            &redis_cached,
            n,
            lookups,
        )
        .await?,
    ];
    lines.push(time_raw_pipeline(&server.url(), view_id, n, lookups).await?);
    let bench_line = redis_benchmark_mget(server.port, view_id, lookups)?;

    println!();
    println!(
        "| {:<52} | {:>7} | {:>7} | {:>7} | {:>9} |",
        "100-key lookup", "p50 µs", "p99 µs", "p99.9 µs", "lookups/s"
    );
    println!("|{:-<54}|{:-<9}|{:-<9}|{:-<9}|{:-<11}|", "", "", "", "", "");
    for l in &lines {
        println!(
            "| {:<52} | {:>7} | {:>7} | {:>7} | {:>9.0} |",
            l.name,
            l.hist.value_at_quantile(0.5),
            l.hist.value_at_quantile(0.99),
            l.hist.value_at_quantile(0.999),
            l.per_sec
        );
    }
    println!("{bench_line}");
    Ok(())
}
