#![allow(clippy::unwrap_used)]
//! Writer and readers: round trip, drops, rolls, recovery, partitions, tail.

mod common;

use common::record;
#[cfg(target_os = "linux")]
use common::stat_field;
use mesh_prediction_log::{
    parquet_files, read_all, read_parquet, recover, wal_files, FeatureLogging, LogConfig, LogStats,
    LoggedFeature, PredictionLog, PredictionLogHandle, Protocol, ReadOptions, RecordRef, Role,
    StageMicros, Tailer, VersionText,
};
use std::collections::HashSet;
use std::time::Duration;

fn cfg(dir: &std::path::Path) -> LogConfig {
    let mut c = LogConfig::new(dir);
    c.flush_interval = Duration::from_millis(20);
    c
}

/// Records `ids` as primary predictions of version 1, each waited for.
async fn record_primary(log: &PredictionLogHandle, ids: std::ops::Range<u64>) {
    for i in ids {
        log.record_wait(record(i, "1", Role::Primary))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn round_trip_every_record_comes_back_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(cfg(dir.path())).unwrap();
    let n = 2_000u64;
    let sent: Vec<_> = (0..n)
        .map(|i| {
            record(
                i,
                if i % 4 == 0 { "4" } else { "3" },
                if i % 4 == 0 {
                    Role::Canary
                } else {
                    Role::Primary
                },
            )
        })
        .collect();
    for r in &sent {
        log.record_wait(r.clone()).await.unwrap();
    }
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(stats.accepted, n);
    assert_eq!(stats.written, n);
    assert_eq!(stats.flushed, n);
    assert_eq!(stats.dropped, 0);
    assert!(
        wal_files(dir.path()).unwrap().is_empty(),
        "shutdown leaves no wal"
    );
    let files = parquet_files(dir.path()).unwrap();
    assert_eq!(files.len(), 1);
    assert!(files[0]
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("date="));
    let back = read_all(dir.path(), ReadOptions::default()).unwrap();
    assert_eq!(back, sent);
    // Library-level version of "N predictions served -> N records, right versions, stages
    // that add up to no more than the total".
    assert_eq!(
        back.iter()
            .filter(|r| r.version == "4" && r.role == Role::Canary)
            .count(),
        500
    );
    assert!(back
        .iter()
        .all(|r| r.stages.sum_of_stages() <= r.stages.total));
}

#[test]
fn full_channel_drops_and_counts_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.channel_capacity = 8;
    let (log, writer) = PredictionLog::start(c).unwrap();
    let n = 50_000u64;
    let mut accepted = HashSet::new();
    let start = std::time::Instant::now();
    for i in 0..n {
        if log.record(record(i, "1", Role::Primary)) {
            accepted.insert(format!("req-{i:08}"));
        }
    }
    let elapsed = start.elapsed();
    let stats = log.shutdown_blocking();
    writer.join().unwrap();
    assert!(
        stats.dropped > 0,
        "a burst into a channel of 8 must drop: {stats:?}"
    );
    assert_eq!(stats.accepted + stats.dropped, n);
    assert_eq!(stats.accepted as usize, accepted.len());
    let back = read_all(dir.path(), ReadOptions::default()).unwrap();
    assert_eq!(back.len(), accepted.len());
    assert!(back.iter().all(|r| accepted.contains(&r.request_id)));
    // Not a timing assertion on the hot path, just a sanity bound: 50k records queued never wait
    // on the disk, so they cannot take anywhere near 50k * flush_interval.
    assert!(elapsed < Duration::from_secs(30));
    // After shutdown, records are dropped and counted, not queued forever.
    assert!(!log.record(record(0, "1", Role::Primary)));
    assert_eq!(log.stats().dropped, stats.dropped + 1);
}

/// A caller's own feature type, logged through `record_ref` without building a record.
struct Used {
    name: &'static str,
    value: Option<f64>,
    status: &'static str,
}

impl LoggedFeature for Used {
    fn name(&self) -> &str {
        self.name
    }
    fn value(&self) -> Option<f64> {
        self.value
    }
    fn status(&self) -> &str {
        self.status
    }
    fn event_time_us(&self) -> Option<i64> {
        self.value.map(|_| 1_700_000_000_000_000)
    }
}

/// `record_ref` writes what `record` of the same data writes; a record too large for a
/// wal frame is dropped and counted, and the log goes on.
#[test]
fn record_ref_logs_borrowed_data_and_drops_an_oversized_record() {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(cfg(dir.path())).unwrap();
    let features = [
        Used {
            name: "card:txn_count_1h",
            value: Some(3.0),
            status: "PRESENT",
        },
        Used {
            name: "request:amount",
            value: None,
            status: "MISSING",
        },
        Used {
            name: "x",
            value: Some(-1.5),
            status: "a status of its own",
        },
    ];
    let keys = [("card_id", "c-1"), ("merchant_id", "")];
    let stages = StageMicros::from_array([1, 2, 3, 4, 5, 6, 30]);
    let mut sent = Vec::new();
    for (i, version) in [Some(12), None, Some(u64::MAX)].into_iter().enumerate() {
        let v = VersionText::new(version);
        let id = format!("r-{i}");
        let rec = RecordRef {
            request_id: &id,
            ts_us: 1_700_000_000_000_000 + i as i64,
            model: "fraud",
            version: v.as_str(),
            role: Role::Canary,
            protocol: Protocol::Decide,
            entity_keys: &keys,
            features: (i != 1).then_some(&features[..]),
            score: Some(0.25),
            decision: Some("review"),
            source: "RULES",
            stages,
        };
        assert!(log.record_ref(&rec));
        sent.push(rec.to_record());
    }
    assert_eq!(sent[0].version, "12");
    assert_eq!(sent[1].version, "");
    assert_eq!(sent[2].version, u64::MAX.to_string());
    // Larger than a wal frame may be (64 MiB): refused before it is queued.
    let huge = "x".repeat((64 << 20) + 1);
    let mut too_big = record(9, "1", Role::Primary);
    too_big.request_id = huge;
    assert!(!log.record(too_big.clone()));
    assert_eq!(log.stats().dropped, 1);
    // `record_wait` says why instead of waiting for room that would never fit it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(log.record_wait(too_big))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("over the 67108864 bytes a wal frame may hold"),
        "{e}"
    );
    assert!(
        e.len() < 300,
        "the message names the id by its start: {}",
        &e[..300]
    );
    assert_eq!(log.stats().dropped, 1, "refused, not counted as a drop");
    // The same data as an owned record, after it.
    let owned = record(10, "1", Role::Primary);
    assert!(log.record(owned.clone()));
    sent.push(owned);
    let stats = log.shutdown_blocking();
    writer.join().unwrap();
    assert_eq!((stats.accepted, stats.written, stats.dropped), (4, 4, 1));
    let back = read_all(dir.path(), ReadOptions::default()).unwrap();
    assert_eq!(back, sent);
    let f = back[0].features.as_ref().unwrap();
    assert_eq!(f[2].status, "a status of its own");
    assert_eq!(f[0].event_time_us, Some(1_700_000_000_000_000));
    assert!(back[1].features.is_none());
}

#[tokio::test]
async fn rolls_by_size_keeping_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.segment_max_bytes = 12_000;
    let (log, writer) = PredictionLog::start(c).unwrap();
    let sent: Vec<_> = (0..1_000).map(|i| record(i, "1", Role::Primary)).collect();
    for r in &sent {
        log.record_wait(r.clone()).await.unwrap();
    }
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    let files = parquet_files(dir.path()).unwrap();
    assert!(files.len() >= 10, "{} files", files.len());
    assert_eq!(stats.segments as usize, files.len());
    for f in &files {
        assert!(!read_parquet(f).unwrap().is_empty());
    }
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
}

#[tokio::test]
async fn rolls_by_age_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.segment_max_age = Duration::from_millis(100);
    let (log, writer) = PredictionLog::start(c).unwrap();
    for burst in 0..3u64 {
        for i in 0..10 {
            log.record_wait(record(burst * 10 + i, "1", Role::Primary))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Still running: the first bursts were closed by age, not by shutdown.
    let while_running = parquet_files(dir.path()).unwrap().len();
    assert!(while_running >= 3, "{while_running} segments closed by age");
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(
        read_all(dir.path(), ReadOptions::default()).unwrap().len(),
        30
    );
}

#[tokio::test]
async fn partitions_by_date_of_record() {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(cfg(dir.path())).unwrap();
    let day = 86_400_000_000i64;
    let base = 1_709_164_800_000_000i64; // 2024-02-29T00:00:00Z
    for (i, ts) in [
        base + 10,
        base + 20,
        base + day + 5,
        base + day + 6,
        base + 2 * day,
    ]
    .iter()
    .enumerate()
    {
        let mut r = record(i as u64, "1", Role::Primary);
        r.ts_us = *ts;
        log.record_wait(r).await.unwrap();
    }
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    let parts: Vec<String> = parquet_files(dir.path())
        .unwrap()
        .iter()
        .map(|p| {
            p.parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        parts,
        ["date=2024-02-29", "date=2024-03-01", "date=2024-03-02"]
    );
}

#[tokio::test]
async fn feature_logging_modes() {
    for (mode, expect_some) in [
        (FeatureLogging::All, Some(100)),
        (FeatureLogging::None, Some(0)),
        (FeatureLogging::Sample(0.3), None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        c.features = mode;
        let (log, writer) = PredictionLog::start(c).unwrap();
        record_primary(&log, 0..100).await;
        log.shutdown().await.unwrap();
        writer.join().unwrap();
        let back = read_all(dir.path(), ReadOptions::default()).unwrap();
        let with = back.iter().filter(|r| r.features.is_some()).count();
        match expect_some {
            Some(n) => assert_eq!(with, n, "{mode:?}"),
            None => assert!((10..60).contains(&with), "{mode:?}: {with}"),
        }
    }
}

/// A new log directory holding `bytes` as the wal `wal` (its file name), as a crash
/// leaves it; and the copy's path.
fn crashed_with(wal: &std::path::Path, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let crashed = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(crashed.path().join("_wal")).unwrap();
    let copy = crashed.path().join("_wal").join(wal.file_name().unwrap());
    std::fs::write(&copy, bytes).unwrap();
    (crashed, copy)
}

/// Records of two models (two lists of feature names), interleaved, and records
/// without features: each wal names each list once, in a frame of its own before the
/// first record that uses it, so a wal left by a crash converts on its own, and a tail
/// that reads a wal on from the middle still gets every name.
#[tokio::test]
async fn each_wal_names_a_models_features_once_and_reads_on_its_own() {
    let live = tempfile::tempdir().unwrap();
    let mut c = cfg(live.path());
    c.segment_max_bytes = 6_000;
    let (log, writer) = PredictionLog::start(c).unwrap();
    let sent: Vec<_> = (0..330u64)
        .map(|i| {
            let mut r = record(i, "1", Role::Primary);
            match i % 3 {
                0 => {}
                1 => {
                    for f in r.features.as_mut().unwrap() {
                        f.name = format!("merchant:{}_rate_30d", f.name).into();
                    }
                }
                _ => r.features = None,
            }
            r
        })
        .collect();
    let (mut tailer, _) = Tailer::start(live.path(), 0).unwrap();
    let mut tailed = Vec::new();
    for (i, r) in sent.iter().enumerate() {
        log.record_wait(r.clone()).await.unwrap();
        if i % 29 == 0 {
            log.flush().await.unwrap();
            tailed.extend(tailer.poll().unwrap());
        }
    }
    log.flush().await.unwrap();
    // The open wal as a crash would leave it: rolls came before it, and it names each
    // list once however many of its records use it.
    // (Wals of rolled segments may wait for their Parquet file: the open one is the
    // newest.)
    let wals = wal_files(live.path()).unwrap();
    let open = wals.last().unwrap();
    let bytes = std::fs::read(open).unwrap();
    let count = |needle: &[u8]| bytes.windows(needle.len()).filter(|w| *w == needle).count();
    assert_eq!(count(b"merchant:f3_rate_30d"), 1);
    assert_eq!(count(b"\x02f3"), 1);
    let in_wal = count(b"req-");
    assert!(in_wal > 10, "{in_wal} records in the open wal");
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    tailed.extend(tailer.poll().unwrap());
    assert_eq!(tailed, sent, "the tail, from the middle of wals");
    assert_eq!(read_all(live.path(), ReadOptions::default()).unwrap(), sent);
    let segments = parquet_files(live.path()).unwrap().len();
    assert!(segments > 5, "{segments} segments");

    let (crashed, _) = crashed_with(open, &bytes);
    let report = recover(crashed.path()).unwrap();
    assert_eq!(report.records, in_wal);
    let back = read_all(crashed.path(), ReadOptions::default()).unwrap();
    assert_eq!(back, sent[sent.len() - in_wal..]);
}

#[tokio::test]
async fn recovery_drops_torn_tail_and_is_idempotent() {
    let live = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(cfg(live.path())).unwrap();
    let sent: Vec<_> = (0..100).map(|i| record(i, "1", Role::Primary)).collect();
    for r in &sent {
        log.record_wait(r.clone()).await.unwrap();
    }
    assert_eq!(log.flush().await.unwrap(), 100);
    // Snapshot the open wal as a crash would leave it, with the last frame torn.
    let wals = wal_files(live.path()).unwrap();
    assert_eq!(wals.len(), 1);
    let mut bytes = std::fs::read(&wals[0]).unwrap();
    bytes.truncate(bytes.len() - 7);
    log.shutdown().await.unwrap();
    writer.join().unwrap();

    let (crashed, wal_copy) = crashed_with(&wals[0], &bytes);
    // A conversion that was in progress when the process died.
    let part = crashed.path().join("date=2024-01-01");
    std::fs::create_dir_all(&part).unwrap();
    std::fs::write(
        part.join(".part-0000000000000001-1-000000.parquet.tmp"),
        b"PAR1 half written",
    )
    .unwrap();

    let (log2, writer2) = PredictionLog::start(cfg(crashed.path())).unwrap();
    assert_eq!(writer2.recovered.wal_files, 1);
    assert_eq!(writer2.recovered.records, 99);
    assert!(writer2.recovered.torn_bytes > 0);
    assert_eq!(writer2.recovered.temp_files_removed, 1);
    log2.shutdown().await.unwrap();
    writer2.join().unwrap();
    let back = read_all(crashed.path(), ReadOptions::default()).unwrap();
    assert_eq!(back, sent[..99]);

    // Crash between rename and wal removal: the wal comes back, recovery must not duplicate.
    std::fs::write(&wal_copy, &bytes).unwrap();
    let report = recover(crashed.path()).unwrap();
    assert_eq!(
        (report.wal_files, report.already_converted, report.records),
        (1, 1, 0)
    );
    assert_eq!(
        read_all(crashed.path(), ReadOptions::default())
            .unwrap()
            .len(),
        99
    );
    assert!(wal_files(crashed.path()).unwrap().is_empty());
}

#[tokio::test]
async fn tail_follows_across_rolls_without_gaps_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.segment_max_bytes = 8_000;
    let (log, writer) = PredictionLog::start(c).unwrap();
    record_primary(&log, 0..50).await;
    log.flush().await.unwrap();
    let (mut tailer, backlog) = Tailer::start(dir.path(), 5).unwrap();
    let ids: Vec<&str> = backlog.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "req-00000045",
            "req-00000046",
            "req-00000047",
            "req-00000048",
            "req-00000049"
        ]
    );
    let mut seen = Vec::new();
    for i in 50..400 {
        log.record_wait(record(i, "1", Role::Primary))
            .await
            .unwrap();
        if i % 37 == 0 {
            log.flush().await.unwrap();
            seen.extend(tailer.poll().unwrap());
        }
    }
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    seen.extend(tailer.poll().unwrap());
    let got: Vec<String> = seen.into_iter().map(|r| r.request_id).collect();
    let want: Vec<String> = (50..400).map(|i| format!("req-{i:08}")).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn cli_tail_prints_the_newest_records() {
    use mesh_prediction_log::commands::{run_tail, TailArgs};
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(cfg(dir.path())).unwrap();
    for i in 0..20 {
        log.record_wait(record(i, "9", Role::Shadow)).await.unwrap();
    }
    log.flush().await.unwrap(); // still open: tail reads the wal
    let mut args = TailArgs {
        logs: dir.path().to_path_buf(),
        lines: 3,
        no_follow: true,
        interval_ms: 10,
        json: false,
    };
    let mut out = Vec::new();
    run_tail(&args, &mut out, &|| true).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[2].contains(" req-00000019 fraud v9 shadow "),
        "{text}"
    );
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    args.json = true;
    let mut out = Vec::new();
    run_tail(&args, &mut out, &|| true).unwrap(); // now from the closed Parquet segment
    let last: mesh_prediction_log::PredictionRecord =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(
        last,
        record(19, "9", Role::Shadow).clone_with_ts(last.ts_us)
    );
}

trait WithTs {
    fn clone_with_ts(self, ts: i64) -> Self;
}

impl WithTs for mesh_prediction_log::PredictionRecord {
    fn clone_with_ts(mut self, ts: i64) -> Self {
        // `record()` stamps now; features' event times are relative to it.
        let shift = ts - self.ts_us;
        self.ts_us = ts;
        for f in self.features.iter_mut().flatten() {
            f.event_time_us = f.event_time_us.map(|t| t + shift);
        }
        self
    }
}

/// The log's threads of this process (`plog-writer`, `plog-closer`, `plog-encoder`), each
/// with fields `i` of its stat line, once every thread shows what `want` says for it
/// (each sets its own priority when it starts: give them a moment on a busy machine), or
/// after 2 s.
#[cfg(target_os = "linux")]
async fn log_threads(i: &[usize], want: impl Fn(&str) -> Vec<i64>) -> Vec<(String, Vec<i64>)> {
    let threads = || {
        plog_tasks()
            .into_iter()
            .map(|(name, t)| (name, i.iter().map(|&i| stat_field(&t, i)).collect()))
            .collect::<Vec<_>>()
    };
    let mut found = threads();
    for _ in 0..100 {
        if found.len() == 3 && found.iter().all(|(name, v)| *v == want(name)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        found = threads();
    }
    found
}

/// The log's threads in this process (named `plog-*`), by name, with their /proc
/// directory.
#[cfg(target_os = "linux")]
fn plog_tasks() -> Vec<(String, std::path::PathBuf)> {
    let mut found = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.starts_with("plog-") {
            found.push((comm.trim_end().to_string(), t));
        }
    }
    found.sort();
    found
}

/// The tests that look at the log's threads, one at a time (under `cargo test` the tests
/// of a file share a process, and each would see the other's threads).
#[cfg(target_os = "linux")]
static ONE_LOG_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Field 19 of a thread's stat line is its nice value, field 41 its policy.
#[cfg(target_os = "linux")]
const NICE: usize = 19;
#[cfg(target_os = "linux")]
const POLICY: usize = 41;
#[cfg(target_os = "linux")]
const SCHED_OTHER: i64 = 0;
#[cfg(target_os = "linux")]
const SCHED_BATCH: i64 = 3;
#[cfg(target_os = "linux")]
const SCHED_IDLE: i64 = 5;

/// Starts a log with `c`, writes 100 records, and returns the log's threads with their
/// nice value and policy as `want` expects them, then checks every record came back and
/// the calling thread kept its policy.
#[cfg(target_os = "linux")]
async fn threads_of_a_log(
    c: LogConfig,
    want: impl Fn(&str) -> Vec<i64>,
) -> Vec<(String, Vec<i64>)> {
    let dir = c.dir.clone();
    let (log, writer) = PredictionLog::start(c).unwrap();
    record_primary(&log, 0..100).await;
    log.flush().await.unwrap();
    let found = log_threads(&[NICE, POLICY], want).await;
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(read_all(&dir, ReadOptions::default()).unwrap().len(), 100);
    assert_eq!(
        stat_field(std::path::Path::new("/proc/thread-self"), POLICY),
        SCHED_OTHER,
        "the calling thread keeps its own policy"
    );
    found
}

/// By default the writer runs `writer_nice` steps below the thread that started the log
/// (Linux: nice is per thread) under SCHED_BATCH (waking, it never preempts a serving
/// thread), and the Parquet work (the encoder and the closer) under SCHED_IDLE.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_writer_runs_nicer_than_the_serving_threads_and_the_parquet_work_under_sched_idle() {
    let _one = ONE_LOG_AT_A_TIME.lock().await;
    let own = stat_field(std::path::Path::new("/proc/thread-self"), NICE);
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    assert!(!c.writer_idle && c.encoder_idle);
    c.writer_nice = 6;
    let nice = (own + 6).min(19);
    let want = |name: &str| match name {
        // Under SCHED_IDLE the nice value is not used; it keeps the one it inherited.
        "plog-encoder" | "plog-closer" => vec![own, SCHED_IDLE],
        _ => vec![nice, SCHED_BATCH],
    };
    let found = threads_of_a_log(c, want).await;
    let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["plog-closer", "plog-encoder", "plog-writer"]);
    for (name, fields) in &found {
        assert_eq!(*fields, want(name), "{name}: [nice, policy]");
    }
}

/// With `encoder_idle` off, the encoder and the closer run at `writer_nice` under
/// SCHED_BATCH like the writer; with `writer_nice = 0` too, all three run as the thread
/// that started the log.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_encoder_runs_at_writer_nice_when_encoder_idle_is_off() {
    let _one = ONE_LOG_AT_A_TIME.lock().await;
    let own = stat_field(std::path::Path::new("/proc/thread-self"), NICE);
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.encoder_idle = false;
    let nice = (own + 10).min(19);
    let found = threads_of_a_log(c, |_| vec![nice, SCHED_BATCH]).await;
    assert_eq!(found.len(), 3, "{found:?}");
    for (name, fields) in found {
        assert_eq!(fields, vec![nice, SCHED_BATCH], "{name}: [nice, policy]");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.encoder_idle = false;
    c.writer_nice = 0;
    let found = threads_of_a_log(c, |_| vec![own, SCHED_OTHER]).await;
    assert_eq!(found.len(), 3, "{found:?}");
    for (name, fields) in found {
        assert_eq!(fields, vec![own, SCHED_OTHER], "{name}: [nice, policy]");
    }
}

/// With `writer_idle` on, all three threads run under SCHED_IDLE, and the log works as
/// ever.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn writer_threads_run_under_sched_idle_when_asked() {
    let _one = ONE_LOG_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.writer_idle = true;
    let found = threads_of_a_log(c, |_| vec![]).await;
    assert_eq!(found.len(), 3, "{found:?}");
    for (name, fields) in found {
        assert_eq!(fields[1], SCHED_IDLE, "{name}");
    }
}

/// The CPUs a thread may run on, as /proc lists them ("0-1", "0").
#[cfg(target_os = "linux")]
fn cpus_allowed(task: &std::path::Path) -> String {
    std::fs::read_to_string(task.join("status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

/// With `cpus`, the log's three threads run only there, and the thread that started the
/// log keeps its own CPUs; CPUs the kernel does not run the process on are refused at
/// start, naming the setting.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_logs_threads_run_on_the_cpus_they_are_given() {
    let _one = ONE_LOG_AT_A_TIME.lock().await;
    let own = cpus_allowed(std::path::Path::new("/proc/thread-self"));
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.cpus = vec![0];
    let (log, writer) = PredictionLog::start(c).unwrap();
    record_primary(&log, 0..100).await;
    log.flush().await.unwrap();
    let found: Vec<_> = plog_tasks()
        .into_iter()
        .map(|(name, t)| (name, cpus_allowed(&t)))
        .collect();
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(
        found,
        [
            ("plog-closer".to_string(), "0".to_string()),
            ("plog-encoder".to_string(), "0".to_string()),
            ("plog-writer".to_string(), "0".to_string())
        ]
    );
    assert_eq!(
        read_all(dir.path(), ReadOptions::default()).unwrap().len(),
        100
    );
    assert_eq!(cpus_allowed(std::path::Path::new("/proc/thread-self")), own);

    // Past what a CPU set holds, and one this machine does not have.
    for bad in [vec![1 << 20], vec![1023]] {
        let mut c = cfg(dir.path());
        c.cpus = bad.clone();
        let e = PredictionLog::start(c).err().expect("refused").to_string();
        assert!(
            e.contains("cpus") && e.contains(&format!("{}", bad[0])),
            "{e}"
        );
    }
}

/// The log under `dir` reads back as records `0..n` of version 1 (as
/// `record_primary` wrote them), each once and in order.
fn assert_all_in_order(dir: &std::path::Path, n: u64) {
    let ids: Vec<String> = read_all(dir, ReadOptions::default())
        .unwrap()
        .into_iter()
        .map(|r| r.request_id)
        .collect();
    let want: Vec<String> = (0..n)
        .map(|i| record(i, "1", Role::Primary).request_id)
        .collect();
    assert_eq!(ids, want);
}

/// Runs `n` records through a log with an encoder backlog of one record and segments
/// of `segment_bytes`, and checks that none is lost: every segment has its Parquet
/// file, each record reads back once and in order, and no wal or temp file is left.
async fn behind_encoder(n: u64, segment_bytes: u64) -> LogStats {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.encoder_backlog = 1;
    c.segment_max_bytes = segment_bytes;
    let (log, writer) = PredictionLog::start(c).unwrap();
    record_primary(&log, 0..n).await;
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(stats.written, n);
    assert_eq!(stats.dropped + stats.lost, 0);
    assert!(stats.encoder_behind >= 1, "{stats:?}");
    let files = parquet_files(dir.path()).unwrap();
    assert_eq!(files.len() as u64, stats.segments, "{stats:?}");
    assert_all_in_order(dir.path(), n);
    assert!(wal_files(dir.path()).unwrap().is_empty());
    for f in files {
        let dir = f.parent().unwrap();
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with('.'), "temp file left: {name}");
        }
    }
    stats
}

/// An encoder that falls behind (a backlog of one record) reads the rest of the
/// segment from its wal as the writer appends it: the segment's Parquet file is its
/// own, and the closer converts nothing (a build that gave the file up on falling
/// behind left the whole segment to the closer).
#[tokio::test]
async fn an_encoder_kept_behind_reads_the_segment_from_its_wal() {
    let stats = behind_encoder(5_000, 64 << 20).await;
    assert_eq!(stats.segments, 1, "{stats:?}");
    assert_eq!(
        stats.closer_segments, 0,
        "nothing for the closer: {stats:?}"
    );
}

/// With small segments rolling faster than the encoder gets through them, the words
/// about them (start, read on from the wal, finish) can fill the encoder's queue: the
/// segments that find no room are converted by the closer, and no record is lost.
#[tokio::test]
async fn an_encoder_kept_behind_over_many_segments_loses_no_record() {
    let stats = behind_encoder(5_000, 64 << 10).await;
    assert!(stats.segments > 1, "{stats:?}");
}

/// A runtime of two workers that call `worker_turn` before they park, as `mesh
/// serve`'s do.
fn turning_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_park(mesh_prediction_log::worker_turn)
        .enable_all()
        .build()
        .unwrap()
}

/// With worker turns, a segment the encoder fell behind on is read from the wal by the
/// encoder thread alone (the workers' turns leave it be): every record reaches the
/// segment's own Parquet file, and the closer converts nothing.
#[test]
fn worker_turns_leave_a_segment_read_from_the_wal_to_the_encoder_thread() {
    let rt = turning_runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.worker_turns = true;
    c.encoder_backlog = 50;
    let n = 4_000u64;
    let run = rt.spawn(async move {
        let (log, writer) = PredictionLog::start(c).unwrap();
        for burst in 0..n / 200 {
            for i in burst * 200..(burst + 1) * 200 {
                assert!(log.record(record(i, "1", Role::Primary)));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let stats = log.shutdown().await.unwrap();
        writer.join().unwrap();
        stats
    });
    let stats = rt.block_on(run).unwrap();
    assert_eq!((stats.written, stats.dropped + stats.lost), (n, 0));
    assert!(stats.encoder_behind >= 1, "{stats:?}");
    assert_eq!((stats.segments, stats.closer_segments), (1, 0), "{stats:?}");
    assert!(wal_files(dir.path()).unwrap().is_empty());
    assert_all_in_order(dir.path(), n);
}

/// A runtime whose workers call `worker_turn` before they park (as `mesh serve`'s does)
/// builds the Parquet columns of a log started with `worker_turns`, and only of that
/// one: every record of both logs reads back, in order, from their Parquet files.
#[test]
fn a_runtime_that_takes_worker_turns_builds_the_columns_of_a_log_that_asks() {
    let rt = turning_runtime();
    let (turns_dir, plain_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = cfg(turns_dir.path());
    c.worker_turns = true;
    let n = 6_000u64;
    let plain_cfg = cfg(plain_dir.path());
    // On a worker (what `block_on` runs stays on this thread).
    let run = rt.spawn(async move {
        let (turned, tw) = PredictionLog::start(c).unwrap();
        let (plain, pw) = PredictionLog::start(plain_cfg).unwrap();
        // Bursts with pauses between them, so that the workers park.
        for burst in 0..n / 200 {
            for i in burst * 200..(burst + 1) * 200 {
                assert!(turned.record(record(i, "1", Role::Primary)));
                assert!(plain.record(record(i, "1", Role::Primary)));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let stats = (
            turned.shutdown().await.unwrap(),
            plain.shutdown().await.unwrap(),
        );
        tw.join().unwrap();
        pw.join().unwrap();
        stats
    });
    let (turned, plain) = rt.block_on(run).unwrap();
    assert_eq!((turned.written, plain.written), (n, n));
    assert!(
        turned.on_workers > 0 && turned.on_workers <= n,
        "{turned:?}"
    );
    assert_eq!(
        plain.on_workers, 0,
        "a log without worker_turns is left alone"
    );
    let want: Vec<String> = (0..n)
        .map(|i| record(i, "1", Role::Primary).request_id)
        .collect();
    for dir in [&turns_dir, &plain_dir] {
        assert!(wal_files(dir.path()).unwrap().is_empty());
        let back = read_all(dir.path(), ReadOptions::default()).unwrap();
        let ids: Vec<String> = back.into_iter().map(|r| r.request_id).collect();
        assert_eq!(ids, want);
    }
}
