//! The model's input spec (`[input_spec]` in model.toml) and decision thresholds
//! (`[decision]`): how feature-store values and request features become the
//! model's input row, and how its score becomes approve / review / decline. The
//! same spec ships with the model in its repository, so training and serving share it.
//!
//! ```toml
//! [input_spec]
//! on_missing = "default"            # default for every entry: "default" | "refuse"
//! [[input_spec.features]]
//! source = "request:amount"         # request:<name> | <view>:<feature> | const:<number>
//! transforms = ["log1p", { standardize = { mean = 3.2, std = 1.1 } }, { clip = { min = -5.0, max = 5.0 } }]
//! default = 0.0                     # used when missing, NULL or stale (unless refused)
//! [[input_spec.features]]
//! source = "request:merchant_category"
//! one_hot = ["grocery", "travel", "electronics"]   # fills one position per category
//! on_missing = "refuse"             # a missing value means: do not score, fall back
//!
//! [decision]
//! review_at = 0.5                   # score >= review_at -> review
//! decline_at = 0.9                  # score >= decline_at -> decline
//! ```
use std::collections::BTreeSet;
use std::sync::Arc;

use mesh_feature_store::{FeatureType, ViewInfo};
use mesh_model_actor::ModelConfig;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    #[default]
    Default,
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transform {
    Log1p,
    Standardize { mean: f64, std: f64 },
    Clip { min: f64, max: f64 },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawTransform {
    Name(String),
    Table(Transform),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    source: String,
    #[serde(default)]
    transforms: Vec<RawTransform>,
    default: Option<f64>,
    on_missing: Option<OnMissing>,
    one_hot: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    on_missing: OnMissing,
    features: Vec<RawEntry>,
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A request feature (numeric or categorical), by name.
    Request(String),
    /// A feature-store feature: `view:feature`.
    Store {
        view: String,
        feature: String,
    },
    Const(f64),
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub source: Source,
    /// [`Entry::name`], made once: every decision's features (and its log record) share it.
    pub label: Arc<str>,
    pub transforms: Vec<Transform>,
    pub default: f64,
    pub on_missing: OnMissing,
    /// Categories for a one-hot entry (one position each); `None` for a number.
    pub one_hot: Option<Vec<String>>,
}

impl Entry {
    /// Positions this entry fills in the row.
    pub fn width(&self) -> usize {
        self.one_hot.as_ref().map_or(1, Vec::len)
    }

    /// `view:feature` or `request:name` (for logs and messages).
    pub fn name(&self) -> String {
        self.label.to_string()
    }

    /// The name of an entry reading `source` (what [`Entry::label`] holds).
    pub fn label_of(source: &Source) -> Arc<str> {
        match source {
            Source::Request(n) => format!("request:{n}"),
            Source::Store { view, feature } => format!("{view}:{feature}"),
            Source::Const(c) => format!("const:{c}"),
        }
        .into()
    }

    /// Applies the transforms in order.
    pub fn transform(&self, mut x: f64) -> f64 {
        for t in &self.transforms {
            x = match *t {
                Transform::Log1p => x.max(-0.999_999).ln_1p(),
                Transform::Standardize { mean, std } => (x - mean) / std,
                Transform::Clip { min, max } => x.clamp(min, max),
            };
        }
        x
    }
}

/// Score thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub review_at: f64,
    pub decline_at: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            review_at: 0.5,
            decline_at: 0.9,
        }
    }
}

/// The decision of a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Approve,
    Review,
    Decline,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Review => "review",
            Self::Decline => "decline",
        }
    }
}

impl Thresholds {
    pub fn verdict(&self, score: f64) -> Verdict {
        if score >= self.decline_at {
            Verdict::Decline
        } else if score >= self.review_at {
            Verdict::Review
        } else {
            Verdict::Approve
        }
    }
}

/// A model's input spec and thresholds, validated against its input width.
#[derive(Debug, Clone)]
pub struct DecisionSpec {
    pub entries: Vec<Entry>,
    pub thresholds: Thresholds,
    /// Feature-store references (`view:feature`) the spec reads, for one lookup.
    pub store_features: Vec<String>,
    /// Views the spec reads.
    pub views: BTreeSet<String>,
}

fn parse_transform(t: RawTransform) -> Result<Transform, String> {
    match t {
        RawTransform::Name(n) if n == "log1p" => Ok(Transform::Log1p),
        RawTransform::Name(n) => Err(format!(
            "unknown transform '{n}' (log1p, standardize, clip)"
        )),
        RawTransform::Table(Transform::Standardize { std, .. }) if !(std > 0.0) => {
            Err("standardize needs std > 0".into())
        }
        RawTransform::Table(t) => Ok(t),
    }
}

fn parse_source(s: &str) -> Result<Source, String> {
    let (kind, name) = s
        .split_once(':')
        .ok_or_else(|| format!("source '{s}' is not 'request:x', 'view:x' or 'const:n'"))?;
    if name.is_empty() {
        return Err(format!("source '{s}' names nothing"));
    }
    Ok(match kind {
        "request" => Source::Request(name.to_owned()),
        "const" => Source::Const(
            name.parse()
                .map_err(|_| format!("source '{s}': not a number"))?,
        ),
        view => Source::Store {
            view: view.to_owned(),
            feature: name.to_owned(),
        },
    })
}

impl DecisionSpec {
    /// Reads `[input_spec]` and `[decision]` of a model. A model without an input
    /// spec cannot take decisions (it is still served over OIP).
    pub fn from_model(config: &ModelConfig) -> Result<Option<Self>, String> {
        let Some(raw) = config.extra.get("input_spec") else {
            return Ok(None);
        };
        let raw: RawSpec = raw
            .clone()
            .try_into()
            .map_err(|e| format!("[input_spec]: {e}"))?;
        let thresholds = match config.extra.get("decision") {
            Some(d) => d
                .clone()
                .try_into()
                .map_err(|e| format!("[decision]: {e}"))?,
            None => Thresholds::default(),
        };
        if !(thresholds.review_at <= thresholds.decline_at) {
            return Err("[decision]: review_at must not exceed decline_at".into());
        }
        let mut entries = Vec::new();
        for (i, e) in raw.features.into_iter().enumerate() {
            let ctx = |m: String| format!("[input_spec].features[{i}]: {m}");
            let source = parse_source(&e.source).map_err(ctx)?;
            let transforms = e
                .transforms
                .into_iter()
                .map(parse_transform)
                .collect::<Result<Vec<_>, _>>()
                .map_err(ctx)?;
            if e.one_hot.as_ref().is_some_and(Vec::is_empty) {
                return Err(ctx("one_hot needs at least one category".into()));
            }
            entries.push(Entry {
                label: Entry::label_of(&source),
                source,
                transforms,
                default: e.default.unwrap_or(0.0),
                on_missing: e.on_missing.unwrap_or(raw.on_missing),
                one_hot: e.one_hot,
            });
        }
        let width: usize = entries.iter().map(Entry::width).sum();
        let want = config.input().row_width();
        if width != want {
            return Err(format!(
                "[input_spec] fills {width} positions but model '{}' takes {want}",
                config.name
            ));
        }
        let mut store_features = Vec::new();
        let mut views = BTreeSet::new();
        for e in &entries {
            if let Source::Store { view, feature } = &e.source {
                store_features.push(format!("{view}:{feature}"));
                views.insert(view.clone());
            }
        }
        store_features.dedup();
        Ok(Some(Self {
            entries,
            thresholds,
            store_features,
            views,
        }))
    }
}

/// Edit distance of two short names (for "did you mean").
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest of `names` to `name`, when it is close enough to be a typo.
fn closest<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    names
        .map(|n| (distance(name, n), n))
        .filter(|(d, n)| *d <= 3.max(n.len() / 4))
        .min()
        .map(|(_, n)| n)
}

impl DecisionSpec {
    /// Checks every `view:feature` source against the feature store's views: the
    /// view and the feature exist, and the feature's type fits the entry (a number
    /// for a plain entry; any scalar for a one-hot entry). The message names the
    /// entry (`[input_spec].features[i]`) and the source as written.
    pub fn check_views(&self, views: &[ViewInfo]) -> Result<(), String> {
        for (i, e) in self.entries.iter().enumerate() {
            let Source::Store { view, feature } = &e.source else {
                continue;
            };
            let at = format!("[input_spec].features[{i}] source = \"{view}:{feature}\"");
            let Some(v) = views.iter().find(|v| v.name == *view) else {
                let known: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
                let hint = closest(view, known.iter().copied())
                    .map(|n| format!("; did you mean '{n}'?"))
                    .unwrap_or_default();
                return Err(format!(
                    "{at}: the feature store has no view '{view}' (views: {}){hint}",
                    known.join(", ")
                ));
            };
            let Some(f) = v.features.iter().find(|f| f.name == *feature) else {
                let hint = closest(feature, v.features.iter().map(|f| f.name.as_str()))
                    .map(|n| format!("did you mean '{view}:{n}'? "))
                    .unwrap_or_default();
                let known: Vec<&str> = v.features.iter().map(|f| f.name.as_str()).collect();
                return Err(format!(
                    "{at}: view '{view}' has no feature '{feature}'; {hint}(its features: {})",
                    known.join(", ")
                ));
            };
            let fits = match (&e.one_hot, f.dtype) {
                (_, FeatureType::F32Vector) => false,
                (Some(_), _) => true,
                (None, t) => t != FeatureType::String,
            };
            if !fits {
                return Err(format!(
                    "{at}: '{view}:{feature}' is of type {}, which {}",
                    f.dtype,
                    if e.one_hot.is_some() {
                        "cannot be one-hot encoded"
                    } else {
                        "is not a number (give the entry one_hot categories)"
                    }
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(spec: &str) -> ModelConfig {
        ModelConfig::parse(
            &format!(
                r#"
                kind = "mlp"
                [[inputs]]
                name = "input"
                datatype = "FP32"
                dims = [4]
                [[outputs]]
                name = "p"
                datatype = "FP32"
                dims = [1]
                [mlp]
                activations = []
                output_activation = "sigmoid"
                {spec}
                "#
            ),
            "m",
        )
        .unwrap()
    }

    #[test]
    fn spec_parses_and_counts_positions() {
        let c = model(
            r#"
            [input_spec]
            [[input_spec.features]]
            source = "request:amount"
            transforms = ["log1p", { standardize = { mean = 1.0, std = 2.0 } }, { clip = { min = -1.0, max = 1.0 } }]
            [[input_spec.features]]
            source = "request:category"
            one_hot = ["a", "b"]
            on_missing = "refuse"
            [[input_spec.features]]
            source = "card:txn_count"
            [decision]
            review_at = 0.3
            decline_at = 0.8
            "#,
        );
        let s = DecisionSpec::from_model(&c).unwrap().unwrap();
        assert_eq!(s.entries.len(), 3);
        assert_eq!(s.store_features, vec!["card:txn_count".to_string()]);
        assert_eq!(s.entries[1].on_missing, OnMissing::Refuse);
        // log1p(e - 1) = 1 -> (1 - 1) / 2 = 0
        assert!((s.entries[0].transform(std::f64::consts::E - 1.0)).abs() < 1e-12);
        assert_eq!(s.entries[0].transform(1e9), 1.0);
        assert_eq!(s.thresholds.verdict(0.29), Verdict::Approve);
        assert_eq!(s.thresholds.verdict(0.3), Verdict::Review);
        assert_eq!(s.thresholds.verdict(0.95), Verdict::Decline);
    }

    #[test]
    fn width_mismatch_and_bad_sources_are_named() {
        let c = model("[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\n");
        assert!(DecisionSpec::from_model(&c)
            .unwrap_err()
            .contains("fills 1 positions"));
        let c = model("[input_spec]\n[[input_spec.features]]\nsource = \"nocolon\"\none_hot=[\"a\",\"b\",\"c\",\"d\"]\n");
        assert!(DecisionSpec::from_model(&c)
            .unwrap_err()
            .contains("nocolon"));
        let c = model("[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\ntransforms=[\"sqrt\"]\none_hot=[\"a\",\"b\",\"c\",\"d\"]\n");
        assert!(DecisionSpec::from_model(&c).unwrap_err().contains("sqrt"));
    }

    #[test]
    fn store_sources_are_checked_against_the_views() {
        use crate::decide::testing;
        let (_dir, store) = testing::store();
        let views = store.views();
        let spec = |source: &str, one_hot: bool| {
            let extra = if one_hot {
                "one_hot = [\"a\", \"b\", \"c\", \"d\"]"
            } else {
                ""
            };
            let mut text =
                format!("[input_spec]\n[[input_spec.features]]\nsource = \"{source}\"\n{extra}\n");
            if !one_hot {
                text += "[[input_spec.features]]\nsource = \"request:a\"\none_hot = [\"x\", \"y\", \"z\"]\n";
            }
            DecisionSpec::from_model(&model(&text)).unwrap().unwrap()
        };
        assert!(spec("card:f31", false).check_views(views).is_ok());
        assert!(spec("card:f31", true).check_views(views).is_ok());
        let e = spec("card:f3l", false).check_views(views).unwrap_err();
        assert_eq!(
            e,
            "[input_spec].features[0] source = \"card:f3l\": view 'card' has no feature 'f3l'; did you mean 'card:f31'? (its features: f31)"
        );
        let e = spec("cards:f31", false).check_views(views).unwrap_err();
        assert!(
            e.contains("no view 'cards'") && e.contains("did you mean 'card'"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let c = model(
            "[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\nonehot = [\"a\"]\n",
        );
        assert!(DecisionSpec::from_model(&c).unwrap_err().contains("onehot"));
        let c = model("[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\none_hot=[\"a\",\"b\",\"c\",\"d\"]\n[decision]\nreview = 0.4\n");
        assert!(DecisionSpec::from_model(&c).unwrap_err().contains("review"));
    }
}
