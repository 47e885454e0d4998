//! The views file (TOML): entities, feature views, their features and freshness.
//!
//! ```toml
//! [[entities]]
//! name = "card"
//! join_key = "card_id"
//! key_type = "int64"          # or "string"
//!
//! [[views]]
//! name = "card"
//! entity = "card"
//! max_age = "1h"              # ms, s, m, h, d
//! timestamp_field = "event_timestamp"   # optional, this is the default
//! timestamp_unit = "s"        # optional: unit of integer/float timestamps in
//!                             # ingest files, "s" (default), "ms" or "us"
//! features = [
//!   { name = "txn_count_1h", type = "i64" },
//!   { name = "amount_sum_24h", type = "f32" },
//! ]
//! ```
//!
//! Parsing checks the file on its own (names, duplicates, references); the store
//! then checks it against what it has recorded (see `registry.rs`).
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{FeatureStoreError, Result};
use crate::types::{FeatureType, KeyType};

pub const DEFAULT_TIMESTAMP_FIELD: &str = "event_timestamp";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityConfig {
    pub name: String,
    pub join_key: String,
    pub key_type: KeyType,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureConfig {
    pub name: String,
    #[serde(rename = "type")]
    pub dtype: FeatureType,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawView {
    name: String,
    entity: String,
    max_age: String,
    #[serde(default)]
    timestamp_field: Option<String>,
    #[serde(default)]
    timestamp_unit: TimestampUnit,
    features: Vec<FeatureConfig>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawViews {
    #[serde(default)]
    entities: Vec<EntityConfig>,
    #[serde(default)]
    views: Vec<RawView>,
}

/// One declared feature view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewConfig {
    pub name: String,
    pub entity: String,
    pub max_age: Duration,
    pub timestamp_field: String,
    /// Unit of numeric timestamps in this view's ingest files (`timestamp_unit`).
    pub timestamp_unit: TimestampUnit,
    pub features: Vec<FeatureConfig>,
}

/// The unit of a numeric (integer or decimal) timestamp in an ingest file: Unix
/// seconds, milliseconds or microseconds since 1970-01-01T00:00:00Z. Text
/// timestamps (RFC 3339) and Parquet `Timestamp` columns carry their own unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum TimestampUnit {
    /// `"s"`: Unix seconds (the default).
    #[default]
    #[serde(rename = "s")]
    Seconds,
    /// `"ms"`: Unix milliseconds.
    #[serde(rename = "ms")]
    Millis,
    /// `"us"`: Unix microseconds.
    #[serde(rename = "us")]
    Micros,
}

impl TimestampUnit {
    /// Microseconds per unit.
    pub fn micros_per_unit(self) -> i64 {
        match self {
            TimestampUnit::Seconds => 1_000_000,
            TimestampUnit::Millis => 1_000,
            TimestampUnit::Micros => 1,
        }
    }

    /// `"s"`, `"ms"` or `"us"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimestampUnit::Seconds => "s",
            TimestampUnit::Millis => "ms",
            TimestampUnit::Micros => "us",
        }
    }
}

impl std::fmt::Display for TimestampUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TimestampUnit {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "s" => Ok(TimestampUnit::Seconds),
            "ms" => Ok(TimestampUnit::Millis),
            "us" => Ok(TimestampUnit::Micros),
            _ => Err(format!("{s:?} is not a timestamp unit: use s, ms or us")),
        }
    }
}

/// The parsed, self-consistent views file.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewsConfig {
    pub entities: Vec<EntityConfig>,
    pub views: Vec<ViewConfig>,
}

impl ViewsConfig {
    /// Reads and validates a views file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| FeatureStoreError::Config {
            what: format!("cannot read views file {}: {e}", path.display()),
        })?;
        Self::from_toml_str(&text).map_err(|e| match e {
            FeatureStoreError::Config { what } => FeatureStoreError::Config {
                what: format!("{}: {what}", path.display()),
            },
            other => other,
        })
    }

    /// Parses and validates a views file's text.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let raw: RawViews = toml::from_str(text).map_err(|e| FeatureStoreError::Config {
            what: format!("invalid views TOML: {e}"),
        })?;
        let mut views = Vec::with_capacity(raw.views.len());
        for v in raw.views {
            let max_age = parse_duration(&v.max_age).map_err(|what| FeatureStoreError::Config {
                what: format!("view {:?}: max_age: {what}", v.name),
            })?;
            views.push(ViewConfig {
                name: v.name,
                entity: v.entity,
                max_age,
                timestamp_field: v
                    .timestamp_field
                    .unwrap_or_else(|| DEFAULT_TIMESTAMP_FIELD.to_owned()),
                timestamp_unit: v.timestamp_unit,
                features: v.features,
            });
        }
        let cfg = ViewsConfig {
            entities: raw.entities,
            views,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn entity(&self, name: &str) -> Option<&EntityConfig> {
        self.entities.iter().find(|e| e.name == name)
    }

    pub fn view(&self, name: &str) -> Option<&ViewConfig> {
        self.views.iter().find(|v| v.name == name)
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(FeatureStoreError::Config { what });
        if self.views.is_empty() {
            return bad("the views file declares no views".into());
        }
        let mut names = HashSet::new();
        for e in &self.entities {
            check_name("entity", &e.name)?;
            check_name("join key", &e.join_key)?;
            if !names.insert(e.name.as_str()) {
                return bad(format!("entity {:?} is declared twice", e.name));
            }
        }
        let mut names = HashSet::new();
        for v in &self.views {
            check_name("view", &v.name)?;
            if !names.insert(v.name.as_str()) {
                return bad(format!("view {:?} is declared twice", v.name));
            }
            let Some(entity) = self.entity(&v.entity) else {
                return bad(format!(
                    "view {:?} names unknown entity {:?}",
                    v.name, v.entity
                ));
            };
            check_name("timestamp field", &v.timestamp_field)?;
            if v.max_age.is_zero() {
                return bad(format!("view {:?}: max_age must be > 0", v.name));
            }
            if v.features.is_empty() {
                return bad(format!("view {:?} has no features", v.name));
            }
            // Feature ids are u16 in the encoding; far more than any view needs.
            if v.features.len() > 10_000 {
                return bad(format!("view {:?} has more than 10000 features", v.name));
            }
            let mut fnames = HashSet::new();
            for f in &v.features {
                check_name("feature", &f.name)?;
                if !fnames.insert(f.name.as_str()) {
                    return bad(format!(
                        "view {:?}: feature {:?} is declared twice",
                        v.name, f.name
                    ));
                }
                // Ingest files carry the join key and timestamp as columns next to the
                // features; a feature with the same name would be ambiguous.
                if f.name == entity.join_key || f.name == v.timestamp_field {
                    return bad(format!(
                        "view {:?}: feature {:?} clashes with the join key or timestamp field",
                        v.name, f.name
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(FeatureStoreError::Config {
            what: format!("{kind} name {name:?} must be 1-128 characters of [A-Za-z0-9_]"),
        })
    }
}

/// Parses "500ms", "90s", "30m", "1h", "7d" (one integer and one unit).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("{s:?} is not a duration like \"500ms\", \"90s\", \"30m\", \"1h\", \"7d\"")
    })?;
    let secs = |mult: u64| {
        n.checked_mul(mult)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?} is too large"))
    };
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => Err(format!("{s:?}: unit must be one of ms, s, m, h, d")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn rejects_unknown_entity_and_duplicates() {
        let base = r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"
"#;
        let unknown = format!(
            "{base}\n[[views]]\nname = \"v\"\nentity = \"merchant\"\nmax_age = \"1h\"\nfeatures = [{{ name = \"a\", type = \"f32\" }}]\n"
        );
        let err = ViewsConfig::from_toml_str(&unknown)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown entity"), "{err}");
        let dup = format!(
            "{base}\n[[views]]\nname = \"v\"\nentity = \"card\"\nmax_age = \"1h\"\nfeatures = [{{ name = \"a\", type = \"f32\" }}, {{ name = \"a\", type = \"i64\" }}]\n"
        );
        let err = ViewsConfig::from_toml_str(&dup).unwrap_err().to_string();
        assert!(err.contains("declared twice"), "{err}");
        let bad_type = format!(
            "{base}\n[[views]]\nname = \"v\"\nentity = \"card\"\nmax_age = \"1h\"\nfeatures = [{{ name = \"a\", type = \"f16\" }}]\n"
        );
        assert!(ViewsConfig::from_toml_str(&bad_type).is_err());
    }
}
