//! The sled backend (the embedded default): opening the database, and the write
//! that applies the event-time rule under one in-process write lock. sled allows
//! one process per database (a lock file), so that lock serialises every writer
//! and "read the stored event time, then write" cannot race with another writer.
//!
//! Rows are written one `insert` each, never with sled's `apply_batch`: a batch takes
//! a lock of sled's that is global to the process, and every read of every tree
//! waits for it until the whole batch is in (with pushes of 1,000 random rows into a
//! store of 1M entities, the slowest 100-key lookups went from 4-6 ms to 9-14 ms).
//! Each row is written whole, and readers run alongside; a write is atomic per row,
//! not per batch, as on Redis.
//!
//! In front of the tree, a cache of stored rows (`StoreOptions::row_cache_max_bytes`,
//! `cache.rs`): every write here marks the keys it writes from before sled applies
//! them until after, and since no other process can write the database, a cached
//! row is the stored row.
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cache::{Cache, CachedBytes};
use crate::config::ViewsConfig;
use crate::encoding::decode_event_time;
use crate::error::{FeatureStoreError, OpenFailure, Result};
use crate::metrics as m;
use crate::registry::{self, ViewInfo};
use crate::store::{EncodedRow, StoreOptions, WriteReport};
use crate::types::Durability;

pub const ROWS_TREE: &str = "rows";

pub(crate) struct SledStore {
    pub(crate) db: sled::Db,
    pub(crate) rows: sled::Tree,
    pub(crate) path: PathBuf,
    /// Stored rows by key, in front of `rows` (see the module's note).
    pub(crate) cache: Cache<CachedBytes>,
    write_lock: Mutex<()>,
    last_size_report: AtomicI64,
}

impl SledStore {
    /// Opens (or creates) the database at `path` and reconciles its registry with
    /// `views`. Blocking.
    pub(crate) fn open(
        path: &Path,
        views: &ViewsConfig,
        options: &StoreOptions,
    ) -> Result<(Self, Vec<ViewInfo>)> {
        let path = path.to_path_buf();
        let db = open_sled(&path, options)?;
        let rows = db.open_tree(ROWS_TREE).map_err(|e| open_error(&path, e))?;
        let live = registry::reconcile(&db, views, &path)?;
        Ok((
            SledStore {
                db,
                rows,
                path,
                cache: Cache::new(options.row_cache_max_bytes, std::time::Duration::MAX),
                write_lock: Mutex::new(()),
                last_size_report: AtomicI64::new(i64::MIN),
            },
            live,
        ))
    }

    /// Writes validated rows, each whole (see the module's note), skipping each row
    /// older than the stored row of its key. Blocking.
    pub(crate) fn write(
        &self,
        view: &str,
        encoded: Vec<EncodedRow>,
        duplicates: u64,
        durability: Durability,
    ) -> Result<WriteReport> {
        let mut report = WriteReport {
            rows_skipped_older: duplicates,
            ..Default::default()
        };
        {
            let _writer = self.write_lock.lock();
            let mut writes: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(encoded.len());
            let caching = self.cache.enabled();
            let mut written: Vec<Vec<u8>> = Vec::new();
            for (key, event_time, value) in encoded {
                if let Some(old) = self.rows.get(&key)? {
                    match decode_event_time(&old) {
                        Ok(stored) if stored > event_time => {
                            report.rows_skipped_older += 1;
                            continue;
                        }
                        Ok(_) => {}
                        // An undecodable stored value cannot be newer in any way we can
                        // prove; replacing it with a good one repairs the key.
                        Err(what) => {
                            tracing::warn!(view, %what, "replacing undecodable stored value")
                        }
                    }
                }
                if caching {
                    written.push(key.clone());
                }
                writes.push((key, value));
            }
            // From here until sled has every row, lookups of these keys read sled and
            // cache nothing (see `cache.rs`).
            let _writing = self.cache.begin_write(written);
            let rows = writes.len() as u64;
            for (key, value) in writes {
                if let Err(source) = self.rows.insert(key, value) {
                    return Err(FeatureStoreError::WriteInterrupted {
                        view: view.to_owned(),
                        written: report.rows_written,
                        rows,
                        source,
                    });
                }
                report.rows_written += 1;
            }
        }
        if durability == Durability::Sync {
            self.db.flush()?;
            report.synced = true;
        }
        Ok(report)
    }

    // Walking the files costs a few syscalls; do it at most every 10 s.
    pub(crate) fn report_size(&self, force: bool) {
        let now = crate::types::now_micros();
        let last = self.last_size_report.load(Ordering::Relaxed);
        if !force && now.saturating_sub(last) < 10_000_000 {
            return;
        }
        if self
            .last_size_report
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            if let Ok(size) = self.db.size_on_disk() {
                m::record_store_size(size);
            }
        }
    }
}

/// How long an open waits for sled's lock on the database before it reports
/// [`OpenFailure::LockHeld`]. A store that this process has just dropped keeps its lock
/// until sled's background I/O threads let go of the file, a few milliseconds later:
/// a reopen right after a close (a test, a tool that reopens) must not fail on that.
/// A store held by another process still fails, after this wait.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// Opens sled at `path`, retrying while its lock is held, for at most [`LOCK_WAIT`].
fn open_sled(path: &Path, options: &StoreOptions) -> Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match open_sled_once(path, options) {
            Err(FeatureStoreError::Open {
                kind: OpenFailure::LockHeld,
                ..
            }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            opened => return opened,
        }
    }
}

fn open_sled_once(path: &Path, options: &StoreOptions) -> Result<sled::Db> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(options.cache_capacity_bytes)
        .flush_every_ms(options.flush_every_ms);
    // sled 0.34 can panic instead of returning an error on some damaged files; a
    // start must fail with a message, never a panic.
    match std::panic::catch_unwind(AssertUnwindSafe(|| config.open())) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(open_error(path, e)),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "sled panicked while recovering".into());
            Err(FeatureStoreError::Open {
                path: path.to_path_buf(),
                kind: OpenFailure::Corrupt,
                detail,
            })
        }
    }
}

fn open_error(path: &Path, e: sled::Error) -> FeatureStoreError {
    let detail = e.to_string();
    let kind = match &e {
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            OpenFailure::LockHeld
        }
        sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => OpenFailure::LockHeld,
        sled::Error::Corruption { .. } | sled::Error::ReportableBug(_) => OpenFailure::Corrupt,
        sled::Error::Unsupported(_) => OpenFailure::Corrupt,
        _ => OpenFailure::Io,
    };
    FeatureStoreError::Open {
        path: path.to_path_buf(),
        kind,
        detail,
    }
}
