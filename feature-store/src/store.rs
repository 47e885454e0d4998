//! `FeatureStore`: opening a backend (sled, the embedded default, or Redis), the
//! view registry, and the write path shared by both.
//!
//! Reads live in `lookup.rs`; file ingest in `ingest/`; what differs per backend in
//! `sled_store.rs` and `redis_store/`. All writes go through
//! [`FeatureStore::write_rows`]: rows are validated, checked against the
//! future-time horizon and encoded here, once, and then each backend applies the
//! event-time rule atomically (sled under one in-process write lock, Redis in a
//! script per entity).
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::config::ViewsConfig;
use crate::encoding::{self, encode_key, encode_value};
use crate::error::{FeatureStoreError, Result};
use crate::metrics as m;
use crate::redis_store::{RedisOptions, RedisStore};
use crate::registry::ViewInfo;
use crate::sled_store::SledStore;
use crate::types::{Durability, EntityKey, KeyType, Micros, Row, Value};

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
    /// One reader takes all keys, sorted by key bytes (neighbouring keys share sled
    /// nodes, which stay hot in cache): the calling task, a few keys a turn, for a
    /// lookup of up to `StoreOptions::on_task_max_keys` keys, else one blocking task.
    /// Measured faster on 2 cores: see README.
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
    /// sled backend: sled reads a lookup on the calling async task makes at a time
    /// before it yields to the worker's other tasks (see `on_task_max_keys` for
    /// which lookups run there). A read of a cached key takes about 2 µs, so the
    /// default (16) holds a runtime worker for tens of µs between yields, less than a
    /// hop to another thread costs (measured in `benches/lookup.rs`: 10 keys at 3x the
    /// lookups/s without the hop; 100 keys, no row cache, with a writer: p99 in turns
    /// against a hop in the README). 0: every sled read hops to the blocking pool.
    pub inline_max_keys: usize,
    /// sled backend: bytes of stored rows cached in process in front of sled
    /// (estimated; oldest first out; 0, the default: no cache). A hit costs a hash lookup
    /// instead of sled's tree walk (measured in `benches/lookup.rs`). Every write
    /// of this process drops the keys it wrote, and sled allows no other writer,
    /// so cached rows never go stale. The Redis backend has its own
    /// (`RedisOptions::cache_max_bytes`).
    pub row_cache_max_bytes: usize,
    /// sled backend: lookups of at most this many keys (rows x views) run on the
    /// calling async task: the row cache's probe, when there is a cache (a hit costs
    /// well under 1 µs; 128 hold the worker for at most about 100 µs), then the sled
    /// reads of what it did not hold, `inline_max_keys` a turn. Larger lookups hop to
    /// the blocking pool as a whole. 0: only `inline_max_keys` decides (larger
    /// lookups hop).
    pub on_task_max_keys: usize,
}

/// Default of [`StoreOptions::on_task_max_keys`].
pub const DEFAULT_ON_TASK_MAX_KEYS: usize = 128;

/// Default of [`StoreOptions::row_cache_max_bytes`]: off. A cache that holds
/// the keys a workload reads again pays (2.7x the 100-key lookups/s over gRPC with
/// every entity cached); one far smaller than uniformly random keys costs more
/// than it saves (64 MiB over 1M entities: the in-process 100-key p99 went from
/// 0.83-0.87 ms to 1.1-1.35 ms). Size it to the hot set, from the hit metrics.
pub const DEFAULT_ROW_CACHE_MAX_BYTES: usize = 0;

/// Default of [`StoreOptions::inline_max_keys`].
pub const DEFAULT_INLINE_MAX_KEYS: usize = 16;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_capacity_bytes: 512 * 1024 * 1024,
            flush_every_ms: Some(500),
            limits: Limits::default(),
            fetch: FetchStrategy::KeyOrder,
            inline_max_keys: DEFAULT_INLINE_MAX_KEYS,
            row_cache_max_bytes: DEFAULT_ROW_CACHE_MAX_BYTES,
            on_task_max_keys: DEFAULT_ON_TASK_MAX_KEYS,
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

/// Outcome of one write.
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

/// Where the rows live. Everything above it (validation, the event-time rule's
/// inputs, lookup statuses, `max_age`, the gRPC service, ingest, push) is shared.
pub(crate) enum Backend {
    Sled(SledStore),
    Redis(RedisStore),
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    pub(crate) views: Vec<ViewInfo>,
    by_name: HashMap<String, usize>,
    pub(crate) options: StoreOptions,
    /// The lookup metrics' handles.
    pub(crate) meters: crate::metrics::LookupMeters,
    /// Each feature's `"view:feature"` name, by view and then feature position: the
    /// name of a lookup's column, shared by every answer instead of formatted in each.
    pub(crate) qualified: Vec<Vec<Arc<str>>>,
}

impl std::fmt::Debug for FeatureStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureStore")
            .field("backend", &self.describe())
            .field(
                "views",
                &self.inner.views.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One validated row of a write: encoded key (sled's layout: view id, key tag,
/// key bytes), event time, encoded value.
pub(crate) type EncodedRow = (Vec<u8>, Micros, Vec<u8>);

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
        let (sled, live) = SledStore::open(path.as_ref(), views, &options)?;
        let store = Self::from_parts(Backend::Sled(sled), live, options);
        if let Backend::Sled(s) = &store.inner.backend {
            s.report_size(true);
        }
        Ok(store)
    }

    /// Connects to Redis (one server or a cluster, see [`RedisOptions`]) and
    /// records the views there. Blocking (bounded by `redis.connect_timeout`): call
    /// it before serving, or in `spawn_blocking`. Lookups and pushes then never
    /// block a thread on the network.
    pub fn open_redis(
        views: &ViewsConfig,
        redis: RedisOptions,
        options: StoreOptions,
    ) -> Result<Self> {
        let (r, live) = RedisStore::open(views, redis, options.limits.max_future_skew)?;
        Ok(Self::from_parts(Backend::Redis(r), live, options))
    }

    fn from_parts(backend: Backend, views: Vec<ViewInfo>, options: StoreOptions) -> Self {
        let by_name = views
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name.clone(), i))
            .collect();
        let store = FeatureStore {
            inner: Arc::new(Inner {
                backend,
                meters: crate::metrics::LookupMeters::new(views.len()),
                qualified: views
                    .iter()
                    .map(|v| {
                        v.features
                            .iter()
                            .map(|f| Arc::from(format!("{}:{}", v.name, f.name)))
                            .collect()
                    })
                    .collect(),
                views,
                by_name,
                options,
            }),
        };
        tracing::info!(backend = %store.describe(), views = store.inner.views.len(), "feature store opened");
        store
    }

    /// The backend in words: `sled at <path>`, `redis at <url>` or
    /// `redis cluster at <urls>` (for logs; no credentials).
    pub fn describe(&self) -> String {
        match &self.inner.backend {
            Backend::Sled(s) => format!("sled at {}", s.path.display()),
            Backend::Redis(r) => r.describe(),
        }
    }

    /// The sled directory; `None` for a Redis store.
    pub fn path(&self) -> Option<&Path> {
        match &self.inner.backend {
            Backend::Sled(s) => Some(&s.path),
            Backend::Redis(_) => None,
        }
    }

    /// `"sled"` or `"redis"` (the metrics' `backend` label).
    pub fn backend_name(&self) -> &'static str {
        match &self.inner.backend {
            Backend::Sled(_) => "sled",
            Backend::Redis(_) => "redis",
        }
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

    /// Writes rows of one view, each row whole: a reader or a crash never sees part
    /// of a row, but may see part of a batch (rows are written one at a time, so
    /// that reads never wait for a batch; writing the rows again is safe). A row
    /// older than the stored row for its key is skipped (event-time order wins;
    /// equal times: the later write wins, so replays are idempotent). Within the
    /// batch, the newest row per key is kept. Every row is validated first: an
    /// invalid row rejects the whole batch and nothing is written. Blocking.
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
        let start = Instant::now();
        let out = match &self.inner.backend {
            Backend::Sled(_) => {
                let this = self.clone();
                let view = view.to_owned();
                tokio::task::spawn_blocking(move || {
                    this.write_rows_from(&view, &rows, durability, WritePath::Push)
                })
                .await
                .map_err(|e| FeatureStoreError::Internal(format!("push task failed: {e}")))?
            }
            Backend::Redis(r) => {
                let v = self.view(view)?;
                let encoded = self.validate_and_encode(v, view, &rows, WritePath::Push)?;
                let duplicates = (rows.len() - encoded.len()) as u64;
                let report = r.write(v, encoded, duplicates, WritePath::Push).await;
                self.after_write(view, WritePath::Push, report)
            }
        };
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
        let report = match &self.inner.backend {
            Backend::Sled(s) => s.write(view, encoded, duplicates, durability),
            Backend::Redis(r) => r.block_on(r.write(v, encoded, duplicates, path)),
        };
        self.after_write(view, path, report)
    }

    fn after_write(
        &self,
        view: &str,
        path: WritePath,
        report: Result<WriteReport>,
    ) -> Result<WriteReport> {
        let report = report?;
        m::record_rows_written(
            view,
            path.as_str(),
            report.rows_written,
            report.rows_skipped_older,
        );
        if let Backend::Sled(s) = &self.inner.backend {
            s.report_size(false);
        }
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
    /// A Redis store has nothing to flush here (its durability is the server's:
    /// `appendonly`/`appendfsync`): 0.
    pub fn flush(&self) -> Result<usize> {
        match &self.inner.backend {
            Backend::Sled(s) => Ok(s.db.flush()?),
            Backend::Redis(_) => Ok(0),
        }
    }

    /// Reads one entity's stored row (all live features), ignoring freshness and
    /// any cache. Blocking.
    pub fn read_row(&self, view: &str, key: &EntityKey) -> Result<Option<Row>> {
        let v = self.view(view)?;
        let bytes = match &self.inner.backend {
            Backend::Sled(s) => {
                let mut k = Vec::new();
                encode_key(v.id, key, &mut k);
                s.rows.get(&k)?.map(|b| b.to_vec())
            }
            Backend::Redis(r) => r.block_on(r.read_one(v.id, key))?,
        };
        bytes.map(|b| decode_row(v, key.clone(), &b)).transpose()
    }

    /// Every stored row of a view, in key order for sled (a prefix scan), in no
    /// particular order for Redis (SCAN on every master). Blocking; meant for
    /// checks, exports and tests, not for the serving path.
    pub fn scan_view(&self, view: &str) -> Result<Box<dyn Iterator<Item = Result<Row>> + '_>> {
        let v = self.view(view)?;
        match &self.inner.backend {
            Backend::Sled(s) => Ok(Box::new(
                s.rows
                    .scan_prefix(encoding::view_prefix(v.id))
                    .map(move |item| {
                        let (k, bytes) = item?;
                        let (_, key) =
                            encoding::decode_key(&k).ok_or_else(|| FeatureStoreError::Decode {
                                view: v.name.clone(),
                                what: "bad key".into(),
                            })?;
                        decode_row(v, key, &bytes)
                    }),
            )),
            Backend::Redis(r) => {
                let rows = r.block_on(r.scan_view(v))?;
                Ok(Box::new(
                    rows.into_iter()
                        .map(move |(key, bytes)| decode_row(v, key, &bytes)),
                ))
            }
        }
    }

    /// Estimated bytes the in-process cache holds (sled: the row cache; Redis: the
    /// decoded-row cache); also the `mesh_features_cache_bytes` gauge.
    pub fn cache_bytes(&self) -> usize {
        match &self.inner.backend {
            Backend::Sled(s) => s.cache.bytes(),
            Backend::Redis(r) => r.cache.bytes(),
        }
    }

    /// Bytes the database takes on disk (sled); 0 for Redis.
    pub fn size_on_disk(&self) -> Result<u64> {
        match &self.inner.backend {
            Backend::Sled(s) => Ok(s.db.size_on_disk()?),
            Backend::Redis(_) => Ok(0),
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

pub(crate) fn decode_row(v: &ViewInfo, key: EntityKey, bytes: &[u8]) -> Result<Row> {
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
