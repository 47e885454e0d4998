//! Crash test: a child process ingests a large CSV file and is killed with SIGKILL
//! mid-ingest. The store must reopen, hold every batch the child reported as
//! committed and synced, and every row it holds must be whole (the file's values).
//! A batch is not atomic on sled (rows are written one at a time so that reads never
//! wait for a batch: `src/sled_store.rs`), so a batch being written when the child
//! died may be there in part; writing it again completes it.
//!
//! The child is this test binary re-executed with `--exact crash_child` and the
//! paths in environment variables; without them `crash_child` does nothing.
#![allow(clippy::unwrap_used)] // tests may unwrap
mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mesh_feature_store::{ingest_file_observed, EntityKey, IngestOptions, Value};

const ENV_DB: &str = "MESH_FS_CRASH_CHILD_DB";
const ENV_FILE: &str = "MESH_FS_CRASH_CHILD_FILE";
const ENV_SYNC: &str = "MESH_FS_CRASH_CHILD_SYNC";
const BATCH: usize = 2_000;
const ROWS: i64 = 400_000;

#[test]
fn crash_child() {
    let (Ok(db), Ok(file)) = (std::env::var(ENV_DB), std::env::var(ENV_FILE)) else {
        return;
    };
    let sync = std::env::var(ENV_SYNC).is_ok();
    let store = mesh_feature_store::FeatureStore::open(&db, &views()).unwrap();
    let opts = IngestOptions {
        batch_rows: BATCH,
        sync_each_batch: sync,
        ..Default::default()
    };
    let mut out = std::io::stdout().lock();
    ingest_file_observed(&store, "card", &file, &opts, |b| {
        // One line per committed batch; with sync_each_batch it is on disk.
        writeln!(
            out,
            "COMMITTED {} {} {}",
            b.batch_index, b.rows_read_total, b.synced
        )
        .unwrap();
        out.flush().unwrap();
    })
    .unwrap();
    writeln!(out, "DONE").unwrap();
}

fn make_file(path: &std::path::Path, t: i64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(
        f,
        "card_id,event_timestamp,amount,count,ratio,flag,country,emb"
    )
    .unwrap();
    let secs = format!("{}.{:06}", t / 1_000_000, t % 1_000_000);
    for i in 0..ROWS {
        writeln!(f, "{i},{secs},{i}.5,{},0.5,true,FR,\"[{i},1]\"", i * 3).unwrap();
    }
}

/// Runs a child until it reported `kill_after` committed batches, kills it, and
/// returns how many batches it reported (and whether it finished before the kill).
fn run_and_kill(
    db: &std::path::Path,
    file: &std::path::Path,
    sync: bool,
    kill_after: u64,
) -> (u64, bool) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(ENV_DB, db)
        .env(ENV_FILE, file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if sync {
        cmd.env(ENV_SYNC, "1");
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut committed = 0u64;
    let mut done = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // libtest prints "test crash_child ... " without a newline before the
        // child's first line, so look for the marker anywhere in the line.
        if let Some(rest) = line
            .find("COMMITTED ")
            .map(|at| &line[at + "COMMITTED ".len()..])
        {
            let idx: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(idx, committed, "batches are reported in order");
            committed += 1;
            if committed >= kill_after {
                break;
            }
        } else if line.contains("DONE") {
            done = true;
            break;
        }
        assert!(Instant::now() < deadline, "child too slow");
    }
    // Child::kill sends SIGKILL on Unix: no destructor, no flush runs in the child.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success() || done, "child was killed");
    (committed, done)
}

/// Reopens the store and checks that the first `synced_batches` are all there and that
/// every row it holds has the file's values. Returns the rows held.
fn check(db: &std::path::Path, synced_batches: u64) -> u64 {
    let store =
        mesh_feature_store::FeatureStore::open(db, &views()).expect("reopens after SIGKILL");
    let mut per_batch = vec![0usize; (ROWS as usize).div_ceil(BATCH)];
    for row in store.scan_view("card").unwrap() {
        let row = row.unwrap();
        let EntityKey::Int64(i) = row.key else {
            panic!("int keys")
        };
        assert_eq!(
            row.values[0],
            Some(Value::F32(i as f32 + 0.5)),
            "row {i} intact"
        );
        assert_eq!(row.values[1], Some(Value::I64(i * 3)));
        per_batch[i as usize / BATCH] += 1;
    }
    for (b, n) in per_batch.iter().enumerate().take(synced_batches as usize) {
        assert_eq!(
            *n, BATCH,
            "batch {b} was reported synced but {n} of its {BATCH} rows are there"
        );
    }
    per_batch.iter().sum::<usize>() as u64
}

#[test]
fn sigkill_during_ingest_loses_no_synced_batch_and_leaves_no_torn_row() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.csv");
    make_file(&file, fresh());

    // Synced batches: every reported batch must survive.
    let db = dir.path().join("db-sync");
    let (reported, done) = run_and_kill(&db, &file, true, 15);
    assert!(!done && reported >= 15, "killed mid-ingest");
    let present = check(&db, reported);
    eprintln!("sync: reported {reported} batches, {present} rows present after reopen");

    // Buffered batches (sled's background flush only): no guarantee which rows
    // survive, but each that does is whole.
    let db = dir.path().join("db-buffered");
    let (reported, done) = run_and_kill(&db, &file, false, 40);
    assert!(!done, "killed mid-ingest");
    let present = check(&db, 0);
    eprintln!("buffered: reported {reported} batches, {present} rows present after reopen");
}
