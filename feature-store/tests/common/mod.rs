//! Shared helpers of the integration tests: a views file and a store in a temp dir.
#![allow(clippy::unwrap_used)] // tests may unwrap
#![allow(dead_code)]

use mesh_feature_store::{
    now_micros, EntityKey, FeatureStore, Micros, Row, StoreOptions, Value, ViewsConfig,
};

pub const VIEWS: &str = r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"

[[entities]]
name = "merchant"
join_key = "merchant_id"
key_type = "string"

[[views]]
name = "card"
entity = "card"
max_age = "1h"
features = [
  { name = "amount", type = "f32" },
  { name = "count", type = "i64" },
  { name = "ratio", type = "f64" },
  { name = "flag", type = "bool" },
  { name = "country", type = "string" },
  { name = "emb", type = "f32_vector" },
]

[[views]]
name = "merchant"
entity = "merchant"
max_age = "1h"
features = [
  { name = "rate", type = "f32" },
  { name = "tier", type = "i64" },
]
"#;

pub const HOUR_MICROS: Micros = 3_600_000_000;

pub fn views() -> ViewsConfig {
    ViewsConfig::from_toml_str(VIEWS).expect("test views parse")
}

pub fn open(dir: &tempfile::TempDir) -> FeatureStore {
    FeatureStore::open(dir.path().join("db"), &views()).expect("open store")
}

pub fn open_with(dir: &tempfile::TempDir, options: StoreOptions) -> FeatureStore {
    FeatureStore::open_with(dir.path().join("db"), &views(), options).expect("open store")
}

/// A full card row whose values derive from `id` and `seed`, so a reader can tell
/// which write it sees.
pub fn card_row(id: i64, event_time: Micros, seed: i64) -> Row {
    Row {
        key: EntityKey::Int64(id),
        event_time,
        values: vec![
            Some(Value::F32(id as f32 + seed as f32 * 0.5)),
            Some(Value::I64(id * 10 + seed)),
            Some(Value::F64(seed as f64 / 4.0)),
            Some(Value::Bool(seed % 2 == 1)),
            Some(Value::String(format!("c{seed}"))),
            Some(Value::F32Vector(vec![seed as f32, id as f32])),
        ],
    }
}

pub fn merchant_row(id: &str, event_time: Micros, rate: f32, tier: Option<i64>) -> Row {
    Row {
        key: EntityKey::String(id.into()),
        event_time,
        values: vec![Some(Value::F32(rate)), tier.map(Value::I64)],
    }
}

/// A fresh event time: one minute ago.
pub fn fresh() -> Micros {
    now_micros() - 60_000_000
}
