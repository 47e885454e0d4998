//! `[decisions]` of mesh.toml: deadline budget, rules, defaults, deployments.
//!
//! ```toml
//! [decisions]
//! deadline = "50ms"             # budget of one decision (capped by the caller's grpc-timeout)
//! default_decision = "review"   # the last fallback
//! max_batch_items = 256         # DecideBatch limit
//! resolve_interval = "5s"       # remote names are resolved again this often
//! max_addresses_per_name = 64   # replicas one remote name may stand for
//!
//! [decisions.stack]             # retry budget, breakers, per-try timeout: see stack/README.md
//! per_try_timeout = "20ms"
//!
//! [[decisions.rules]]           # applied to every answer; the strictest decision wins
//! name = "large_amount"
//! feature = "amount"
//! above = 5000.0
//! decision = "review"
//!
//! [[decisions.deployments]]
//! model = "fraud_mlp"
//! primary = 1                   # default: the newest ready version
//! canary = { version = 2, weight = 0.1 }
//! shadow = 3                    # gets a copy of each request; logged, never returned
//! remote = ["http://10.1.2.3:8001", "http://model.mesh.svc:8001"]   # `mesh serve --role model`
//!                               # replicas: an IP is one replica, a name one per address
//! batch_score = { view = "fraud_scores", feature = "score" }
//! max_defaulted_features = 4    # more defaulted features than this: not scored, falls back
//!
//! [[decisions.deployments]]     # canary and shadow may be other models, of any kind
//! model = "fraud_lgbm"
//! canary = { model = "fraud_xgb", weight = 0.2 }   # version: default the newest ready
//! shadow = { model = "fraud_mlp", version = 1 }
//! ```
//!
//! A canary or shadow that names another model (`model = "..."`) is decided with that
//! model's own `[input_spec]` and `[decision]` thresholds: the one feature lookup of a
//! request reads the features of every model of the deployment, the answer and the
//! log name the model and version that answered, with its role, and the canary's
//! fallbacks are that model's previous versions, then the deployment's batch score,
//! the rules and the default. A request that pins a version is the primary model's.
//!
//! Old spellings of the deadline, still read with a deprecation notice:
//! `[decisions] deadline_ms = 50` and `[decisions.stack] deadline = "50ms"`
//! (the latter used to be accepted and ignored). Two spellings that disagree
//! refuse the file.
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use mesh_stack::config::duration;
use mesh_stack::StackConfig;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::spec::Verdict;
use crate::config::{millis, resolve_renamed};

/// The shortest `[decisions] resolve_interval` (a bound on the resolver's load).
pub const MIN_RESOLVE_INTERVAL: Duration = Duration::from_millis(100);

/// The largest `[decisions] max_addresses_per_name`.
pub const MAX_ADDRESSES_PER_NAME: usize = 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "DecisionsFile")]
pub struct DecisionsConfig {
    /// Budget of one decision, from arrival to answer (fallbacks included),
    /// capped by the caller's grpc-timeout. Default 50 ms.
    pub deadline: Duration,
    /// The answer when nothing else can answer.
    pub default_decision: Verdict,
    /// Most items in one `DecideBatch`.
    pub max_batch_items: usize,
    /// How often a `remote` entry's host name is resolved again. Default 5 s.
    pub resolve_interval: Duration,
    /// Most addresses (replicas) one `remote` name may stand for; the lowest are
    /// kept past it. Default 64.
    pub max_addresses_per_name: usize,
    /// The model-call stack (`[decisions.stack]`).
    pub stack: StackConfig,
    pub rules: Vec<Rule>,
    pub deployments: Vec<Deployment>,
}

impl Default for DecisionsConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(50),
            default_decision: Verdict::Review,
            max_batch_items: 256,
            resolve_interval: Duration::from_secs(5),
            max_addresses_per_name: 64,
            stack: StackConfig::default(),
            rules: Vec::new(),
            deployments: Vec::new(),
        }
    }
}

/// `[decisions]` as written, old spellings included.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DecisionsFile {
    #[serde(deserialize_with = "duration::option")]
    deadline: Option<Duration>,
    deadline_ms: Option<u64>,
    default_decision: Verdict,
    max_batch_items: usize,
    #[serde(deserialize_with = "duration::deserialize")]
    resolve_interval: Duration,
    max_addresses_per_name: usize,
    stack: StackTable,
    rules: Vec<Rule>,
    deployments: Vec<Deployment>,
}

impl Default for DecisionsFile {
    fn default() -> Self {
        let d = DecisionsConfig::default();
        Self {
            deadline: None,
            deadline_ms: None,
            default_decision: d.default_decision,
            max_batch_items: d.max_batch_items,
            resolve_interval: d.resolve_interval,
            max_addresses_per_name: d.max_addresses_per_name,
            stack: StackTable::default(),
            rules: d.rules,
            deployments: d.deployments,
        }
    }
}

impl TryFrom<DecisionsFile> for DecisionsConfig {
    type Error = String;

    fn try_from(f: DecisionsFile) -> Result<Self, String> {
        let deadline = resolve_renamed(
            ("[decisions] deadline", f.deadline),
            &[
                ("[decisions] deadline_ms", millis(f.deadline_ms)),
                ("[decisions.stack] deadline", f.stack.deadline),
            ],
        )?;
        Ok(Self {
            deadline: deadline.unwrap_or(DecisionsConfig::default().deadline),
            default_decision: f.default_decision,
            max_batch_items: f.max_batch_items,
            resolve_interval: f.resolve_interval,
            max_addresses_per_name: f.max_addresses_per_name,
            stack: f.stack.config,
            rules: f.rules,
            deployments: f.deployments,
        })
    }
}

/// `[decisions.stack]`: a [`StackConfig`], plus the old `deadline` key that
/// the stack no longer has (it is `[decisions] deadline` now).
#[derive(Default)]
struct StackTable {
    deadline: Option<Duration>,
    config: StackConfig,
}

impl<'de> Deserialize<'de> for StackTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TableVisitor;
        impl<'de> Visitor<'de> for TableVisitor {
            type Value = StackTable;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the [decisions.stack] table")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StackTable, A::Error> {
                let mut deadline = None;
                let config = StackConfig::deserialize(de::value::MapAccessDeserializer::new(
                    WithoutDeadline {
                        map,
                        deadline: &mut deadline,
                    },
                ))?;
                Ok(StackTable { deadline, config })
            }
        }
        d.deserialize_map(TableVisitor)
    }
}

/// The entries of a table minus `deadline`, which it keeps aside.
struct WithoutDeadline<'a, A> {
    map: A,
    deadline: &'a mut Option<Duration>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithoutDeadline<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<String>()? else {
                return Ok(None);
            };
            if key == "deadline" {
                *self.deadline = Some(self.map.next_value_seed(DurationSeed)?);
                continue;
            }
            return seed
                .deserialize(IntoDeserializer::<A::Error>::into_deserializer(key))
                .map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// The value of the old `[decisions.stack] deadline`: a duration string, or
/// (as it was also accepted) a bare integer of milliseconds.
struct DurationSeed;

impl<'de> DeserializeSeed<'de> for DurationSeed {
    type Value = Duration;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for DurationSeed {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"50ms\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        mesh_stack::parse_duration(s).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, ms: u64) -> Result<Duration, E> {
        Ok(Duration::from_millis(ms))
    }

    fn visit_i64<E: de::Error>(self, ms: i64) -> Result<Duration, E> {
        u64::try_from(ms)
            .map(Duration::from_millis)
            .map_err(|_| E::custom(format!("a duration cannot be negative ({ms})")))
    }
}

/// A request-feature threshold that forces at least `decision`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    pub feature: String,
    pub above: f64,
    pub decision: Verdict,
}

impl Rule {
    pub fn fires(&self, features: &HashMap<String, f64>) -> bool {
        features.get(&self.feature).is_some_and(|v| *v > self.above)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    pub version: u64,
    pub weight: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchScore {
    pub view: String,
    #[serde(default = "default_score_feature")]
    pub feature: String,
}

fn default_score_feature() -> String {
    "score".to_owned()
}

/// A canary or shadow that is another model of the repository (any kind).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelArm {
    pub model: String,
    /// Default: the newest ready version.
    pub version: Option<u64>,
    /// The canary's share of traffic (1.0 for a shadow: it gets every copy).
    pub weight: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawDeployment")]
pub struct Deployment {
    pub model: String,
    pub primary: Option<u64>,
    /// A canary version of this model.
    pub canary: Option<Canary>,
    /// A shadow version of this model.
    pub shadow: Option<u64>,
    /// A canary that is another model (`canary = { model = "...", weight = ... }`).
    pub canary_model: Option<ModelArm>,
    /// A shadow that is another model (`shadow = { model = "..." }`).
    pub shadow_model: Option<ModelArm>,
    pub remote: Vec<String>,
    pub batch_score: Option<BatchScore>,
    /// Most features a decision may fill with the spec's defaults (unknown entity,
    /// stale or null values, a failed lookup, a request feature not sent) and still
    /// be scored; past it the model is not called and the fallback chain answers.
    /// Default: no limit (every default is still named in the reasons and counted).
    pub max_defaulted_features: Option<usize>,
}

/// A deployment as written: `canary` and `shadow` may name another model.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeployment {
    model: String,
    primary: Option<u64>,
    canary: Option<RawCanary>,
    shadow: Option<RawShadow>,
    #[serde(default)]
    remote: Vec<String>,
    batch_score: Option<BatchScore>,
    max_defaulted_features: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    model: Option<String>,
    version: Option<u64>,
    weight: f64,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a version number or { model = \"...\", version = N }"
)]
enum RawShadow {
    Version(u64),
    Arm(RawShadowArm),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShadowArm {
    model: Option<String>,
    version: Option<u64>,
}

impl TryFrom<RawDeployment> for Deployment {
    type Error = String;

    fn try_from(d: RawDeployment) -> Result<Self, String> {
        let other = |m: &Option<String>| m.as_ref().filter(|m| **m != d.model).cloned();
        let (mut canary, mut canary_model) = (None, None);
        if let Some(c) = d.canary {
            match (other(&c.model), c.version) {
                (Some(model), version) => {
                    canary_model = Some(ModelArm {
                        model,
                        version,
                        weight: c.weight,
                    })
                }
                (None, Some(version)) => {
                    canary = Some(Canary {
                        version,
                        weight: c.weight,
                    })
                }
                (None, None) => {
                    return Err(format!(
                        "deployment '{}': a canary of the same model names its version (canary = {{ version = N, weight = W }})",
                        d.model
                    ))
                }
            }
        }
        let (mut shadow, mut shadow_model) = (None, None);
        match d.shadow {
            None => {}
            Some(RawShadow::Version(v)) => shadow = Some(v),
            Some(RawShadow::Arm(a)) => match (other(&a.model), a.version) {
                (Some(model), version) => {
                    shadow_model = Some(ModelArm {
                        model,
                        version,
                        weight: 1.0,
                    })
                }
                (None, Some(v)) => shadow = Some(v),
                (None, None) => {
                    return Err(format!(
                    "deployment '{}': a shadow of the same model names its version (shadow = N)",
                    d.model
                ))
                }
            },
        }
        Ok(Self {
            model: d.model,
            primary: d.primary,
            canary,
            shadow,
            canary_model,
            shadow_model,
            remote: d.remote,
            batch_score: d.batch_score,
            max_defaulted_features: d.max_defaulted_features,
        })
    }
}

impl Deployment {
    /// The models this deployment decides with: its own, then its other-model
    /// canary and shadow.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.model.as_str())
            .chain(self.canary_model.as_ref().map(|a| a.model.as_str()))
            .chain(self.shadow_model.as_ref().map(|a| a.model.as_str()))
    }
}

impl DecisionsConfig {
    /// The budget of one decision (capped by the caller's grpc-timeout).
    pub fn deadline(&self) -> std::time::Duration {
        self.deadline
    }

    /// How `remote` names are kept fresh.
    pub fn discovery(&self) -> super::discovery::DiscoveryConfig {
        super::discovery::DiscoveryConfig {
            interval: self.resolve_interval,
            max_addresses: self.max_addresses_per_name,
        }
    }

    pub fn deployment(&self, model: &str) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.model == model)
    }

    /// Whether a deployment decides with `model` (as its model, or its other-model
    /// canary or shadow).
    pub fn decides_with(&self, model: &str) -> bool {
        self.deployments
            .iter()
            .any(|d| d.models().any(|m| m == model))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.deadline.is_zero() {
            return Err("[decisions] deadline must be more than 0".into());
        }
        self.stack
            .validate()
            .map_err(|e| format!("[decisions.stack]: {e}"))?;
        for d in &self.deployments {
            let weight = d
                .canary
                .as_ref()
                .map(|c| c.weight)
                .or(d.canary_model.as_ref().map(|a| a.weight));
            if let Some(w) = weight {
                if !(0.0..=1.0).contains(&w) {
                    return Err(format!(
                        "deployment '{}': canary weight {w} is not within 0..=1",
                        d.model
                    ));
                }
            }
        }
        if self.max_batch_items == 0 {
            return Err("[decisions] max_batch_items must be at least 1".into());
        }
        if self.resolve_interval < MIN_RESOLVE_INTERVAL {
            return Err(format!(
                "[decisions] resolve_interval must be at least {}",
                mesh_stack::format_duration(MIN_RESOLVE_INTERVAL)
            ));
        }
        if !(1..=MAX_ADDRESSES_PER_NAME).contains(&self.max_addresses_per_name) {
            return Err(format!(
                "[decisions] max_addresses_per_name must be within 1..={MAX_ADDRESSES_PER_NAME}"
            ));
        }
        for d in &self.deployments {
            for url in &d.remote {
                super::discovery::Target::parse(url)
                    .map_err(|e| format!("deployment '{}': {e}", d.model))?;
            }
        }
        Ok(())
    }
}
