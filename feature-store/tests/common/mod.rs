//! Shared helpers of the integration tests: a views file, and a store on either
//! backend: sled in a temp dir, or a real `redis-server` started for the test.
//! [`both_backends!`] runs one test body once per backend.
#![allow(clippy::unwrap_used)] // tests may unwrap
#![allow(dead_code)]

pub mod redis;

use mesh_feature_store::{
    now_micros, EntityKey, FeatureStore, Micros, RedisOptions, RedisTarget, Result, Row,
    StoreOptions, Value, ViewsConfig,
};

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sled,
    Redis,
}

/// Where a test's store lives: a temp dir (sled; also the scratch dir of every
/// test) and, for Redis, the server.
pub struct Env {
    pub kind: Kind,
    pub dir: tempfile::TempDir,
    pub redis: Option<redis::RedisServer>,
}

impl Env {
    pub fn new(kind: Kind) -> Self {
        Env {
            kind,
            dir: tempfile::tempdir().unwrap(),
            redis: (kind == Kind::Redis).then(redis::RedisServer::start),
        }
    }

    /// These tests are about semantics, not timing: a lookup budget no loaded
    /// test machine reaches, so no answer is ever degraded here
    /// (`redis_backend.rs` tests the budget).
    pub fn redis_options(&self) -> RedisOptions {
        let r = self.redis.as_ref().expect("a redis env");
        let mut o = RedisOptions::new(RedisTarget::Server(r.url()));
        o.lookup_budget = std::time::Duration::from_secs(10);
        o
    }

    /// Opens (or reopens) the store with `views` and `options`.
    pub fn try_open(&self, views: &ViewsConfig, options: StoreOptions) -> Result<FeatureStore> {
        match self.kind {
            Kind::Sled => FeatureStore::open_with(self.dir.path().join("db"), views, options),
            Kind::Redis => FeatureStore::open_redis(views, self.redis_options(), options),
        }
    }

    pub fn open(&self) -> FeatureStore {
        self.open_with(StoreOptions::default())
    }

    pub fn open_with(&self, options: StoreOptions) -> FeatureStore {
        self.try_open(&views(), options).expect("open store")
    }
}

/// Runs a test body on sled and on Redis: `both_backends!(fn name(env) { .. })`
/// (or `async fn`) makes tests `name::sled` and `name::redis`, each with its own
/// [`Env`].
#[macro_export]
macro_rules! both_backends {
    (async fn $name:ident($env:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn run($env: Env) $body
            #[tokio::test]
            async fn sled() {
                run(Env::new(Kind::Sled)).await
            }
            #[tokio::test]
            async fn redis() {
                run(Env::new(Kind::Redis)).await
            }
        }
    };
    (fn $name:ident($env:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn run($env: Env) $body
            #[test]
            fn sled() {
                run(Env::new(Kind::Sled))
            }
            #[test]
            fn redis() {
                run(Env::new(Kind::Redis))
            }
        }
    };
}

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
