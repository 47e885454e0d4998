//! The Redis backend: one server or a Redis Cluster, through the `redis` crate's
//! async clients, with an in-process cache of decoded rows in front (`cache.rs`).
//!
//! - Key layout: `keys.rs`. Batched round trips: `conn.rs`. Lookups: `lookup.rs`.
//! - Writes: one Lua script per entity ([`WRITE_SCRIPT`]) applies the event-time
//!   rule atomically in Redis, so several mesh processes may write one store.
//! - Every network step runs on the store's own small runtime (one thread,
//!   `mesh-redis`), so async callers never block a thread on the network and the
//!   blocking calls (`write_rows`, `read_row`, ingest) work from any thread.
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::cache::Cache;
use crate::config::ViewsConfig;
use crate::encoding;
use crate::error::{FeatureStoreError, Result};
use crate::metrics as m;
use crate::registry::{self, Recorded, ViewInfo};
use crate::store::{EncodedRow, WritePath, WriteReport};
use crate::types::EntityKey;

mod conn;
pub(crate) mod keys;
pub(crate) mod lookup;

use conn::Conn;
pub(crate) use conn::Failure;
use keys::{entity_key, KeyRef, FIELD_VALUE};

/// Where the Redis store is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, `redis://host:port[/db]`.
    Server(String),
    /// A Redis Cluster: some of its nodes, `redis://host:port` each; the rest are
    /// found from them.
    Cluster(Vec<String>),
}

/// Settings of the Redis backend (`[features]` keys `redis_url`, `redis_cluster`,
/// `redis_key_prefix`, `lookup_budget`, `redis_write_timeout`,
/// `redis_connect_timeout`, `cache_max_bytes`, `cache_max_age`, `redis_password_file`).
#[derive(Debug, Clone, PartialEq)]
pub struct RedisOptions {
    pub target: RedisTarget,
    /// The password (Redis `AUTH`), read from a file by the caller so that it never
    /// sits in a URL or a config file; applies to every node of a cluster.
    pub password: Option<RedisPassword>,
    /// First part of every key; `[A-Za-z0-9_-]`, 1-64 characters.
    pub key_prefix: String,
    /// How long a lookup waits for Redis. Past it, the entities Redis did not
    /// answer come from the cache as OUTSIDE_MAX_AGE, or are UNAVAILABLE; a lookup
    /// never fails for it.
    pub lookup_budget: Duration,
    /// How long a write (push, ingest batch) waits for Redis before failing.
    pub write_timeout: Duration,
    /// How long opening the store waits for Redis (connect, read the registry).
    pub connect_timeout: Duration,
    /// Bytes of decoded rows the in-process cache may hold (0: no cache).
    pub cache_max_bytes: usize,
    /// How long a cached row answers lookups without asking Redis. Writes through
    /// this store invalidate at once; writes by other processes are seen after
    /// at most this long.
    pub cache_max_age: Duration,
}

pub const DEFAULT_KEY_PREFIX: &str = "mesh";
pub const DEFAULT_LOOKUP_BUDGET: Duration = Duration::from_millis(20);
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_CACHE_MAX_BYTES: usize = 64 << 20;
pub const DEFAULT_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

impl RedisOptions {
    pub fn new(target: RedisTarget) -> Self {
        RedisOptions {
            target,
            password: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            lookup_budget: DEFAULT_LOOKUP_BUDGET,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            cache_max_age: DEFAULT_CACHE_MAX_AGE,
        }
    }

    /// Checks the settings on their own; the message names the key.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let p = &self.key_prefix;
        if p.is_empty()
            || p.len() > 64
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "redis_key_prefix {p:?} must be 1-64 characters of [A-Za-z0-9_-]"
            ));
        }
        let urls: &[String] = match &self.target {
            RedisTarget::Server(u) => std::slice::from_ref(u),
            RedisTarget::Cluster(us) if us.is_empty() => {
                return Err("redis_cluster lists no nodes".into())
            }
            RedisTarget::Cluster(us) => us,
        };
        for u in urls {
            if self.password.is_some() && has_password(u) {
                return Err(format!(
                    "redis address {:?} carries a password and redis_password_file is set: \
                     keep the file",
                    redact(u)
                ));
            }
            if u.starts_with("rediss://") {
                return Err(format!(
                    "redis address {:?}: TLS to Redis (rediss://) is not built in; use \
                     redis:// on a trusted network",
                    redact(u)
                ));
            }
            if !u.starts_with("redis://") {
                return Err(format!(
                    "redis address {:?} must be a redis:// URL",
                    redact(u)
                ));
            }
        }
        for (key, d) in [
            ("lookup_budget", self.lookup_budget),
            ("redis_write_timeout", self.write_timeout),
            ("redis_connect_timeout", self.connect_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(60) {
                return Err(format!("{key} must be above 0 and at most 60s"));
            }
        }
        if self.cache_max_age > Duration::from_secs(3600) {
            return Err("cache_max_age must be at most 1h".into());
        }
        Ok(())
    }

    fn describe(&self) -> String {
        match &self.target {
            RedisTarget::Server(u) => format!("redis at {}", redact(u)),
            RedisTarget::Cluster(us) => format!(
                "redis cluster at {}",
                us.iter().map(|u| redact(u)).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// A Redis password. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisPassword(String);

impl RedisPassword {
    /// Most bytes a password may have.
    pub const MAX_LEN: usize = 4096;

    /// A password read from a file's contents: one trailing newline (`\n` or `\r\n`)
    /// is dropped, as `echo` and Kubernetes Secrets made with it add one; empty,
    /// longer than [`Self::MAX_LEN`], or holding other control characters is refused.
    pub fn from_file_contents(contents: &str) -> std::result::Result<Self, String> {
        let p = contents
            .strip_suffix('\n')
            .map(|p| p.strip_suffix('\r').unwrap_or(p))
            .unwrap_or(contents);
        if p.is_empty() {
            return Err("is empty".into());
        }
        if p.len() > Self::MAX_LEN {
            return Err(format!("holds more than {} bytes", Self::MAX_LEN));
        }
        if p.chars().any(char::is_control) {
            return Err("holds a control character (more than one line?)".into());
        }
        Ok(RedisPassword(p.to_owned()))
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for RedisPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisPassword(***)")
    }
}

/// Where a URL's credentials (`user[:secret]` of `redis://user:secret@host`) start
/// and end, when it has any.
fn credentials(url: &str) -> Option<(usize, usize)> {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => Some((s + 3, at)),
        _ => None,
    }
}

/// Whether a URL has a password (`redis://[user]:secret@host`).
fn has_password(url: &str) -> bool {
    credentials(url).is_some_and(|(from, to)| url[from..to].contains(':'))
}

/// A URL without its password (`redis://user:secret@h` -> `redis://user:***@h`).
fn redact(url: &str) -> String {
    match credentials(url) {
        Some((from, to)) => {
            let user = url[from..to].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..from], &url[to..])
        }
        None => url.to_owned(),
    }
}

/// Applies one row under the event-time rule, atomically.
/// `KEYS[1]`: the entity's hash. `ARGV[1]`: event time as `keys::time_field`, `ARGV[2]`:
/// the encoded row, `ARGV[3]`: max future skew (µs), `ARGV[4]`: event time (µs,
/// decimal). Returns 1 (written), 0 (the stored row is newer: skipped), -1 (dated
/// past the server clock's horizon: refused). Equal times: the later write wins,
/// so replays are idempotent (the sled rule).
pub const WRITE_SCRIPT: &str = r#"
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
if tonumber(ARGV[4]) > now_us + tonumber(ARGV[3]) then
  return -1
end
local stored = redis.call('HGET', KEYS[1], 't')
if stored and stored > ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 'v', ARGV[2])
return 1
"#;

/// Replaces the registry only if it still holds what was read (ARGV[1]; '' for
/// none): concurrent openers cannot lose each other's views.
const REGISTRY_CAS_SCRIPT: &str = r#"
local cur = redis.call('GET', KEYS[1])
if (cur == false and ARGV[1] == '') or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

pub(crate) struct Core {
    conn: Conn,
    pub(crate) opts: RedisOptions,
    write_sha: String,
}

pub(crate) struct RedisStore {
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pub(crate) core: Arc<Core>,
    pub(crate) cache: Cache,
    /// The max future skew of writes, µs (the store's `Limits`).
    max_future_skew_us: i64,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is refused inside an async context.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn backend_err(what: impl std::fmt::Display) -> FeatureStoreError {
    FeatureStoreError::Backend(what.to_string())
}

impl RedisStore {
    /// Connects and reconciles the views with the registry in Redis. Blocking.
    pub(crate) fn open(
        views: &ViewsConfig,
        opts: RedisOptions,
        max_future_skew: Duration,
    ) -> Result<(Self, Vec<ViewInfo>)> {
        opts.validate()
            .map_err(|what| FeatureStoreError::Config { what })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mesh-redis")
            .enable_all()
            .build()
            .map_err(|e| FeatureStoreError::Internal(format!("redis runtime: {e}")))?;
        let handle = rt.handle().clone();
        let o = opts.clone();
        let connect = async move {
            let conn = tokio::time::timeout(o.connect_timeout, connect(&o))
                .await
                .map_err(|_| {
                    format!(
                        "no connection within redis_connect_timeout ({:?})",
                        o.connect_timeout
                    )
                })?
                .map_err(|e| e.to_string())?;
            let sha = redis::Script::new(WRITE_SCRIPT).get_hash().to_owned();
            Ok::<_, String>(Core {
                conn,
                opts: o,
                write_sha: sha,
            })
        };
        let core = futures::executor::block_on(handle.spawn(connect))
            .map_err(|e| FeatureStoreError::Internal(e.to_string()))?
            .map_err(|e| backend_err(format!("cannot open {}: {e}", opts.describe())))?;
        let store = RedisStore {
            rt: Some(rt),
            handle,
            core: Arc::new(core),
            cache: Cache::new(opts.cache_max_bytes, opts.cache_max_age),
            max_future_skew_us: i64::try_from(max_future_skew.as_micros()).unwrap_or(i64::MAX),
        };
        let live = store.block_on(store.reconcile(views.clone()))?;
        Ok((store, live))
    }

    pub(crate) fn describe(&self) -> String {
        self.core.opts.describe()
    }

    /// Runs `f` to completion on the calling thread. The network work inside runs
    /// on the store's runtime, so this is safe from any thread (also one of another
    /// runtime, which it blocks for the duration).
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    /// Runs `f` on the store's runtime.
    async fn spawn<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        self.handle
            .spawn(f)
            .await
            .map_err(|e| FeatureStoreError::Internal(format!("redis task failed: {e}")))
    }

    async fn reconcile(&self, views: ViewsConfig) -> Result<Vec<ViewInfo>> {
        let core = self.core.clone();
        self.spawn(async move {
            let key = keys::registry_key(&core.opts.key_prefix);
            let deadline = core.opts.connect_timeout;
            let step = async {
                for _ in 0..20 {
                    let cur = core
                        .conn
                        .query(redis::cmd("GET").arg(&key))
                        .await
                        .map_err(backend_err)?;
                    let text = match cur {
                        Value::Nil => String::new(),
                        Value::BulkString(b) => String::from_utf8(b)
                            .map_err(|_| backend_err(format!("registry key {key} is not UTF-8")))?,
                        other => {
                            return Err(backend_err(format!(
                                "registry key {key} holds {other:?}, not a string"
                            )))
                        }
                    };
                    let recorded: Recorded = if text.is_empty() {
                        Recorded::default()
                    } else {
                        serde_json::from_str(&text).map_err(|e| {
                            backend_err(format!("registry key {key} is unreadable: {e}"))
                        })?
                    };
                    let (live, updated) = registry::reconcile_records(recorded.clone(), &views)?;
                    if updated == recorded {
                        return Ok(live);
                    }
                    let json = serde_json::to_string(&updated)
                        .map_err(|e| FeatureStoreError::Internal(e.to_string()))?;
                    let swapped = core
                        .conn
                        .query(
                            redis::cmd("EVAL")
                                .arg(REGISTRY_CAS_SCRIPT)
                                .arg(1)
                                .arg(&key)
                                .arg(&text)
                                .arg(&json),
                        )
                        .await
                        .map_err(backend_err)?;
                    if swapped == Value::Int(1) {
                        return Ok(live);
                    }
                }
                Err(backend_err(format!(
                    "registry key {key} kept changing under concurrent opens; try again"
                )))
            };
            tokio::time::timeout(deadline, step).await.map_err(|_| {
                backend_err("reading the registry timed out (redis_connect_timeout)")
            })?
        })
        .await?
    }

    /// Sends one per-key command batch, ending by `deadline`.
    async fn batch(
        &self,
        keys: Vec<Vec<u8>>,
        cmds: Vec<redis::Cmd>,
        with_script: bool,
        deadline: Instant,
    ) -> Result<Vec<std::result::Result<Value, Failure>>> {
        let core = self.core.clone();
        self.spawn(async move {
            let prelude = with_script.then(|| {
                let mut c = redis::cmd("SCRIPT");
                c.arg("LOAD").arg(WRITE_SCRIPT);
                c
            });
            core.conn
                .batch(
                    &keys,
                    cmds,
                    prelude.as_ref(),
                    tokio::time::Instant::from_std(deadline),
                )
                .await
        })
        .await
    }

    /// The encoded rows at `keys` (`None`: not stored), each key on its own
    /// failure, ending by `deadline`.
    pub(crate) async fn fetch(
        &self,
        keys: Vec<Vec<u8>>,
        deadline: Instant,
    ) -> Vec<std::result::Result<Option<Vec<u8>>, Failure>> {
        let n = keys.len();
        let cmds = keys
            .iter()
            .map(|k| {
                let mut c = redis::cmd("HGET");
                c.arg(k).arg(FIELD_VALUE);
                c
            })
            .collect();
        match self.batch(keys, cmds, false, deadline).await {
            Ok(answers) => answers
                .into_iter()
                .map(|a| match a? {
                    Value::Nil => Ok(None),
                    Value::BulkString(b) => Ok(Some(b)),
                    other => Err(Failure::Error(format!("HGET answered {other:?}").into())),
                })
                .collect(),
            Err(e) => vec![Err(Failure::Error(e.to_string().into())); n],
        }
    }

    /// Writes validated rows, each under the event-time rule (the script), and
    /// drops every touched key from the cache. Atomic per entity, not per batch:
    /// on a failure some rows may be written; the error says how many, and a retry
    /// is safe (an equal event time rewrites the same row).
    pub(crate) async fn write(
        &self,
        v: &ViewInfo,
        encoded: Vec<EncodedRow>,
        duplicates: u64,
        path: WritePath,
    ) -> Result<WriteReport> {
        let prefix = &self.core.opts.key_prefix;
        let mut keys = Vec::with_capacity(encoded.len());
        let mut cmds = Vec::with_capacity(encoded.len());
        for (k, event_time, value) in &encoded {
            let (_, key) = encoding::decode_key(k)
                .ok_or_else(|| FeatureStoreError::Internal("undecodable key".into()))?;
            let mut rk = Vec::with_capacity(k.len() + 16);
            entity_key(prefix, v.id, KeyRef::from(&key), &mut rk);
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.core.write_sha)
                .arg(1)
                .arg(&rk)
                .arg(keys::time_field(*event_time))
                .arg(value.as_slice())
                .arg(self.max_future_skew_us)
                .arg(*event_time);
            cmds.push(c);
            keys.push(rk);
        }
        let deadline = Instant::now() + self.core.opts.write_timeout;
        // Whatever happens (an error, a timeout, this future dropped), a touched
        // key may have changed: the guard drops it again when the write ends.
        let writing = self.cache.begin_write(keys.clone());
        let answers = self.batch(keys, cmds, true, deadline).await;
        drop(writing);
        let answers = answers?;
        let mut report = WriteReport {
            rows_skipped_older: duplicates,
            ..Default::default()
        };
        let (mut refused, mut failed) = (0u64, Vec::new());
        for a in answers {
            match a {
                Ok(Value::Int(1)) => report.rows_written += 1,
                Ok(Value::Int(0)) => report.rows_skipped_older += 1,
                Ok(Value::Int(-1)) => refused += 1,
                Ok(other) => failed.push(Failure::Error(
                    format!("write script answered {other:?}").into(),
                )),
                Err(f) => failed.push(f),
            }
        }
        if refused > 0 {
            m::record_rows_refused(
                &v.name,
                path.as_str(),
                "future_event_time_server_clock",
                refused,
            );
        }
        if let Some(first) = failed.first() {
            m::record_backend_failure("write", first.reason());
            return Err(backend_err(format!(
                "{} of {} rows of view {:?} were not written ({first}); {} were written and \
                 {} were older than the stored rows. Retrying the write is safe",
                failed.len() as u64 + refused,
                encoded.len(),
                v.name,
                report.rows_written,
                report.rows_skipped_older - duplicates,
            )));
        }
        if refused > 0 {
            return Err(FeatureStoreError::InvalidArgument(format!(
                "{refused} rows of view {:?} are dated more than max_future_skew ahead of the \
                 Redis server's clock and were refused; {} were written",
                v.name, report.rows_written
            )));
        }
        Ok(report)
    }

    /// One entity's encoded row, bypassing the cache.
    pub(crate) async fn read_one(&self, view_id: u32, key: &EntityKey) -> Result<Option<Vec<u8>>> {
        let mut k = Vec::new();
        entity_key(&self.core.opts.key_prefix, view_id, key.into(), &mut k);
        let deadline = Instant::now() + self.core.opts.write_timeout;
        match self.fetch(vec![k], deadline).await.pop() {
            Some(Ok(v)) => Ok(v),
            Some(Err(f)) => Err(backend_err(f)),
            None => Ok(None),
        }
    }

    /// Every stored row of `v` (SCAN on every master, then the values in batches).
    pub(crate) async fn scan_view(&self, v: &ViewInfo) -> Result<Vec<(EntityKey, Vec<u8>)>> {
        let core = self.core.clone();
        let pattern = keys::view_pattern(&core.opts.key_prefix, v.id);
        let timeout = core.opts.write_timeout;
        let found: Vec<Vec<u8>> = self
            .spawn(async move {
                let masters = core.conn.masters();
                let nodes: Vec<Option<(String, u16)>> = if masters.is_empty() {
                    vec![None]
                } else {
                    masters.into_iter().map(Some).collect()
                };
                let mut found = Vec::new();
                for node in nodes {
                    let mut cursor: u64 = 0;
                    loop {
                        let mut cmd = redis::cmd("SCAN");
                        cmd.arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(1000);
                        let q = async {
                            match &node {
                                None => core.conn.query(&cmd).await,
                                Some((h, p)) => core.conn.query_node(h, *p, cmd.clone()).await,
                            }
                        };
                        let ans = tokio::time::timeout(timeout, q)
                            .await
                            .map_err(|_| backend_err("SCAN timed out"))?
                            .map_err(backend_err)?;
                        let (next, batch) =
                            parse_scan(ans).ok_or_else(|| backend_err("unexpected SCAN answer"))?;
                        found.extend(batch);
                        cursor = next;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
                Ok::<_, FeatureStoreError>(found)
            })
            .await??;
        let mut out = Vec::with_capacity(found.len());
        for chunk in found.chunks(1000) {
            let deadline = Instant::now() + self.core.opts.write_timeout;
            let values = self.fetch(chunk.to_vec(), deadline).await;
            for (k, val) in chunk.iter().zip(values) {
                let Some(bytes) = val.map_err(backend_err)? else {
                    continue;
                };
                let key = keys::decode_entity_key(&self.core.opts.key_prefix, v.id, k).ok_or_else(
                    || FeatureStoreError::Decode {
                        view: v.name.clone(),
                        what: format!("bad key {:?}", String::from_utf8_lossy(k)),
                    },
                )?;
                out.push((key, bytes));
            }
        }
        Ok(out)
    }
}

fn parse_scan(v: Value) -> Option<(u64, Vec<Vec<u8>>)> {
    let Value::Array(mut parts) = v else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let keys = match parts.pop()? {
        Value::Array(ks) => ks
            .into_iter()
            .filter_map(|k| match k {
                Value::BulkString(b) => Some(b),
                _ => None,
            })
            .collect(),
        _ => return None,
    };
    let cursor = match parts.pop()? {
        Value::BulkString(b) => std::str::from_utf8(&b).ok()?.parse().ok()?,
        Value::Int(i) => u64::try_from(i).ok()?,
        _ => return None,
    };
    Some((cursor, keys))
}

async fn connect(o: &RedisOptions) -> redis::RedisResult<Conn> {
    match &o.target {
        RedisTarget::Server(url) => {
            use redis::IntoConnectionInfo;
            let mut info = url.as_str().into_connection_info()?;
            if let Some(p) = &o.password {
                let settings = info.redis_settings().clone().set_password(p.expose());
                info = info.set_redis_settings(settings);
            }
            let client = redis::Client::open(info)?;
            let cfg = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(o.connect_timeout))
                .set_response_timeout(Some(o.write_timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500));
            Ok(Conn::Single(
                redis::aio::ConnectionManager::new_with_config(client, cfg).await?,
            ))
        }
        RedisTarget::Cluster(urls) => {
            let mut builder = redis::cluster::ClusterClientBuilder::new(urls.clone())
                .connection_timeout(o.connect_timeout.min(o.write_timeout))
                .response_timeout(o.write_timeout)
                .retries(1);
            if let Some(p) = &o.password {
                builder = builder.password(p.expose());
            }
            let client = builder.build()?;
            let c = client.get_async_connection().await?;
            Conn::cluster(c).await
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_urls_redacted() {
        let ok = RedisOptions::new(RedisTarget::Server("redis://127.0.0.1:6379".into()));
        assert_eq!(ok.validate(), Ok(()));
        let mut bad = ok.clone();
        bad.key_prefix = "a:b".into();
        assert!(bad.validate().unwrap_err().contains("redis_key_prefix"));
        let mut bad = ok.clone();
        bad.target = RedisTarget::Cluster(vec![]);
        assert!(bad.validate().unwrap_err().contains("no nodes"));
        let mut bad = ok.clone();
        bad.target = RedisTarget::Server("http://x:secret@h".into());
        let e = bad.validate().unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let mut bad = ok.clone();
        bad.target = RedisTarget::Server("rediss://h:1".into());
        assert!(bad.validate().unwrap_err().contains("not built in"));
        let mut bad = ok;
        bad.lookup_budget = Duration::ZERO;
        assert!(bad.validate().unwrap_err().contains("lookup_budget"));
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn a_password_comes_from_a_file_and_is_never_shown() {
        let p = RedisPassword::from_file_contents("s3cret\n").unwrap();
        assert_eq!(p.expose(), "s3cret");
        assert_eq!(RedisPassword::from_file_contents("s3cret\r\n").unwrap(), p);
        assert_eq!(RedisPassword::from_file_contents("s3cret").unwrap(), p);
        for (bad, why) in [
            ("", "empty"),
            ("\n", "empty"),
            ("a\nb\n", "control"),
            ("a\tb", "control"),
        ] {
            let e = RedisPassword::from_file_contents(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let long = "x".repeat(RedisPassword::MAX_LEN + 1);
        assert!(RedisPassword::from_file_contents(&long)
            .unwrap_err()
            .contains("4096"));
        let mut o = RedisOptions::new(RedisTarget::Server("redis://127.0.0.1:6379".into()));
        o.password = Some(p.clone());
        assert_eq!(o.validate(), Ok(()));
        assert!(!format!("{o:?}").contains("s3cret"), "{o:?}");
        // A password in the URL as well as the file: refused, and not shown.
        o.target = RedisTarget::Cluster(vec!["redis://:other@127.0.0.1:1".into()]);
        let e = o.validate().unwrap_err();
        assert!(
            e.contains("redis_password_file") && !e.contains("other"),
            "{e}"
        );
        // A user name alone is not a password.
        o.target = RedisTarget::Server("redis://default@127.0.0.1:1".into());
        assert_eq!(o.validate(), Ok(()));
    }
}
