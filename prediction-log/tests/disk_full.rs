#![allow(clippy::unwrap_used)]
#![cfg(target_os = "linux")]
//! A log whose writes fail (the disk full, a directory gone) keeps taking records, counts the ones it
//! cannot keep, and writes again once there is room: every record it counted as
//! written reaches a Parquet file without a restart (deferred: with a converter), and
//! none is made up.
//!
//! The failure is real: the process's file-size limit (`RLIMIT_FSIZE`), lowered while
//! the log runs, makes its writes past it fail with `EFBIG`, as a full disk makes them
//! fail with `ENOSPC` (the writer treats every write error alike). A write past the limit
//! also raises `SIGXFSZ`, which would kill the process, so the test runs its body in a
//! child of its own binary started with that signal ignored (a shell's `trap`, inherited
//! across `exec`): the limit and the signal stay out of every other test.

mod common;

use common::record;
use mesh_prediction_log::{
    convert_closed, read_all, recover, wal_files, LogConfig, ParquetMode, PredictionLog,
    ReadOptions, Role,
};
use std::time::{Duration, Instant};

const CHILD: &str = "MESH_TEST_DISK_FULL_CHILD";

#[test]
fn a_full_disk_loses_only_what_it_counts_and_the_log_writes_again_once_there_is_room() {
    if std::env::var_os(CHILD).is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"trap '' XFSZ; exec "$@""#)
            .arg("sh")
            .arg(exe)
            .args([
                "a_full_disk_loses_only_what_it_counts_and_the_log_writes_again_once_there_is_room",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{text}");
        assert!(out.status.success(), "the child failed: {text}");
        // The child ran the body (a filter that matched nothing would pass too).
        assert!(text.contains("1 passed"), "{text}");
        assert!(text.contains("disk full, Inline: "), "{text}");
        assert!(text.contains("disk full, Deferred: "), "{text}");
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            body(ParquetMode::Inline).await;
            body(ParquetMode::Deferred).await;
        });
}

/// With `Inline`, the server builds every Parquet file; with `Deferred`, the abandoned
/// segments wait in `_wal/closed/` like rolled ones, for a converter.
async fn body(mode: ParquetMode) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

    let dir = tempfile::tempdir().unwrap();
    let mut c = LogConfig::new(dir.path());
    // Writes reach the file when the wal's buffer (32 KiB, about two takes of 100
    // records below) fills, and at the flushes asked for below: both kinds of write
    // fail.
    c.flush_interval = Duration::from_secs(30);
    // Larger than the limit below: each segment's wal fails before it would roll.
    c.segment_max_bytes = 4 << 20;
    c.parquet = mode;
    let (log, writer) = PredictionLog::start(c).unwrap();
    let sent: Vec<_> = (0..8_000u64)
        .map(|i| record(i, "1", Role::Primary))
        .collect();
    let (full, room) = sent.split_at(6_000);

    let unlimited = getrlimit(Resource::Fsize);
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: Some(96 << 10),
            maximum: unlimited.maximum,
        },
    )
    .unwrap();
    let mut flushed_after_loss = false;
    for (i, r) in full.iter().enumerate() {
        log.record_wait(r.clone()).await.unwrap();
        if i < 3_000 && i % 100 == 99 {
            // The first half in takes of their own, so that the wal's buffer holds
            // records of earlier takes when a write fails.
            tokio::time::sleep(Duration::from_millis(8)).await;
            if log.stats().lost > 0 && !flushed_after_loss {
                // A flush that succeeds, in the new segment: the records of the failed
                // one that never reached its file must not be counted written by it.
                flushed_after_loss = true;
                log.flush().await.unwrap();
            }
        }
        if i >= 3_000 && i % 500 == 499 {
            // The writer keeps answering while its writes fail.
            tokio::time::timeout(Duration::from_secs(10), log.flush())
                .await
                .expect("flush answers")
                .unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let during = loop {
        let s = log.stats();
        if s.written + s.lost == s.accepted {
            break s;
        }
        assert!(Instant::now() < deadline, "the writer never took {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("disk full, {mode:?}: {during:?}");
    assert!(flushed_after_loss);
    assert!(during.lost > 0, "no write failed: {during:?}");
    assert!(during.written > 0, "nothing was written: {during:?}");
    assert_eq!(during.accepted, full.len() as u64);

    setrlimit(Resource::Fsize, unlimited).unwrap();
    for r in room {
        log.record_wait(r.clone()).await.unwrap();
    }
    let stats = log.shutdown().await.unwrap();
    writer.join().unwrap();
    println!("after: {stats:?}");
    assert_eq!(stats.accepted, sent.len() as u64);
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.written + stats.lost, stats.accepted, "{stats:?}");
    assert_eq!(stats.lost, during.lost, "nothing lost once there was room");

    if mode == ParquetMode::Deferred {
        // What `mesh logs convert` does; every closed segment converts.
        let mut failed = 0;
        let done = convert_closed(dir.path(), |r| failed += usize::from(r.is_err())).unwrap();
        assert_eq!(failed, 0);
        assert!(done.len() > 1, "{} segments converted", done.len());
    }
    // Every record counted written is in a file (a Parquet file or a wal left for the
    // next start).
    let on_disk = read_all(dir.path(), ReadOptions { include_wal: true }).unwrap();
    assert!(
        on_disk.len() as u64 >= stats.written,
        "{} records on disk, {stats:?}",
        on_disk.len()
    );
    // Every wal became a Parquet file in this run, the ones given up at a failed
    // write too: nothing waits for a restart.
    assert_eq!(
        wal_files(dir.path()).unwrap(),
        Vec::<std::path::PathBuf>::new()
    );
    let back = read_all(dir.path(), ReadOptions::default()).unwrap();
    println!("{} records read back", back.len());
    // At least every record counted written; more only from the runs whose write
    // failed part of the way (their whole frames are in the wal).
    assert!(
        back.len() as u64 >= stats.written && back.len() as u64 <= stats.accepted,
        "{} records read, {stats:?}",
        back.len()
    );
    assert!(
        back.len() < sent.len(),
        "records were lost: not all can read back"
    );
    // Each record read is one sent, whole, in the order sent, and once.
    let mut next = 0;
    for r in &back {
        let i = sent[next..]
            .iter()
            .position(|s| s.request_id == r.request_id)
            .map(|p| p + next)
            .unwrap_or_else(|| panic!("{} read out of order or twice", r.request_id));
        assert_eq!(r, &sent[i]);
        next = i + 1;
    }
    // Once there was room, every record.
    assert_eq!(&back[back.len() - room.len()..], room);
}

/// A wal directory that takes no new file (here a file stands where it was; a full disk
/// or a read-only mount does the same) costs the writer one attempt to open a segment
/// every 100 ms, not one per record; the records in between are counted lost, and once
/// the directory is back the log writes on.
#[test]
fn a_wal_directory_that_takes_no_new_file_costs_an_attempt_per_interval_not_per_record() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut c = LogConfig::new(dir.path());
            c.flush_interval = Duration::from_millis(20);
            // Small segments: the open one rolls soon after the directory goes.
            c.segment_max_bytes = 32 << 10;
            let (log, writer) = PredictionLog::start(c).unwrap();
            let sent: Vec<_> = (0..5_000u64)
                .map(|i| record(i, "1", Role::Primary))
                .collect();
            for r in &sent[..1_000] {
                log.record_wait(r.clone()).await.unwrap();
            }
            log.flush().await.unwrap();

            let wal = dir.path().join("_wal");
            let away = dir.path().join("_wal.away");
            std::fs::rename(&wal, &away).unwrap();
            std::fs::write(&wal, b"not a directory").unwrap();
            let started = Instant::now();
            for chunk in sent[1_000..4_000].chunks(100) {
                for r in chunk {
                    log.record_wait(r.clone()).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            log.flush().await.unwrap();
            let during = log.stats();
            let took = started.elapsed();
            println!("directory gone for {took:?}: {during:?}");
            assert!(during.lost > 100, "{during:?}");
            // One attempt, then one per 100 ms at most (and a few for the scheduler's
            // slack), where an attempt per record would make thousands.
            let most = 2 + (took.as_millis() / 100) as u64;
            assert!(
                (1..=most).contains(&during.open_errors),
                "{} attempts in {took:?}: {during:?}",
                during.open_errors
            );

            std::fs::remove_file(&wal).unwrap();
            std::fs::rename(&away, &wal).unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            for r in &sent[4_000..] {
                log.record_wait(r.clone()).await.unwrap();
            }
            let stats = log.shutdown().await.unwrap();
            writer.join().unwrap();
            assert_eq!(stats.dropped, 0);
            assert_eq!(stats.written + stats.lost, stats.accepted, "{stats:?}");
            assert_eq!(stats.open_errors, during.open_errors, "{stats:?}");
            // The segments that rolled while the directory was gone could not have
            // their wal removed after their Parquet file was in place: the next start
            // finds them converted already, and removes them.
            let report = recover(dir.path()).unwrap();
            assert_eq!(report.records, 0, "{report:?}");
            assert!(wal_files(dir.path()).unwrap().is_empty());
            let back = read_all(dir.path(), ReadOptions::default()).unwrap();
            assert_eq!(back.len() as u64, stats.written, "{stats:?}");
            assert_eq!(&back[..1_000], &sent[..1_000]);
            assert_eq!(&back[back.len() - 1_000..], &sent[4_000..]);
        });
}
