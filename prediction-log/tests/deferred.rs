#![allow(clippy::unwrap_used)]
//! `parquet = deferred`: rolled segments wait as wal files in `_wal/closed/` for a
//! converter in another process (`mesh logs convert`, `convert_closed`); the writer's
//! bound, restarts, and converters beside the writer and beside each other.

mod common;

use common::record;
use mesh_prediction_log::commands::ConvertArgs;
use mesh_prediction_log::{
    convert_closed, parquet_files, read_all, wal_files, LogConfig, LogStats, ParquetMode,
    PredictionLog, PredictionRecord, ReadOptions, Role, Tailer,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn deferred(dir: &Path, segment_max_bytes: u64) -> LogConfig {
    let mut c = LogConfig::new(dir);
    c.flush_interval = Duration::from_millis(20);
    c.segment_max_bytes = segment_max_bytes;
    c.parquet = ParquetMode::Deferred;
    c
}

fn closed_wals(dir: &Path) -> Vec<PathBuf> {
    let closed = dir.join("_wal").join("closed");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&closed)
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn all(dir: &Path) -> Vec<PredictionRecord> {
    read_all(dir, ReadOptions { include_wal: true }).unwrap()
}

async fn write(
    log: &mesh_prediction_log::PredictionLogHandle,
    ids: std::ops::Range<u64>,
) -> Vec<PredictionRecord> {
    let mut sent = Vec::new();
    for i in ids {
        let r = record(i, "1", Role::Primary);
        log.record_wait(r.clone()).await.unwrap();
        sent.push(r);
    }
    sent
}

/// Runs a log with `cfg` through records `ids`, to its shutdown: what was sent, and the
/// log's last counters.
async fn logged(cfg: LogConfig, ids: std::ops::Range<u64>) -> (Vec<PredictionRecord>, LogStats) {
    let (log, writer) = PredictionLog::start(cfg).unwrap();
    let sent = write(&log, ids).await;
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    (sent, stats)
}

/// `mesh logs convert --logs dir`, once.
fn convert_args(dir: &Path, idle: bool, json: bool) -> ConvertArgs {
    ConvertArgs {
        logs: dir.to_path_buf(),
        watch: false,
        interval_ms: 10,
        idle,
        json,
    }
}

/// The serving process builds no Parquet file: every rolled segment, and the open one at
/// shutdown, waits in `_wal/closed/`, readable with `include_wal`; a converter then
/// turns them into Parquet files that hold every record once, in order.
#[tokio::test]
async fn rolled_segments_wait_as_wal_files_until_a_converter_builds_their_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, stats) = logged(deferred(dir.path(), 8_000), 0..600).await;
    assert_eq!(stats.written, 600);
    assert_eq!(stats.segments, 0, "the server converted nothing");
    assert!(parquet_files(dir.path()).unwrap().is_empty());
    let closed = closed_wals(dir.path());
    assert!(closed.len() >= 5, "{} closed segments", closed.len());
    assert_eq!(stats.deferred as usize, closed.len());
    assert_eq!(
        wal_files(dir.path()).unwrap(),
        closed,
        "no open segment is left"
    );
    assert_eq!(all(dir.path()), sent);

    let mut seen = 0;
    let done = convert_closed(dir.path(), |_| seen += 1).unwrap();
    assert_eq!(seen, closed.len());
    assert_eq!(done.iter().map(|c| c.records).sum::<usize>(), 600);
    assert!(done.iter().all(|c| c.path.is_some() && c.torn_bytes == 0));
    assert!(closed_wals(dir.path()).is_empty());
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
    // Nothing left to do: a second run converts nothing.
    assert!(convert_closed(dir.path(), |_| ()).unwrap().is_empty());
}

/// Two converters run beside the serving writer the whole time: each segment is
/// converted exactly once, the open segment never, and a tail that follows the log sees
/// every record once, whether it read it from a wal or from a Parquet file.
#[tokio::test]
async fn converters_beside_the_writer_convert_each_segment_once() {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = PredictionLog::start(deferred(dir.path(), 6_000)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let converters: Vec<_> = (0..2)
        .map(|_| {
            let (dir, stop) = (dir.path().to_path_buf(), stop.clone());
            std::thread::spawn(move || {
                let mut records = 0;
                while !stop.load(Ordering::Relaxed) {
                    for c in convert_closed(&dir, |_| ()).unwrap() {
                        records += c.records;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                records
            })
        })
        .collect();
    let (mut tailer, _) = Tailer::start(dir.path(), 0).unwrap();
    let mut seen = Vec::new();
    let mut sent = Vec::new();
    for chunk in 0..20u64 {
        sent.extend(write(&log, chunk * 40..(chunk + 1) * 40).await);
        log.flush().await.unwrap();
        seen.extend(tailer.poll().unwrap());
    }
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let converted: usize = converters.into_iter().map(|t| t.join().unwrap()).sum();
    let last: usize = convert_closed(dir.path(), |_| ())
        .unwrap()
        .iter()
        .map(|c| c.records)
        .sum();
    seen.extend(tailer.poll().unwrap());
    assert_eq!(converted + last, sent.len(), "every record converted once");
    assert!(
        converted > 0,
        "the converters worked while the writer wrote"
    );
    assert!(wal_files(dir.path()).unwrap().is_empty());
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
    let ids = |r: &[PredictionRecord]| r.iter().map(|r| r.request_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&seen), ids(&sent));
}

/// Without a converter, the closed segments waiting stay within `deferred_max_bytes`:
/// past it the writer's closer converts the oldest. No record is lost either way.
#[tokio::test]
async fn past_the_bound_the_writer_converts_the_oldest_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = deferred(dir.path(), 6_000);
    c.deferred_max_bytes = 12_000;
    let (sent, stats) = logged(c, 0..800).await;
    let waiting: u64 = closed_wals(dir.path())
        .iter()
        .map(|w| std::fs::metadata(w).unwrap().len())
        .sum();
    assert!(waiting <= 12_000, "{waiting} bytes wait");
    assert!(!closed_wals(dir.path()).is_empty());
    assert!(
        stats.segments >= 3,
        "{} converted by the writer",
        stats.segments
    );
    assert_eq!(
        parquet_files(dir.path()).unwrap().len() as u64,
        stats.segments
    );
    assert_eq!(all(dir.path()), sent);
}

/// A restart in deferred mode converts a crash's open segment (here one whose move to
/// `_wal/closed/` was lost) and leaves the closed ones to the converter, counting them;
/// a restart in inline mode converts those too.
#[tokio::test]
async fn a_restart_converts_open_leftovers_and_leaves_closed_segments_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, _) = logged(deferred(dir.path(), 8_000), 0..300).await;
    let closed = closed_wals(dir.path());
    assert!(closed.len() >= 3);
    let back = dir.path().join("_wal").join(closed[0].file_name().unwrap());
    std::fs::rename(&closed[0], &back).unwrap();

    let (log, writer) = PredictionLog::start(deferred(dir.path(), 8_000)).unwrap();
    assert_eq!(writer.recovered.wal_files, 1, "only the open leftover");
    assert!(writer.recovered.records > 0);
    assert_eq!(log.stats().deferred as usize, closed.len() - 1);
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert_eq!(stats.deferred as usize, closed.len() - 1);
    assert_eq!(parquet_files(dir.path()).unwrap().len(), 1);
    assert_eq!(all(dir.path()), sent);

    let mut inline = LogConfig::new(dir.path());
    inline.flush_interval = Duration::from_millis(20);
    let (log, writer) = PredictionLog::start(inline).unwrap();
    assert_eq!(writer.recovered.wal_files, closed.len() - 1);
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    assert!(wal_files(dir.path()).unwrap().is_empty());
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
}

/// A closed segment whose lock another process holds (it is converting it) is left
/// alone, by the converters and by recovery at start, and so is its temp file; a
/// temp file whose conversion no one holds is removed.
#[tokio::test]
async fn a_segment_being_converted_elsewhere_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, _) = logged(deferred(dir.path(), 8_000), 0..200).await;
    let closed = closed_wals(dir.path());
    let held = std::fs::File::open(&closed[0]).unwrap();
    held.try_lock().unwrap();
    let name = closed[0].file_name().unwrap().to_str().unwrap();
    let id = name
        .strip_prefix("seg-")
        .unwrap()
        .strip_suffix(".wal")
        .unwrap();
    let part = dir.path().join("date=2025-01-01");
    std::fs::create_dir_all(&part).unwrap();
    let tmp = part.join(format!(".part-{id}.wal.parquet.tmp"));
    std::fs::write(&tmp, b"half written").unwrap();
    // A temp file of a conversion no one holds (its wal is gone) is removed at start.
    let stale = part.join(".part-0000000000000001-1-000000.wal.parquet.tmp");
    std::fs::write(&stale, b"left by a crash").unwrap();

    let done = convert_closed(dir.path(), |_| ()).unwrap();
    assert_eq!(done.len(), closed.len() - 1);
    assert!(closed[0].exists());
    let (log, writer) = PredictionLog::start(LogConfig::new(dir.path())).unwrap();
    assert_eq!(writer.recovered.wal_files, 0);
    assert_eq!(writer.recovered.temp_files_removed, 1);
    assert!(tmp.exists() && closed[0].exists());
    assert!(!stale.exists());
    log.shutdown().await.unwrap();
    writer.join().unwrap();

    drop(held);
    std::fs::remove_file(&tmp).unwrap();
    assert_eq!(convert_closed(dir.path(), |_| ()).unwrap().len(), 1);
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
}

/// `mesh logs convert` (its library half): a line per segment and a summary; a
/// directory that is not there is an error that names it.
#[tokio::test]
async fn cli_convert_prints_each_segment_and_a_summary() {
    use mesh_prediction_log::commands::run_convert;
    let dir = tempfile::tempdir().unwrap();
    logged(deferred(dir.path(), 8_000), 0..200).await;
    let n = closed_wals(dir.path()).len();
    assert!(n >= 2, "{n} closed segments");
    let mut args = convert_args(dir.path(), false, false);
    let mut out = Vec::new();
    run_convert(&args, &mut out, &|| false).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), n + 1, "{text}");
    assert!(
        lines[0].starts_with("converted ") && lines[0].contains(".parquet"),
        "{text}"
    );
    assert!(
        lines[n].starts_with(&format!("{n} segments, 200 records converted")),
        "{text}"
    );

    args.logs = dir.path().join("missing");
    let e = run_convert(&args, &mut Vec::new(), &|| false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing") && e.contains("not a directory"),
        "{e}"
    );
}

/// `--watch`, stopped (SIGTERM): one more pass after the stop, so a segment that closed
/// while the converter waited (a server stopping beside it closes its open segment as
/// it goes) is converted before the converter exits.
#[tokio::test]
async fn cli_convert_watch_converts_once_more_after_the_stop() {
    use mesh_prediction_log::commands::run_convert;
    let dir = tempfile::tempdir().unwrap();
    let (sent, _) = logged(deferred(dir.path(), 8_000), 0..200).await;
    let closed = closed_wals(dir.path());
    assert!(!closed.is_empty());
    // Set aside: the first pass finds nothing. They close (come back) as the stop comes.
    let aside = dir.path().join("aside");
    std::fs::create_dir(&aside).unwrap();
    for w in &closed {
        std::fs::rename(w, aside.join(w.file_name().unwrap())).unwrap();
    }
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let stop = || {
        if !stopped.swap(true, std::sync::atomic::Ordering::Relaxed) {
            for w in &closed {
                std::fs::rename(aside.join(w.file_name().unwrap()), w).unwrap();
            }
        }
        true
    };
    let mut args = convert_args(dir.path(), false, false);
    args.watch = true;
    let mut out = Vec::new();
    run_convert(&args, &mut out, &stop).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(closed_wals(dir.path()).is_empty(), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with(&format!("{} segment", closed.len())),
        "{text}"
    );
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
}

/// A closed segment that cannot be read does not stop the others: they are converted,
/// it stays as it is, and the run ends in an error that names it.
#[tokio::test]
async fn an_unreadable_closed_segment_is_named_and_the_others_still_convert() {
    use mesh_prediction_log::commands::run_convert;
    let dir = tempfile::tempdir().unwrap();
    let (sent, _) = logged(deferred(dir.path(), 8_000), 0..200).await;
    let n = closed_wals(dir.path()).len();
    // Sorts first, so it is met before the good ones.
    let bad = dir
        .path()
        .join("_wal/closed/seg-0000000000000000-1-000000.wal");
    std::fs::write(&bad, b"not a wal at all").unwrap();
    let mut errors = 0;
    let done = convert_closed(dir.path(), |c| errors += usize::from(c.is_err())).unwrap();
    assert_eq!((done.len(), errors), (n, 1));
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
    assert!(bad.exists());
    let args = convert_args(dir.path(), false, false);
    let mut out = Vec::new();
    let e = run_convert(&args, &mut out, &|| false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1 closed segment(s)") && e.contains("seg-0000000000000000-1-000000.wal"),
        "{e}"
    );
    assert!(String::from_utf8(out)
        .unwrap()
        .starts_with("0 segments, 0 records"));
}

/// `--idle`: the converting thread runs under SCHED_IDLE (its naps are those of the
/// encoder's `Pace`, tested with it) and still converts every record.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn cli_convert_idle_runs_under_sched_idle_and_converts_everything() {
    use mesh_prediction_log::commands::run_convert;
    let dir = tempfile::tempdir().unwrap();
    let (sent, _) = logged(deferred(dir.path(), 64_000), 0..3_000).await;
    let args = convert_args(dir.path(), true, true);
    let policy = std::thread::spawn(move || {
        run_convert(&args, &mut Vec::new(), &|| false).unwrap();
        // Field 41 of /proc/<tid>/stat is the scheduling policy; 5 is SCHED_IDLE.
        common::stat_field(Path::new("/proc/thread-self"), 41)
    })
    .join()
    .unwrap();
    assert_eq!(policy, 5);
    assert!(closed_wals(dir.path()).is_empty());
    assert_eq!(read_all(dir.path(), ReadOptions::default()).unwrap(), sent);
}
