//! Online feature store of inference-mesh, on sled (embedded, the default) or on
//! Redis (one server or a Redis Cluster, with an in-process cache in front).
//!
//! - [`ViewsConfig`]: entities and feature views from a TOML file.
//! - [`FeatureStore`]: opens the backend ([`FeatureStore::open`] for sled,
//!   [`FeatureStore::open_redis`] for Redis), records the views, answers batched
//!   lookups ([`FeatureStore::get_online_features`]) with a status per value and
//!   freshness enforced, and takes writes ([`FeatureStore::push`]) under the
//!   event-time rule with a per-call [`Durability`].
//! - [`ingest_file`]: materialises a view from CSV or Parquet.
//! - [`service::FeatureStoreService`]: the `mesh.v1.FeatureStore` gRPC service.
//!
//! Data model, key layout, encoding, durability and rebuilding: see README.md.

mod cache;
pub mod config;
mod demo;
pub mod encoding;
pub mod error;
pub mod ingest;
mod lookup;
pub mod metrics;
mod redis_store;
mod registry;
pub mod service;
mod sled_store;
mod store;
mod types;

pub use config::{
    parse_duration, EntityConfig, FeatureConfig, TimestampUnit, ViewConfig, ViewsConfig,
};
pub use demo::{demo_merchant_key, generate_demo_features, DemoReport};
pub use error::{FeatureStoreError, OpenFailure, Result};
pub use ingest::{
    ingest_file, ingest_file_observed, parse_timestamp_in, read_file_observed, BatchCommitted,
    IngestOptions, IngestReport, ProgressUnit,
};
pub use lookup::{ColumnValues, Degraded, FeatureColumn, KeyColumn, LookupRequest, LookupResponse};
pub use redis_store::{
    RedisOptions, RedisPassword, RedisTarget, DEFAULT_CACHE_MAX_AGE, DEFAULT_CACHE_MAX_BYTES,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_LOOKUP_BUDGET, DEFAULT_WRITE_TIMEOUT,
    WRITE_SCRIPT,
};
pub use registry::{FeatureInfo, ViewInfo};
pub use store::{
    FeatureStore, FetchStrategy, Limits, StoreOptions, WriteReport, DEFAULT_INLINE_MAX_KEYS,
    DEFAULT_ON_TASK_MAX_KEYS, DEFAULT_ROW_CACHE_MAX_BYTES, MAX_STRING_KEY_BYTES,
};
pub use types::{
    now_micros, Durability, EntityKey, FeatureStatus, FeatureType, KeyType, Micros, Row, Value,
};
