//! Materialisation: loading a view's rows from a CSV or Parquet file.
//!
//! The file has a column named after the view's join key, one named after its
//! timestamp field, and one per feature (matched by name; other columns are
//! ignored and reported). Rows are written in batches of
//! `IngestOptions::batch_rows` through the same path as pushes (each row whole; a
//! batch is validated as a whole but not written atomically), so the event-time
//! rule holds (an older row never overwrites a newer one) and re-running an ingest
//! is harmless: it completes whatever a crash left out. A bad row stops the ingest
//! with its line/row number; the batches before it stay written. The store is
//! flushed (fsync) at the end.
//!
//! A NaN float in a file is read as null (data frames write missing values so).
//! Timestamps: RFC 3339 text (`2024-05-01T12:00:00Z`, offsets and fractions
//! allowed), or numbers of Unix seconds, milliseconds or microseconds (fractions
//! allowed) as [`IngestOptions::timestamp_unit`] says (the view's
//! `timestamp_unit`, seconds by default); in Parquet also any `Timestamp` column
//! (unit honoured, time zone ignored: Arrow stores UTC). The file formats are
//! described in the crate's README ("File formats").
//!
//! [`read_file_observed`] reads a file into the same batches without a store, for
//! a writer of the caller's choosing (`mesh features ingest --addr` pushes them to
//! a running store over gRPC).
use std::path::Path;
use std::time::{Duration, Instant};

pub use crate::config::TimestampUnit;
use crate::error::{FeatureStoreError, Result};
use crate::registry::ViewInfo;
use crate::store::{FeatureStore, WritePath, WriteReport};
use crate::types::{Durability, Row, Value};

mod csv_file;
mod parquet_file;
pub(crate) mod time;

pub use time::{parse_timestamp, parse_timestamp_in};

/// How to ingest a file.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Rows per batch (validated as a whole, then written row by row).
    pub batch_rows: usize,
    /// fsync after every batch (each committed batch survives a crash) instead of
    /// only at the end (a crash loses rows of the last flush interval, each row
    /// whole or not at all; running the ingest again restores them).
    pub sync_each_batch: bool,
    /// Accept a file that lacks some feature columns (those features are written as
    /// null). Off by default: a missing column usually means the wrong file, and a
    /// row replaces the whole stored row.
    pub allow_missing_columns: bool,
    /// The unit of numeric timestamps (integer or decimal columns, and numbers in
    /// CSV cells). Set it from the view's `timestamp_unit` in the views file
    /// ([`crate::ViewConfig::timestamp_unit`]) unless the caller was told
    /// otherwise; seconds by default.
    pub timestamp_unit: TimestampUnit,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            batch_rows: 10_000,
            sync_each_batch: false,
            allow_missing_columns: false,
            timestamp_unit: TimestampUnit::Seconds,
        }
    }
}

/// What an ingest did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestReport {
    pub view: String,
    pub rows_read: u64,
    pub rows_written: u64,
    /// Rows not written because the store (or a later row of the same batch) held
    /// a newer event time for the key.
    pub rows_skipped_older: u64,
    pub batches: u64,
    pub elapsed: Duration,
    /// rows_read / elapsed.
    pub rows_per_sec: f64,
    /// File columns that are not the key, the timestamp or a feature of the view.
    pub ignored_columns: Vec<String>,
    /// Features of the view the file lacks (written as null).
    pub missing_columns: Vec<String>,
}

/// A batch that has been committed to the store (and fsynced if `synced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCommitted {
    pub batch_index: u64,
    pub rows_in_batch: usize,
    pub rows_read_total: u64,
    pub synced: bool,
    /// How far the reader is through the file, in `unit`s (for a progress bar).
    pub position: u64,
    /// The file's size in `unit`s.
    pub total: u64,
    pub unit: ProgressUnit,
}

/// What [`BatchCommitted::position`] counts: CSV is read by bytes, Parquet by rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressUnit {
    Bytes,
    Rows,
}

/// Where each view column is in the file.
pub(crate) struct ColumnMap {
    pub key: usize,
    pub timestamp: usize,
    /// Per live feature of the view, in view order: its file column, if any.
    pub features: Vec<Option<usize>>,
    pub ignored: Vec<String>,
    pub missing: Vec<String>,
}

impl ColumnMap {
    pub(crate) fn new(
        v: &ViewInfo,
        names: &[String],
        opts: &IngestOptions,
        path: &Path,
    ) -> Result<Self> {
        let find = |n: &str| names.iter().position(|c| c == n);
        let err = |what: String| FeatureStoreError::Ingest {
            path: path.to_path_buf(),
            what,
        };
        let key = find(&v.join_key).ok_or_else(|| {
            err(format!(
                "no {:?} column (the join key of view {:?})",
                v.join_key, v.name
            ))
        })?;
        let timestamp = find(&v.timestamp_field).ok_or_else(|| {
            err(format!(
                "no {:?} column (the timestamp field of view {:?})",
                v.timestamp_field, v.name
            ))
        })?;
        let features: Vec<Option<usize>> = v.features.iter().map(|f| find(&f.name)).collect();
        let missing: Vec<String> = v
            .features
            .iter()
            .zip(&features)
            .filter(|(_, c)| c.is_none())
            .map(|(f, _)| f.name.clone())
            .collect();
        if !missing.is_empty() && !opts.allow_missing_columns {
            return Err(err(format!(
                "no column for feature(s) {missing:?} of view {:?}; pass allow_missing_columns to write them as null",
                v.name
            )));
        }
        let ignored = names
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != key && *i != timestamp && !features.contains(&Some(*i)))
            .map(|(_, n)| n.clone())
            .collect();
        Ok(ColumnMap {
            key,
            timestamp,
            features,
            ignored,
            missing,
        })
    }
}

/// Ingests `path` (`.csv`, or `.parquet`/`.pq`) into `view`. Blocking.
pub fn ingest_file(
    store: &FeatureStore,
    view: &str,
    path: impl AsRef<Path>,
    opts: &IngestOptions,
) -> Result<IngestReport> {
    ingest_file_observed(store, view, path, opts, |_| {})
}

/// [`ingest_file`], calling `on_batch` after each batch is committed.
pub fn ingest_file_observed(
    store: &FeatureStore,
    view: &str,
    path: impl AsRef<Path>,
    opts: &IngestOptions,
    on_batch: impl FnMut(&BatchCommitted),
) -> Result<IngestReport> {
    let v = store.view(view)?.clone();
    let durability = if opts.sync_each_batch {
        Durability::Sync
    } else {
        Durability::Buffered
    };
    let write = |rows: &[Row]| store.write_rows_from(&v.name, rows, durability, WritePath::Ingest);
    let report = read_file_observed(&v, path, opts, write, on_batch)?;
    // Whatever the per-batch setting, the ingest ends with everything on disk.
    store.flush()?;
    tracing::info!(
        view = %report.view, rows = report.rows_read, written = report.rows_written,
        skipped_older = report.rows_skipped_older, rows_per_sec = report.rows_per_sec as u64,
        "ingest finished"
    );
    Ok(report)
}

/// Reads `path` (`.csv`, or `.parquet`/`.pq`) as rows of `view` in batches of
/// `opts.batch_rows`, hands each batch to `write` (which says what it wrote), then
/// calls `on_batch`. The first error (a bad row, or one `write` returns) stops the
/// read; the batches before it stay written. `opts.sync_each_batch` is the
/// writer's business. Blocking.
pub fn read_file_observed(
    view: &ViewInfo,
    path: impl AsRef<Path>,
    opts: &IngestOptions,
    mut write: impl FnMut(&[Row]) -> Result<WriteReport>,
    mut on_batch: impl FnMut(&BatchCommitted),
) -> Result<IngestReport> {
    let path = path.as_ref();
    let v = view;
    if opts.batch_rows == 0 {
        return Err(FeatureStoreError::InvalidArgument(
            "batch_rows must be > 0".into(),
        ));
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let start = Instant::now();
    let mut report = IngestReport {
        view: v.name.clone(),
        rows_read: 0,
        rows_written: 0,
        rows_skipped_older: 0,
        batches: 0,
        elapsed: Duration::ZERO,
        rows_per_sec: 0.0,
        ignored_columns: Vec::new(),
        missing_columns: Vec::new(),
    };
    let reader = match ext.as_deref() {
        Some("csv") => csv_file::read,
        Some("parquet") | Some("pq") => parquet_file::read,
        _ => {
            return Err(FeatureStoreError::Ingest {
                path: path.to_path_buf(),
                what: "unknown file type: expected a .csv, .parquet or .pq file".into(),
            })
        }
    };
    // The file is read and parsed on its own thread while this one writes: the two
    // overlap. At most READ_AHEAD parsed batches wait between them.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(READ_AHEAD);
    let (mut total, mut unit) = (0, ProgressUnit::Rows);
    let (read, written) = std::thread::scope(|scope| {
        let reading = std::thread::Builder::new()
            .name("mesh-ingest-read".into())
            .spawn_scoped(scope, move || {
                let mut sink = Sink { tx };
                reader(path, v, opts, &mut sink)
            });
        let reading = match reading {
            Ok(h) => h,
            Err(e) => {
                return (
                    Err(FeatureStoreError::Internal(format!(
                        "starting the ingest reader thread: {e}"
                    ))),
                    Ok(()),
                )
            }
        };
        let mut written = Ok(());
        for msg in &rx {
            match msg {
                Msg::Start {
                    total: t,
                    unit: u,
                    ignored,
                    missing,
                } => {
                    (total, unit) = (t, u);
                    report.ignored_columns = ignored;
                    report.missing_columns = missing;
                }
                Msg::Batch(rows, position) => match write(&rows) {
                    Ok(w) => {
                        report.rows_read += rows.len() as u64;
                        report.rows_written += w.rows_written;
                        report.rows_skipped_older += w.rows_skipped_older;
                        let committed = BatchCommitted {
                            batch_index: report.batches,
                            rows_in_batch: rows.len(),
                            rows_read_total: report.rows_read,
                            synced: w.synced,
                            position,
                            total,
                            unit,
                        };
                        report.batches += 1;
                        on_batch(&committed);
                    }
                    Err(e) => {
                        written = Err(e);
                        break;
                    }
                },
            }
        }
        // Dropping the receiver stops the reader at its next batch.
        drop(rx);
        let read = reading.join().unwrap_or_else(|_| {
            Err(FeatureStoreError::Internal(
                "the ingest reader thread panicked".into(),
            ))
        });
        (read, written)
    });
    // A failed write is the cause; the reader then only saw the channel close.
    written?;
    read?;
    report.elapsed = start.elapsed();
    report.rows_per_sec = report.rows_read as f64 / report.elapsed.as_secs_f64().max(1e-9);
    Ok(report)
}

/// Parsed batches that may wait between the reader thread and the writer: with one
/// being parsed and one being written, at most `READ_AHEAD + 2` batches of
/// `batch_rows` rows are in memory.
const READ_AHEAD: usize = 1;

/// What the reader thread sends the writer.
enum Msg {
    /// The file's size (bytes or rows) and its columns, once the reader knows them.
    Start {
        total: u64,
        unit: ProgressUnit,
        ignored: Vec<String>,
        missing: Vec<String>,
    },
    /// A batch of rows and the position in the file after it.
    Batch(Vec<Row>, u64),
}

/// Receives batches from a file reader (on the reader thread) and hands them to the
/// writer.
pub(crate) struct Sink {
    tx: std::sync::mpsc::SyncSender<Msg>,
}

impl Sink {
    /// Records the file's size (bytes or rows) once the reader knows it.
    pub(crate) fn start(&mut self, total: u64, unit: ProgressUnit, map: &ColumnMap) {
        if !map.ignored.is_empty() {
            tracing::warn!(columns = ?map.ignored, "ingest ignores columns that are not in the view");
        }
        // A closed channel means the writer stopped; the next `write` says so.
        let _ = self.tx.send(Msg::Start {
            total,
            unit,
            ignored: map.ignored.clone(),
            missing: map.missing.clone(),
        });
    }

    pub(crate) fn write(&mut self, mut rows: Vec<Row>, position: u64) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        // Data frames write missing floats as NaN: in a file, NaN means null.
        for row in &mut rows {
            for v in &mut row.values {
                if matches!(v, Some(Value::F32(x)) if x.is_nan())
                    || matches!(v, Some(Value::F64(x)) if x.is_nan())
                {
                    *v = None;
                }
            }
        }
        self.tx
            .send(Msg::Batch(rows, position))
            .map_err(|_| FeatureStoreError::Internal("the ingest writer stopped".into()))
    }
}
