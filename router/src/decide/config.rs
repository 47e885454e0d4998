//! `[decisions]` of mesh.toml: deadline budget, rules, defaults, deployments.
//!
//! ```toml
//! [decisions]
//! deadline_ms = 50              # budget of one decision (capped by the caller's grpc-timeout)
//! default_decision = "review"   # the last fallback
//! max_batch_items = 256         # DecideBatch limit
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
//! remote = ["http://10.1.2.3:8001"]   # `mesh serve --role model` replicas
//! batch_score = { view = "fraud_scores", feature = "score" }
//! ```
use std::collections::HashMap;

use mesh_stack::StackConfig;
use serde::Deserialize;

use super::spec::Verdict;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecisionsConfig {
    pub deadline_ms: u64,
    pub default_decision: Verdict,
    pub max_batch_items: usize,
    pub stack: StackConfig,
    pub rules: Vec<Rule>,
    pub deployments: Vec<Deployment>,
}

impl Default for DecisionsConfig {
    fn default() -> Self {
        Self {
            deadline_ms: 50,
            default_decision: Verdict::Review,
            max_batch_items: 256,
            stack: StackConfig::default(),
            rules: Vec::new(),
            deployments: Vec::new(),
        }
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    pub model: String,
    pub primary: Option<u64>,
    pub canary: Option<Canary>,
    pub shadow: Option<u64>,
    #[serde(default)]
    pub remote: Vec<String>,
    pub batch_score: Option<BatchScore>,
}

impl DecisionsConfig {
    pub fn deployment(&self, model: &str) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.model == model)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.stack
            .validate()
            .map_err(|e| format!("[decisions.stack]: {e}"))?;
        for d in &self.deployments {
            if let Some(c) = &d.canary {
                if !(0.0..=1.0).contains(&c.weight) {
                    return Err(format!(
                        "deployment '{}': canary weight {} is not within 0..=1",
                        d.model, c.weight
                    ));
                }
            }
        }
        if self.max_batch_items == 0 {
            return Err("[decisions] max_batch_items must be at least 1".into());
        }
        Ok(())
    }
}
