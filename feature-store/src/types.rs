//! Small value types shared by the store, the ingest readers and the service.
//!
//! Kept free of sled, tonic and arrow so callers (the router, tests) can build
//! requests without pulling the storage stack into their reasoning.
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Type of one feature. The string form is what the views file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureType {
    F32,
    F64,
    I64,
    Bool,
    String,
    F32Vector,
}

impl FeatureType {
    pub fn as_str(self) -> &'static str {
        match self {
            FeatureType::F32 => "f32",
            FeatureType::F64 => "f64",
            FeatureType::I64 => "i64",
            FeatureType::Bool => "bool",
            FeatureType::String => "string",
            FeatureType::F32Vector => "f32_vector",
        }
    }
}

impl fmt::Display for FeatureType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Type of an entity's join key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyType {
    Int64,
    String,
}

impl KeyType {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::Int64 => "int64",
            KeyType::String => "string",
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entity key value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityKey {
    Int64(i64),
    String(String),
}

impl EntityKey {
    pub fn key_type(&self) -> KeyType {
        match self {
            EntityKey::Int64(_) => KeyType::Int64,
            EntityKey::String(_) => KeyType::String,
        }
    }
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntityKey::Int64(v) => write!(f, "{v}"),
            EntityKey::String(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for EntityKey {
    fn from(v: i64) -> Self {
        EntityKey::Int64(v)
    }
}

impl From<&str> for EntityKey {
    fn from(v: &str) -> Self {
        EntityKey::String(v.to_owned())
    }
}

impl From<String> for EntityKey {
    fn from(v: String) -> Self {
        EntityKey::String(v)
    }
}

/// One typed feature value. Nulls are `Option::None` around it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    F32(f32),
    F64(f64),
    I64(i64),
    Bool(bool),
    String(String),
    F32Vector(Vec<f32>),
}

impl Value {
    pub fn feature_type(&self) -> FeatureType {
        match self {
            Value::F32(_) => FeatureType::F32,
            Value::F64(_) => FeatureType::F64,
            Value::I64(_) => FeatureType::I64,
            Value::Bool(_) => FeatureType::Bool,
            Value::String(_) => FeatureType::String,
            Value::F32Vector(_) => FeatureType::F32Vector,
        }
    }
}

/// Status of one looked-up value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeatureStatus {
    /// Stored and within the view's `max_age`.
    Present,
    /// No stored row for this entity in this view.
    NotFound,
    /// The row exists but this feature has no value.
    Null,
    /// The stored row is older than the view's `max_age`, or (Redis) the backend
    /// failed within the lookup budget and the value was served from the cache
    /// (the response's `degraded` says so): never a live value.
    OutsideMaxAge,
    /// (Redis) the backend failed within the lookup budget and the cache held
    /// nothing for this entity: no value, not even a stale one.
    Unavailable,
}

impl FeatureStatus {
    pub const ALL: [FeatureStatus; 5] = [
        FeatureStatus::Present,
        FeatureStatus::NotFound,
        FeatureStatus::Null,
        FeatureStatus::OutsideMaxAge,
        FeatureStatus::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FeatureStatus::Present => "present",
            FeatureStatus::NotFound => "not_found",
            FeatureStatus::Null => "null",
            FeatureStatus::OutsideMaxAge => "outside_max_age",
            FeatureStatus::Unavailable => "unavailable",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            FeatureStatus::Present => 0,
            FeatureStatus::NotFound => 1,
            FeatureStatus::Null => 2,
            FeatureStatus::OutsideMaxAge => 3,
            FeatureStatus::Unavailable => 4,
        }
    }
}

/// Event times are Unix microseconds (i64): enough range, cheap to compare and encode.
pub type Micros = i64;

/// Current wall-clock time in Unix microseconds. Freshness is judged against the
/// wall clock because `max_age` is about the real age of a value.
pub fn now_micros() -> Micros {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        // A clock before 1970 is a broken host; treat as the epoch.
        Err(_) => 0,
    }
}

/// One row to write: an entity's full set of features for one view at one event
/// time. `values` is aligned with the view's active features (see
/// [`crate::ViewInfo::features`]); `None` is a null.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: EntityKey,
    pub event_time: Micros,
    pub values: Vec<Option<Value>>,
}

/// Whether a write's acknowledgement waits for the data to be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledge once applied (readable) in the store; sled writes it to disk within
    /// its flush interval (`StoreOptions::flush_every_ms`, default 500 ms). Loss window
    /// on a crash or power loss: up to one flush interval of acknowledged writes.
    #[default]
    Buffered,
    /// Acknowledge only after `fsync`: nothing acknowledged is lost. Costs one disk
    /// sync per call (milliseconds on ordinary disks).
    Sync,
}
