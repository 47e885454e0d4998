//! `mesh.toml`: the typed configuration of `mesh serve`. Precedence, lowest first:
//! built-in defaults, the file (`--config`), `MESH_*` environment variables, flags.
//!
//! Relative paths in the file resolve against the file's directory (see
//! [`MeshConfig::from_file`]); defaults and flags against the working directory.
//!
//! Every duration is a string with a unit (`"50ms"`, `"2s"`, `"250us"`), read by
//! [`mesh_stack::parse_duration`]. Keys renamed from `foo_ms` to `foo` still read
//! the old spelling (as milliseconds) and say so in [`MeshConfig::deprecations`];
//! an old and a new spelling of one key that disagree refuse the file.
//!
//! ```toml
//! [server]
//! host = "127.0.0.1"
//! grpc_port = 8001              # 0 = any free port
//! http_port = 8000
//! models = "examples/models"    # the model repository
//! max_message_bytes = 16777216
//! max_timeout = "30s"           # cap on any OIP request's deadline (was max_timeout_ms)
//! compute_threads = 1           # threads of one forward pass
//! worker_threads = 0            # threads serving requests; 0 = one per CPU core
//! role = "all"                  # all | router | model | features
//!
//! [log]
//! format = "human"              # or json
//!
//! [features]
//! backend = "sled"              # or "redis" (then redis_url or redis_cluster)
//! path = "data/features"        # sled directory; no store when unset
//! views = "examples/features/views.toml"
//! max_keys_per_lookup = 4096    # per mesh.v1.FeatureStore lookup (rows x views)
//! # cache_max_bytes = 0         # rows cached in process (sled: 0, Redis: 64 MiB); 0 = none
//! # With backend = "redis" (no path):
//! # redis_url = "redis://127.0.0.1:6379"           # one server, or
//! # redis_cluster = ["redis://10.0.0.1:6379", ...] # some nodes of a cluster
//! # redis_key_prefix = "mesh"
//! # redis_password_file = "/etc/mesh/secrets/redis/password"  # AUTH, read at start
//! # lookup_budget = "20ms"      # past it: cached values as OUTSIDE_MAX_AGE, or UNAVAILABLE
//! # redis_write_timeout = "2s"
//! # redis_connect_timeout = "5s"
//! # cache_max_age = "1s"        # how long a cached row answers without Redis
//! # remote = "http://features.mesh.svc:8001"  # instead of path: a --role features
//! remote_wait = "10s"           # with remote: how long the start waits for its views
//! # lookup_timeout = "20ms"     # with remote: a cap on one lookup
//!
//! [prediction_log]              # off when absent
//! dir = "data/predictions"
//! features = "all"              # all | none | a sample rate such as 0.1
//! flush_interval = "200ms"      # the crash loss window (was flush_interval_ms)
//! channel_capacity = 65536
//! parquet = "inline"            # inline | deferred (`mesh logs convert` builds the files)
//! deferred_max_bytes = 1073741824  # deferred: closed segments waiting before the server converts
//! segment_max_bytes = 67108864  # a segment becomes a Parquet file at this size (1 MiB to 4 GiB)
//! segment_max_age = "5m"        # ... or this age (1s to 24h)
//! ```
//!
//! `[decisions]`: see [`crate::decide::config`]; `[decisions.stack]`: see
//! [`mesh_stack::config`]; `[admin]` and `[writer]`: see [`crate::auth`];
//! `[tls]`: see [`crate::tls`].
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use mesh_stack::config::duration;
use mesh_stack::format_duration;
use serde::{Deserialize, Deserializer};

use crate::telemetry::LogFormat;

#[derive(Debug, Clone, Default)]
pub struct MeshConfig {
    pub server: ServerConfig,
    pub log: LogConfig,
    pub features: FeaturesConfig,
    pub decisions: crate::decide::config::DecisionsConfig,
    /// Where every prediction is logged; off when absent.
    pub prediction_log: Option<crate::plog::PredictionLogConfig>,
    /// `[admin]`: the admin plane's credential and what it may do (see [`crate::auth`]).
    pub admin: crate::auth::AdminConfig,
    /// `[writer]`: the credential of feature writes (see [`crate::auth`]).
    pub writer: crate::auth::WriterConfig,
    /// `[tls]`: TLS and mTLS on both ports, and to remote roles (see [`crate::tls`]).
    pub tls: crate::tls::TlsConfig,
    /// One notice per deprecated spelling the file used (old key, what to write
    /// instead). The file is read before logging is installed, so whoever
    /// installs it logs these (`mesh serve` does, at warn). Not a key of the file.
    pub deprecations: Vec<String>,
}

impl<'de> Deserialize<'de> for MeshConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// The tables of the file.
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields, default)]
        struct File {
            server: ServerConfig,
            log: LogConfig,
            features: FeaturesConfig,
            decisions: crate::decide::config::DecisionsConfig,
            prediction_log: Option<crate::plog::PredictionLogConfig>,
            admin: crate::auth::AdminConfig,
            writer: crate::auth::WriterConfig,
            tls: crate::tls::TlsConfig,
        }
        let (file, deprecations) = mesh_stack::collect_deprecations(|| File::deserialize(d));
        let f = file?;
        f.tls
            .validate()
            .map_err(<D::Error as serde::de::Error>::custom)?;
        f.features
            .validate()
            .map_err(<D::Error as serde::de::Error>::custom)?;
        if let Some(r) = f
            .features
            .redis_options()
            .map_err(<D::Error as serde::de::Error>::custom)?
        {
            let deadline = f.decisions.deadline();
            if r.lookup_budget >= deadline {
                return Err(<D::Error as serde::de::Error>::custom(format!(
                    "[features] lookup_budget ({}) must be below [decisions] deadline ({}): \
                     a decision waits for its features inside its own budget",
                    format_duration(r.lookup_budget),
                    format_duration(deadline)
                )));
            }
        }
        Ok(Self {
            server: f.server,
            log: f.log,
            features: f.features,
            decisions: f.decisions,
            prediction_log: f.prediction_log,
            admin: f.admin,
            writer: f.writer,
            tls: f.tls,
            deprecations,
        })
    }
}

/// Resolves one setting that has a current key and older spellings. `current`
/// and each of `old` are (where the key is, e.g. `"[decisions] deadline"`, its
/// value if the file has it). An old spelling that is present adds a
/// deprecation notice; two present spellings that disagree are an error naming
/// both. Returns the value, if any spelling is present.
pub(crate) fn resolve_renamed(
    current: (&str, Option<Duration>),
    old: &[(&str, Option<Duration>)],
) -> Result<Option<Duration>, String> {
    let (new_key, new_value) = current;
    let mut chosen: Option<(&str, Duration)> = new_value.map(|v| (new_key, v));
    for &(old_key, value) in old {
        let Some(v) = value else { continue };
        if let Some((key, c)) = chosen {
            if c != v {
                return Err(format!(
                    "{key} ({}) and {old_key} ({}) disagree; {old_key} is a deprecated \
                     spelling of {new_key}: keep only {new_key}",
                    format_duration(c),
                    format_duration(v)
                ));
            }
        }
        mesh_stack::deprecated(format!(
            "{old_key} is deprecated; write {new_key} = \"{}\"{}",
            format_duration(v),
            if new_value.is_some() {
                format!(" (already there: remove {old_key})")
            } else {
                String::new()
            }
        ));
        chosen.get_or_insert((old_key, v));
    }
    Ok(chosen.map(|(_, v)| v))
}

/// A `foo_ms` key's value as a duration.
pub(crate) fn millis(v: Option<u64>) -> Option<Duration> {
    v.map(Duration::from_millis)
}

/// What `mesh serve` runs in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything: decisions, OIP model serving, the feature store.
    #[default]
    All,
    /// Decisions and OIP, with the models of this process (plus remote replicas).
    Router,
    /// OIP model serving only (a remote replica for routers elsewhere).
    Model,
    /// The feature store service only.
    Features,
}

impl Role {
    /// The spellings `--role` and `[server] role` accept.
    pub const NAMES: [&'static str; 4] = ["all", "router", "model", "features"];

    /// The name of this role in config, logs and the prediction log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Router => "router",
            Self::Model => "model",
            Self::Features => "features",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "all" => Self::All,
            "router" => Self::Router,
            "model" => Self::Model,
            "features" => Self::Features,
            _ => {
                return Err(format!(
                    "unknown role '{s}' (one of: {})",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

/// `[features]`: where decisions read stored features: the online feature store
/// of this process (`path`, `views`), or a `mesh serve --role features` elsewhere
/// (`remote`), never both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeaturesConfig {
    /// `"sled"` (the default: embedded, in `path`) or `"redis"` (`redis_url` or
    /// `redis_cluster`).
    pub backend: FeatureBackend,
    /// The sled database directory; no store when unset (sled backend).
    pub path: Option<PathBuf>,
    /// The views file (TOML) the store validates and records.
    pub views: Option<PathBuf>,
    /// Most keys (rows x views) one `mesh.v1.FeatureStore` gRPC lookup may
    /// fetch; the store's default (4096) when unset. Lookups of the decision
    /// engine in this process are not limited by it.
    pub max_keys_per_lookup: Option<usize>,
    /// Redis backend: one server, `redis://host:port[/db]`.
    pub redis_url: Option<String>,
    /// Redis backend: nodes of a Redis Cluster (`redis://host:port` each).
    pub redis_cluster: Vec<String>,
    /// Redis backend: a file holding the password (`AUTH`) for the server or
    /// every cluster node, for example a mounted Secret; read at start. Keeps the
    /// password out of the URL and out of this file.
    pub redis_password_file: Option<PathBuf>,
    /// Redis backend: first part of every key (default `mesh`).
    pub redis_key_prefix: Option<String>,
    /// Redis backend: how long a lookup waits for Redis (default 20ms); past it,
    /// cached values answer as OUTSIDE_MAX_AGE, or UNAVAILABLE. Must be below
    /// `[decisions] deadline`.
    #[serde(deserialize_with = "duration::option")]
    pub lookup_budget: Option<Duration>,
    /// Redis backend: how long a push or ingest batch waits (default 2s).
    #[serde(deserialize_with = "duration::option")]
    pub redis_write_timeout: Option<Duration>,
    /// Redis backend: how long the start waits to connect (default 5s).
    #[serde(deserialize_with = "duration::option")]
    pub redis_connect_timeout: Option<Duration>,
    /// Bytes of rows cached in process (0 = no cache): decoded rows in front of
    /// Redis (default 64 MiB), stored rows in front of sled (default 0: size it to
    /// the rows read again, see feature-store/README.md "Row cache").
    pub cache_max_bytes: Option<usize>,
    /// Redis backend: how long a cached row answers without asking Redis
    /// (default 1s; writes through this process invalidate at once).
    #[serde(deserialize_with = "duration::option")]
    pub cache_max_age: Option<Duration>,
    /// A features role to read from instead of a store of this process
    /// (`http://host:port`, or `https://` with `[tls.client]`).
    pub remote: Option<String>,
    /// How long the start waits for the remote's `ListViews` (it is retried
    /// while the features role is not up yet). Default 10 s.
    #[serde(deserialize_with = "duration::deserialize")]
    pub remote_wait: Duration,
    /// A cap on one remote lookup; unset, a lookup may take what is left of the
    /// decision's deadline less the fallback reserve.
    #[serde(deserialize_with = "duration::option")]
    pub lookup_timeout: Option<Duration>,
}

impl Default for FeaturesConfig {
    fn default() -> Self {
        Self {
            backend: FeatureBackend::Sled,
            path: None,
            views: None,
            max_keys_per_lookup: None,
            redis_url: None,
            redis_cluster: Vec::new(),
            redis_password_file: None,
            redis_key_prefix: None,
            lookup_budget: None,
            redis_write_timeout: None,
            redis_connect_timeout: None,
            cache_max_bytes: None,
            cache_max_age: None,
            remote: None,
            remote_wait: Duration::from_secs(10),
            lookup_timeout: None,
        }
    }
}

/// The most `[features] remote_wait` may be.
pub const MAX_REMOTE_WAIT: Duration = Duration::from_secs(600);

impl FeaturesConfig {
    /// `path` and `remote` exclude each other; `remote` must be a URL of a
    /// features role; the durations must be usable.
    pub fn validate(&self) -> Result<(), String> {
        if let (Some(_), Some(remote)) = (&self.path, &self.remote) {
            return Err(format!(
                "[features] path and remote = \"{remote}\" are both set: a process reads \
                 features from its own store (path) or from a features role (remote), not both"
            ));
        }
        if let (FeatureBackend::Redis, Some(remote)) = (self.backend, &self.remote) {
            return Err(format!(
                "[features] backend = \"redis\" and remote = \"{remote}\" are both set: a \
                 process reads features from its own store or from a features role, not both"
            ));
        }
        if let Some(remote) = &self.remote {
            crate::decide::discovery::Target::parse(remote)
                .map_err(|e| format!("[features] {e}"))?;
        }
        if self.remote_wait > MAX_REMOTE_WAIT {
            return Err(format!(
                "[features] remote_wait must be at most {}",
                format_duration(MAX_REMOTE_WAIT)
            ));
        }
        if self.lookup_timeout.is_some_and(|t| t.is_zero()) {
            return Err("[features] lookup_timeout must be more than 0".into());
        }
        Ok(())
    }
}

/// `[features] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureBackend {
    #[default]
    Sled,
    Redis,
}

impl FeaturesConfig {
    /// The Redis settings, when `backend = "redis"` (`Err` names the key at fault).
    pub fn redis_options(&self) -> Result<Option<mesh_feature_store::RedisOptions>, String> {
        use mesh_feature_store::{RedisOptions, RedisTarget};
        let redis_keys_set = self.redis_url.is_some()
            || !self.redis_cluster.is_empty()
            || self.redis_password_file.is_some()
            || self.redis_key_prefix.is_some()
            || self.lookup_budget.is_some()
            || self.redis_write_timeout.is_some()
            || self.redis_connect_timeout.is_some()
            || self.cache_max_age.is_some();
        if self.backend == FeatureBackend::Sled {
            if redis_keys_set {
                return Err("[features] has Redis settings (redis_url, redis_cluster, lookup_budget, cache_max_age, ...) but backend is \"sled\": set backend = \"redis\" or remove them".into());
            }
            return Ok(None);
        }
        if self.path.is_some() {
            return Err(
                "[features] path is the sled directory; with backend = \"redis\" remove it".into(),
            );
        }
        let target = match (&self.redis_url, self.redis_cluster.is_empty()) {
            (Some(u), true) => RedisTarget::Server(u.clone()),
            (None, false) => RedisTarget::Cluster(self.redis_cluster.clone()),
            (Some(_), false) => {
                return Err("[features] sets both redis_url and redis_cluster: keep one".into())
            }
            (None, true) => {
                return Err("[features] backend = \"redis\" needs redis_url (one server) or redis_cluster (cluster nodes)".into())
            }
        };
        let mut o = RedisOptions::new(target);
        if let Some(p) = &self.redis_key_prefix {
            o.key_prefix.clone_from(p);
        }
        if let Some(d) = self.lookup_budget {
            o.lookup_budget = d;
        }
        if let Some(d) = self.redis_write_timeout {
            o.write_timeout = d;
        }
        if let Some(d) = self.redis_connect_timeout {
            o.connect_timeout = d;
        }
        if let Some(b) = self.cache_max_bytes {
            o.cache_max_bytes = b;
        }
        if let Some(d) = self.cache_max_age {
            o.cache_max_age = d;
        }
        o.validate().map_err(|e| format!("[features] {e}"))?;
        Ok(Some(o))
    }

    /// The store settings of this section (the sled backend's row cache).
    pub fn store_options(&self) -> mesh_feature_store::StoreOptions {
        let mut o = mesh_feature_store::StoreOptions::default();
        if self.backend == FeatureBackend::Sled {
            if let Some(b) = self.cache_max_bytes {
                o.row_cache_max_bytes = b;
            }
        }
        o
    }

    /// The Redis password from `redis_password_file`, read now (at start, not when
    /// the config is parsed, so that a config can be checked where the Secret is not
    /// mounted).
    pub fn read_redis_password(&self) -> Result<Option<mesh_feature_store::RedisPassword>, String> {
        let Some(path) = &self.redis_password_file else {
            return Ok(None);
        };
        let text = crate::auth::read_secret_file(
            "features",
            path,
            mesh_feature_store::RedisPassword::MAX_LEN + 2,
        )
        .map_err(|e| format!("[features] redis_password_file {}: {e}", path.display()))?;
        mesh_feature_store::RedisPassword::from_file_contents(&text)
            .map(Some)
            .map_err(|e| format!("[features] redis_password_file {} {e}", path.display()))
    }

    /// Whether a store is configured (a sled `path`, or the Redis backend).
    pub fn configured(&self) -> bool {
        self.path.is_some() || self.backend == FeatureBackend::Redis
    }
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "ServerFile")]
pub struct ServerConfig {
    /// Address both servers bind.
    pub host: IpAddr,
    /// gRPC port (0 = any free port).
    pub grpc_port: u16,
    /// HTTP port (0 = any free port).
    pub http_port: u16,
    /// The model repository directory.
    pub models: PathBuf,
    /// Largest request message (gRPC message or HTTP body), bytes.
    pub max_message_bytes: usize,
    /// Cap on an OIP request's deadline (`max_timeout`, was `max_timeout_ms`).
    /// Decisions have their own budget, `[decisions] deadline`.
    pub max_timeout: Duration,
    /// Threads each forward pass may use (candle's matmul pool). 1 keeps a
    /// small-batch pass in a few µs; more helps only large batches.
    pub compute_threads: usize,
    /// Threads of the runtime that serves requests (tokio's workers): 0 (the
    /// default) is one per CPU core; at most [`MAX_WORKER_THREADS`].
    pub worker_threads: usize,
    pub role: Role,
    /// `[server.connections]`: connection lifetimes and the shutdown grace period.
    pub connections: crate::listen::ConnectionConfig,
    /// Request bytes all connections together may hold while bodies are read; past
    /// it, new requests are refused (RESOURCE_EXHAUSTED / 429) instead of buffered.
    pub max_inflight_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            grpc_port: 8001,
            http_port: 8000,
            models: PathBuf::from("examples/models"),
            max_message_bytes: 16 << 20,
            max_timeout: Duration::from_secs(30),
            compute_threads: 1,
            worker_threads: 0,
            role: Role::All,
            connections: Default::default(),
            max_inflight_bytes: 512 << 20,
        }
    }
}

/// The most `[server] worker_threads`.
pub const MAX_WORKER_THREADS: usize = 1024;

/// `n` as `[server] worker_threads`, or why not; `setting` names where it came from
/// (`[server] worker_threads =` in a file, `--worker-threads` on the command line).
pub fn check_worker_threads(setting: &str, n: usize) -> Result<usize, String> {
    if n > MAX_WORKER_THREADS {
        return Err(format!(
            "{setting} {n}: must be 0 (one per CPU core) to {MAX_WORKER_THREADS}"
        ));
    }
    Ok(n)
}

impl ServerConfig {
    /// The defaults on 127.0.0.1 with ports the OS picks (0; the running server reports
    /// the ones it got), serving the model repository at `models`: a server for a test.
    pub fn on_any_port(models: impl Into<PathBuf>) -> Self {
        Self {
            grpc_port: 0,
            http_port: 0,
            models: models.into(),
            ..Self::default()
        }
    }

    pub fn max_timeout(&self) -> Duration {
        self.max_timeout
    }
}

/// `[server]` as written, old spellings included.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerFile {
    host: IpAddr,
    grpc_port: u16,
    http_port: u16,
    models: PathBuf,
    max_message_bytes: usize,
    #[serde(deserialize_with = "duration::option")]
    max_timeout: Option<Duration>,
    max_timeout_ms: Option<u64>,
    compute_threads: usize,
    worker_threads: usize,
    role: Role,
    connections: crate::listen::ConnectionConfig,
    max_inflight_bytes: usize,
}

impl Default for ServerFile {
    fn default() -> Self {
        let d = ServerConfig::default();
        Self {
            host: d.host,
            grpc_port: d.grpc_port,
            http_port: d.http_port,
            models: d.models,
            max_message_bytes: d.max_message_bytes,
            max_timeout: None,
            max_timeout_ms: None,
            compute_threads: d.compute_threads,
            worker_threads: d.worker_threads,
            role: d.role,
            connections: d.connections,
            max_inflight_bytes: d.max_inflight_bytes,
        }
    }
}

impl TryFrom<ServerFile> for ServerConfig {
    type Error = String;

    fn try_from(f: ServerFile) -> Result<Self, String> {
        let max_timeout = resolve_renamed(
            ("[server] max_timeout", f.max_timeout),
            &[("[server] max_timeout_ms", millis(f.max_timeout_ms))],
        )?;
        f.connections.validate()?;
        let worker_threads = check_worker_threads("[server] worker_threads =", f.worker_threads)?;
        Ok(Self {
            host: f.host,
            grpc_port: f.grpc_port,
            http_port: f.http_port,
            models: f.models,
            max_message_bytes: f.max_message_bytes,
            max_timeout: max_timeout.unwrap_or(ServerConfig::default().max_timeout),
            compute_threads: f.compute_threads,
            worker_threads,
            role: f.role,
            connections: f.connections,
            max_inflight_bytes: f.max_inflight_bytes,
        })
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
}

impl MeshConfig {
    /// Reads a `mesh.toml`; errors name the file and the field.
    ///
    /// Relative paths written in the file resolve against the file's directory,
    /// not the working directory: `[server] models`, `[features] path`, `views`
    /// and `redis_password_file`, `[prediction_log] dir`, the `[tls]` and `[tls.client]` files, and
    /// `[admin]`/`[writer]` `token_file`. So `models = "models"` in
    /// `/srv/mesh/mesh.toml` is `/srv/mesh/models` wherever `mesh serve` starts.
    /// Built-in defaults of keys the file does not set (`models =
    /// "examples/models"`), flags and `MESH_*` variables stay relative to the
    /// working directory, as does [`MeshConfig::from_toml`].
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut c = Self::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        // `models` has a default: rebase it only when the file wrote it.
        let wrote_models = toml::from_str::<toml::Table>(&text)
            .ok()
            .and_then(|t| t.get("server")?.get("models").cloned())
            .is_some();
        c.rebase_paths(base, wrote_models);
        Ok(c)
    }

    /// Joins every relative path the file set to `base` (see [`Self::from_file`]).
    fn rebase_paths(&mut self, base: &std::path::Path, models: bool) {
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if models {
            rebase(&mut self.server.models);
        }
        let optional = [
            &mut self.features.path,
            &mut self.features.views,
            &mut self.features.redis_password_file,
            &mut self.tls.cert,
            &mut self.tls.key,
            &mut self.tls.client_ca,
            &mut self.tls.client.ca,
            &mut self.tls.client.cert,
            &mut self.tls.client.key,
            &mut self.admin.token_file,
            &mut self.writer.token_file,
        ];
        for p in optional.into_iter().flatten() {
            rebase(p);
        }
        if let Some(log) = &mut self.prediction_log {
            rebase(&mut log.dir);
        }
    }

    /// Parses the text of a `mesh.toml` (the same as `toml::from_str`).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_typos_are_named() {
        let c: MeshConfig = toml::from_str("[server]\ngrpc_port = 9\n").unwrap();
        assert_eq!(c.server.grpc_port, 9);
        assert_eq!(c.server.http_port, 8000);
        assert!(c.deprecations.is_empty());
        let err = toml::from_str::<MeshConfig>("[server]\ngrpc_prot = 9\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("grpc_prot"), "{err}");
        let err = toml::from_str::<MeshConfig>("[sever]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sever"), "{err}");
    }

    #[test]
    fn durations_have_units() {
        let c = MeshConfig::from_toml("[server]\nmax_timeout = \"2s\"\n").unwrap();
        assert_eq!(c.server.max_timeout(), Duration::from_secs(2));
        assert!(c.deprecations.is_empty());
        let err = MeshConfig::from_toml("[server]\nmax_timeout = 2000\n").unwrap_err();
        assert!(err.contains("unit") && err.contains("2000ms"), "{err}");
        let err = MeshConfig::from_toml("[server]\nmax_timeout = \"2 fortnights\"\n").unwrap_err();
        assert!(err.contains("fortnights"), "{err}");
    }

    #[test]
    fn old_spelling_reads_with_a_notice() {
        let c = MeshConfig::from_toml("[server]\nmax_timeout_ms = 1500\n").unwrap();
        assert_eq!(c.server.max_timeout(), Duration::from_millis(1500));
        assert_eq!(
            c.deprecations,
            ["[server] max_timeout_ms is deprecated; write [server] max_timeout = \"1500ms\""]
        );
        // Both, agreeing: read, and told to drop the old one.
        let c = MeshConfig::from_toml("[server]\nmax_timeout_ms = 2000\nmax_timeout = \"2s\"\n")
            .unwrap();
        assert_eq!(c.server.max_timeout(), Duration::from_secs(2));
        assert!(
            c.deprecations[0].contains("remove [server] max_timeout_ms"),
            "{:?}",
            c.deprecations
        );
        // Both, disagreeing: refused, naming both.
        let err = MeshConfig::from_toml("[server]\nmax_timeout_ms = 1000\nmax_timeout = \"2s\"\n")
            .unwrap_err();
        assert!(
            err.contains("[server] max_timeout (2s)")
                && err.contains("[server] max_timeout_ms (1s)"),
            "{err}"
        );
    }
}
