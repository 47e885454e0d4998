//! `FeatureStore`: opening sled, the view registry, and the write path.
//!
//! Reads live in `lookup.rs`; file ingest in `ingest/`. All writes go through
//! [`FeatureStore::write_rows`], which enforces the event-time rule under one
//! in-process write lock: sled allows one process per database (a lock file), so
//! that lock serialises every writer and "read the stored event time, then write"
//! cannot race with another writer.
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::config::ViewsConfig;
use crate::encoding::{self, decode_event_time, encode_key, encode_value};
use crate::error::{FeatureStoreError, OpenFailure, Result};
use crate::metrics as m;
use crate::registry::{self, ViewInfo};
use crate::types::{Durability, EntityKey, KeyType, Micros, Row, Value};

pub const ROWS_TREE: &str = "rows";
/// Longest accepted string key, in bytes: keys are copied into every sled node
/// they pass through, and no real join key comes near this.
pub const MAX_STRING_KEY_BYTES: usize = 1024;

/// Request-size limits, applied to in-process calls and (separately configurable)
/// to gRPC calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most entity keys one lookup may fetch, counted as rows x views (one sled
    /// read each).
    pub max_keys_per_lookup: usize,
    /// Most rows one push may carry.
    pub max_rows_per_push: usize,
    /// How far ahead of this host's clock a written row's event time may be. A row
    /// dated further ahead would win every later event-time comparison and freeze
    /// its key, so it is refused (and counted), never stored. Covers clock skew
    /// between producers and this host.
    pub max_future_skew: std::time::Duration,
}

/// Default of [`Limits::max_future_skew`]: five minutes.
pub const DEFAULT_MAX_FUTURE_SKEW: std::time::Duration = std::time::Duration::from_secs(300);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys_per_lookup: 4096,
            max_rows_per_push: 10_000,
            max_future_skew: DEFAULT_MAX_FUTURE_SKEW,
        }
    }
}

/// How a lookup's keys are fetched from sled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchStrategy {
    /// One blocking task reads all keys, sorted by key bytes (neighbouring keys share
    /// sled nodes, which stay hot in cache). Measured faster on 2 cores: see README.
    KeyOrder,
    /// Split the keys of a lookup into up to `tasks` blocking tasks that read in
    /// parallel, each in key order. Only batches of at least `min_keys` keys are split.
    Parallel {
        tasks: NonZeroUsize,
        min_keys: usize,
    },
}

/// Store settings beyond the views file.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// sled page cache, bytes. 1M entities x 16 f32 is about 200 MB stored.
    pub cache_capacity_bytes: u64,
    /// sled's background flush interval: the loss window of `Durability::Buffered`
    /// writes. `None` disables periodic flushing (only explicit syncs persist).
    pub flush_every_ms: Option<u64>,
    pub limits: Limits,
    pub fetch: FetchStrategy,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_capacity_bytes: 512 * 1024 * 1024,
            flush_every_ms: Some(500),
            limits: Limits::default(),
            fetch: FetchStrategy::KeyOrder,
        }
    }
}

/// Where a write came from, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    Push,
    Ingest,
}

impl WritePath {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WritePath::Push => "push",
            WritePath::Ingest => "ingest",
        }
    }
}

/// Outcome of one atomic batch write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteReport {
    pub rows_written: u64,
    /// Rows not written because the store holds a newer row for the key.
    pub rows_skipped_older: u64,
    /// Whether the data was fsynced before returning.
    pub synced: bool,
}

/// The online feature store. Cheap to clone (one shared handle).
#[derive(Clone)]
pub struct FeatureStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) db: sled::Db,
    pub(crate) rows: sled::Tree,
    pub(crate) views: Vec<ViewInfo>,
    by_name: HashMap<String, usize>,
    pub(crate) path: PathBuf,
    pub(crate) options: StoreOptions,
    write_lock: Mutex<()>,
    last_size_report: AtomicI64,
}

impl std::fmt::Debug for FeatureStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureStore")
            .field("path", &self.inner.path)
            .field(
                "views",
                &self.inner.views.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One validated row of a write: encoded key, event time, encoded value.
type EncodedRow = (Vec<u8>, Micros, Vec<u8>);

impl FeatureStore {
    /// Opens (or creates) the store at `path` with default options and records the
    /// views of `views`. Blocking: call it before serving, or in `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>, views: &ViewsConfig) -> Result<Self> {
        Self::open_with(path, views, StoreOptions::default())
    }

    pub fn open_with(
        path: impl AsRef<Path>,
        views: &ViewsConfig,
        options: StoreOptions,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let db = open_sled(&path, &options)?;
        let rows = db.open_tree(ROWS_TREE).map_err(|e| open_error(&path, e))?;
        let views = registry::reconcile(&db, views, &path)?;
        let by_name = views
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name.clone(), i))
            .collect();
        tracing::info!(path = %path.display(), views = views.len(), "feature store opened");
        let store = FeatureStore {
            inner: Arc::new(Inner {
                db,
                rows,
                views,
                by_name,
                path,
                options,
                write_lock: Mutex::new(()),
                last_size_report: AtomicI64::new(i64::MIN),
            }),
        };
        store.report_size(true);
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// Live views, in the views file's order.
    pub fn views(&self) -> &[ViewInfo] {
        &self.inner.views
    }

    pub fn view(&self, name: &str) -> Result<&ViewInfo> {
        self.inner.view_index(name).map(|i| &self.inner.views[i])
    }

    /// Writes rows of one view as one atomic batch: after a crash either all of the
    /// batch's written rows are visible or none. A row older than the stored row
    /// for its key is skipped (event-time order wins; equal times: the later write
    /// wins, so replays are idempotent). Within the batch, the newest row per key
    /// is kept. Every row is validated first: an invalid row rejects the whole
    /// batch and nothing is written. Blocking.
    pub fn write_rows(
        &self,
        view: &str,
        rows: &[Row],
        durability: Durability,
    ) -> Result<WriteReport> {
        self.write_rows_from(view, rows, durability, WritePath::Push)
    }

    /// [`Self::write_rows`] off the async runtime.
    pub async fn push(
        &self,
        view: &str,
        rows: Vec<Row>,
        durability: Durability,
    ) -> Result<WriteReport> {
        let this = self.clone();
        let view = view.to_owned();
        let start = Instant::now();
        let out = tokio::task::spawn_blocking(move || {
            this.write_rows_from(&view, &rows, durability, WritePath::Push)
        })
        .await
        .map_err(|e| FeatureStoreError::Internal(format!("push task failed: {e}")))?;
        m::record_push_latency(durability, start.elapsed());
        out
    }

    /// [`Self::write_rows`] for a push or an ingest batch (`path`: whether the push row
    /// limit applies, and the metrics label).
    pub(crate) fn write_rows_from(
        &self,
        view: &str,
        rows: &[Row],
        durability: Durability,
        path: WritePath,
    ) -> Result<WriteReport> {
        let v = self.view(view)?;
        let encoded = self.validate_and_encode(v, view, rows, path)?;
        let duplicates = (rows.len() - encoded.len()) as u64;

        let mut report = WriteReport {
            rows_skipped_older: duplicates,
            ..Default::default()
        };
        {
            let _writer = self.inner.write_lock.lock();
            let mut batch = sled::Batch::default();
            for (key, event_time, value) in encoded {
                if let Some(old) = self.inner.rows.get(&key)? {
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
                batch.insert(key, value);
                report.rows_written += 1;
            }
            self.inner.rows.apply_batch(batch)?;
        }
        if durability == Durability::Sync {
            self.inner.db.flush()?;
            report.synced = true;
        }
        m::record_rows_written(
            view,
            path.as_str(),
            report.rows_written,
            report.rows_skipped_older,
        );
        self.report_size(false);
        Ok(report)
    }

    /// Checks a write's size, validates every row and encodes it, keeping the newest row
    /// per key (all before the write lock is taken or sled is touched).
    fn validate_and_encode(
        &self,
        v: &ViewInfo,
        view: &str,
        rows: &[Row],
        path: WritePath,
    ) -> Result<Vec<EncodedRow>> {
        if rows.is_empty() {
            return Err(FeatureStoreError::InvalidArgument(format!(
                "write to view {view:?} has no rows"
            )));
        }
        if path == WritePath::Push && rows.len() > self.inner.options.limits.max_rows_per_push {
            return Err(FeatureStoreError::LimitExceeded {
                what: "rows in one push",
                got: rows.len(),
                limit: self.inner.options.limits.max_rows_per_push,
                setting: "max_rows_per_push",
            });
        }
        // Validate and encode everything before taking the lock or touching sled.
        let skew = self.inner.options.limits.max_future_skew;
        let horizon = crate::types::now_micros()
            .saturating_add(i64::try_from(skew.as_micros()).unwrap_or(i64::MAX));
        if let Some((i, row)) = rows
            .iter()
            .enumerate()
            .find(|(_, r)| r.event_time > horizon)
        {
            m::record_rows_refused(view, path.as_str(), "future_event_time", 1);
            return Err(FeatureStoreError::InvalidArgument(format!(
                "row {i}: event time {} is more than {} s ahead of this host's clock \
                 ({}; max_future_skew); nothing of this write was stored",
                crate::ingest::time::format_micros(row.event_time),
                skew.as_secs(),
                crate::ingest::time::format_micros(crate::types::now_micros()),
            )));
        }
        let mut encoded: Vec<EncodedRow> = Vec::with_capacity(rows.len());
        let mut index: HashMap<Vec<u8>, usize> = HashMap::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            validate_row(v, row)
                .map_err(|what| FeatureStoreError::InvalidArgument(format!("row {i}: {what}")))?;
            let mut key = Vec::with_capacity(16);
            encode_key(v.id, &row.key, &mut key);
            let value = encode_value(
                row.event_time,
                v.features
                    .iter()
                    .zip(&row.values)
                    .filter_map(|(f, val)| val.as_ref().map(|val| (f.id, val)))
                    .collect::<Vec<_>>()
                    .into_iter(),
            );
            match index.get(&key) {
                Some(&j) if encoded[j].1 > row.event_time => {}
                Some(&j) => encoded[j] = (key, row.event_time, value),
                None => {
                    index.insert(key.clone(), encoded.len());
                    encoded.push((key, row.event_time, value));
                }
            }
        }
        Ok(encoded)
    }

    /// Forces everything written so far to disk (fsync). Returns bytes flushed.
    pub fn flush(&self) -> Result<usize> {
        Ok(self.inner.db.flush()?)
    }

    /// Reads one entity's stored row (all live features), ignoring freshness.
    pub fn read_row(&self, view: &str, key: &EntityKey) -> Result<Option<Row>> {
        let v = self.view(view)?;
        let mut k = Vec::new();
        encode_key(v.id, key, &mut k);
        let Some(bytes) = self.inner.rows.get(&k)? else {
            return Ok(None);
        };
        Ok(Some(decode_row(v, key.clone(), &bytes)?))
    }

    /// Every stored row of a view, in key order (a prefix scan). Blocking; meant for
    /// checks, exports and tests, not for the serving path.
    pub fn scan_view(&self, view: &str) -> Result<impl Iterator<Item = Result<Row>> + '_> {
        let v = self.view(view)?;
        Ok(self
            .inner
            .rows
            .scan_prefix(encoding::view_prefix(v.id))
            .map(move |item| {
                let (k, bytes) = item?;
                let (_, key) =
                    encoding::decode_key(&k).ok_or_else(|| FeatureStoreError::Decode {
                        view: v.name.clone(),
                        what: "bad key".into(),
                    })?;
                decode_row(v, key, &bytes)
            }))
    }

    /// Bytes the database takes on disk.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.inner.db.size_on_disk()?)
    }

    // Walking the files costs a few syscalls; do it at most every 10 s.
    fn report_size(&self, force: bool) {
        let now = crate::types::now_micros();
        let last = self.inner.last_size_report.load(Ordering::Relaxed);
        if !force && now.saturating_sub(last) < 10_000_000 {
            return;
        }
        if self
            .inner
            .last_size_report
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            if let Ok(size) = self.inner.db.size_on_disk() {
                m::record_store_size(size);
            }
        }
    }
}

impl Inner {
    pub(crate) fn view_index(&self, name: &str) -> Result<usize> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| FeatureStoreError::UnknownView(name.to_owned()))
    }
}

fn validate_row(v: &ViewInfo, row: &Row) -> std::result::Result<(), String> {
    validate_key(v, &row.key)?;
    if row.values.len() != v.features.len() {
        return Err(format!(
            "has {} values, view {:?} has {} features",
            row.values.len(),
            v.name,
            v.features.len()
        ));
    }
    for (f, val) in v.features.iter().zip(&row.values) {
        let Some(val) = val else { continue };
        if val.feature_type() != f.dtype {
            return Err(format!(
                "feature {:?} is {}, got a {} value",
                f.name,
                f.dtype,
                val.feature_type()
            ));
        }
        // NaN and infinities would reach models as if they were measurements.
        let finite = match val {
            Value::F32(x) => x.is_finite(),
            Value::F64(x) => x.is_finite(),
            Value::F32Vector(xs) => xs.iter().all(|x| x.is_finite()),
            _ => true,
        };
        if !finite {
            return Err(format!("feature {:?} is NaN or infinite", f.name));
        }
        match val {
            Value::String(s) if s.len() > u32::MAX as usize => {
                return Err(format!("feature {:?} is too long", f.name))
            }
            Value::F32Vector(xs) if xs.len() > (u32::MAX / 4) as usize => {
                return Err(format!("feature {:?} is too long", f.name))
            }
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn validate_key(v: &ViewInfo, key: &EntityKey) -> std::result::Result<(), String> {
    match (v.key_type, key) {
        (KeyType::Int64, EntityKey::Int64(_)) => Ok(()),
        (KeyType::String, EntityKey::String(s)) if s.is_empty() => {
            Err(format!("empty {} key", v.join_key))
        }
        (KeyType::String, EntityKey::String(s)) if s.len() > MAX_STRING_KEY_BYTES => Err(format!(
            "{} key longer than {MAX_STRING_KEY_BYTES} bytes",
            v.join_key
        )),
        (KeyType::String, EntityKey::String(_)) => Ok(()),
        (want, got) => Err(format!(
            "{} is a {want} key, got a {} key",
            v.join_key,
            got.key_type()
        )),
    }
}

fn decode_row(v: &ViewInfo, key: EntityKey, bytes: &[u8]) -> Result<Row> {
    let mut values: Vec<Option<Value>> = vec![None; v.features.len()];
    let event_time = encoding::decode_value(bytes, |id, field| {
        if let Some(i) = v.features.iter().position(|f| f.id == id) {
            values[i] = Some(field.to_value());
        }
    })
    .map_err(|what| FeatureStoreError::Decode {
        view: v.name.clone(),
        what,
    })?;
    Ok(Row {
        key,
        event_time,
        values,
    })
}

fn open_sled(path: &Path, options: &StoreOptions) -> Result<sled::Db> {
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
