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
//! [[input_spec.features]]
//! source = "card:home_country"      # a categorical source (tree models): text -> code
//! categories = ["US", "GB", "DE"]   # code = position in the list (pandas' category codes)
//! on_missing = "nan"                # missing -> NaN (only where the model accepts missing)
//!
//! [decision]
//! review_at = 0.5                   # score >= review_at -> review
//! decline_at = 0.9                  # score >= decline_at -> decline
//! ```
//!
//! Missing values: `on_missing` says what a value that is missing (a request
//! feature not sent; a store value NOT_FOUND, NULL, OUTSIDE_MAX_AGE or
//! UNAVAILABLE) becomes: `"default"` the entry's `default`, `"refuse"` no score
//! (the fallback chain answers), `"nan"` NaN, the model's own missing value, which
//! the tree evaluators route by each node's default direction. `"nan"` is accepted
//! only for an entry of one position whose column the model declares missing
//! (`[trees] missing`); anywhere else (the MLP, ONNX) it refuses the load. A request
//! sends a missing value by leaving the feature out: NaN in a request is refused.
//!
//! Categorical sources: an entry with `categories` maps a text value (a request's
//! categorical feature, or a store string; a number is read as its decimal text) to
//! its position in the list, the integer code the model was trained with. A value
//! that is not in the list is **unseen**: logged with status `UNSEEN`, named in the
//! reasons and counted like a missing value, and the entry's `on_missing` applies
//! (`"nan"`: sent as missing, as XGBoost and LightGBM treat a category pandas could
//! not code; `"default"`: the entry's `default`, which a `categories` entry must
//! then give, as a code; `"refuse"`: not scored). A column the model declares
//! categorical (`[trees] categorical`) takes a `categories` entry, a `const`, or a
//! plain entry without transforms whose values are already codes; every row is
//! checked against the model's column rules before it is sent, so a value that is
//! not a code (2.5, -1) is refused naming the entry, never scored.
use std::collections::BTreeSet;
use std::sync::Arc;

use mesh_feature_store::{FeatureType, ViewInfo};
use mesh_model_actor::config::ColumnRules;
use mesh_model_actor::ModelConfig;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    /// The entry's `default`.
    #[default]
    Default,
    /// Not scored: the fallback chain answers.
    Refuse,
    /// NaN, the model's missing value (only where the model accepts missing).
    Nan,
}

impl OnMissing {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Refuse => "refuse",
            Self::Nan => "nan",
        }
    }
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
    categories: Option<Vec<String>>,
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
    /// Categories of a categorical source: the value's position in the list is
    /// the code sent; a value not in it is unseen (see the module docs).
    pub categories: Option<Vec<String>>,
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

    /// The code of a categorical value: its position in `categories`.
    pub fn code(&self, text: &str) -> Option<usize> {
        self.categories.as_ref()?.iter().position(|c| c == text)
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
    /// Feature-store references (`view:feature`) the spec reads, for one lookup
    /// (shared with each lookup's request, not copied into it).
    pub store_features: std::sync::Arc<[String]>,
    /// Views the spec reads.
    pub views: BTreeSet<String>,
    /// What each position of the row may hold (the model's `[trees] missing` and
    /// `categorical` columns; finite values only for the MLP): every built row is
    /// checked against it before it is sent.
    pub columns: ColumnRules,
}

fn parse_transform(t: RawTransform) -> Result<Transform, String> {
    match t {
        RawTransform::Name(n) if n == "log1p" => Ok(Transform::Log1p),
        RawTransform::Name(n) => Err(format!(
            "unknown transform '{n}' (log1p, standardize, clip)"
        )),
        // NaN is refused with the rest.
        RawTransform::Table(Transform::Standardize { std, .. }) if std.is_nan() || std <= 0.0 => {
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
        let (review, decline) = (thresholds.review_at, thresholds.decline_at);
        // NaN in either is refused with the rest.
        if review.is_nan() || decline.is_nan() || review > decline {
            return Err("[decision]: review_at must not exceed decline_at".into());
        }
        let mut entries = Vec::new();
        for (i, e) in raw.features.into_iter().enumerate() {
            let ctx = |m: String| format!("[input_spec].features[{i}]: {m}");
            let source = parse_source(&e.source).map_err(ctx)?;
            let on_missing = e.on_missing.unwrap_or(raw.on_missing);
            if let Some(cats) = &e.categories {
                check_categories(cats, &e, on_missing).map_err(ctx)?;
            }
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
                on_missing,
                one_hot: e.one_hot,
                categories: e.categories,
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
        check_columns(&entries, config)?;
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
            store_features: store_features.into(),
            views,
            columns: config.columns.clone(),
        }))
    }

    /// The entry that fills position `col` of the row.
    pub fn entry_at(&self, col: usize) -> Option<&Entry> {
        let mut start = 0;
        for e in &self.entries {
            if col < start + e.width() {
                return Some(e);
            }
            start += e.width();
        }
        None
    }
}

/// A `categories` list: not empty, no duplicates, no transforms or one_hot beside
/// it, and an explicit `default` code when missing or unseen values take defaults.
fn check_categories(cats: &[String], e: &RawEntry, on_missing: OnMissing) -> Result<(), String> {
    if cats.is_empty() {
        return Err("categories needs at least one category".into());
    }
    if e.one_hot.is_some() {
        return Err("an entry takes one_hot or categories, not both".into());
    }
    if !e.transforms.is_empty() {
        return Err("a categories entry sends codes; it takes no transforms".into());
    }
    let mut seen = BTreeSet::new();
    if let Some(dup) = cats.iter().find(|c| !seen.insert(c.as_str())) {
        return Err(format!(
            "categories lists '{}' twice",
            crate::error::clip(dup, 64)
        ));
    }
    if on_missing == OnMissing::Default && e.default.is_none() {
        return Err(
            "a categories entry with on_missing = \"default\" must give its default code \
             (default = N), used for missing and unseen values; or use on_missing = \"nan\" \
             or \"refuse\""
                .into(),
        );
    }
    Ok(())
}

/// Each entry against the model's column rules at its position: `on_missing =
/// "nan"` only on one position the model accepts missing in; a categorical column
/// takes a `categories` entry, a `const` code, or a plain entry without transforms.
fn check_columns(entries: &[Entry], config: &ModelConfig) -> Result<(), String> {
    let mut col = 0;
    for (i, e) in entries.iter().enumerate() {
        let at = format!("[input_spec].features[{i}] ({})", e.name());
        let flags = config.columns.column(col);
        if e.on_missing == OnMissing::Nan {
            if e.one_hot.is_some() {
                return Err(format!(
                    "{at}: on_missing = \"nan\" needs an entry of one position, not one_hot"
                ));
            }
            if flags & ColumnRules::MISSING == 0 {
                return Err(format!(
                    "{at}: on_missing = \"nan\" sends NaN to column {col}, but model '{}' (kind {}) \
                     does not accept missing values there{}",
                    config.name,
                    config.kind.as_str(),
                    if config.kind.is_trees() {
                        " (add the column to [trees] missing, or use on_missing = \"default\")"
                    } else {
                        " (only tree models take NaN; use on_missing = \"default\" or \"refuse\")"
                    }
                ));
            }
        }
        if flags & ColumnRules::CATEGORICAL != 0 {
            let codes = match (&e.source, &e.one_hot, &e.categories) {
                (_, Some(_), _) => false,
                (_, _, Some(_)) => true,
                (Source::Const(c), _, _) => *c >= 0.0 && c.fract() == 0.0,
                _ => e.transforms.is_empty(),
            };
            let default_ok = e.on_missing != OnMissing::Default
                || matches!(e.source, Source::Const(_))
                || (e.default >= 0.0 && e.default.fract() == 0.0);
            if !default_ok {
                return Err(format!(
                    "{at}: column {col} is categorical, but the entry's default {} is not an integer code",
                    e.default
                ));
            }
            if !codes {
                return Err(format!(
                    "{at}: column {col} of model '{}' is categorical ([trees] categorical) and takes \
                     integer codes: give the entry categories = [...], or read codes without \
                     transforms or one_hot",
                    config.name
                ));
            }
        }
        col += e.width();
    }
    Ok(())
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
            let coded = e.one_hot.is_some() || e.categories.is_some();
            let fits = match f.dtype {
                FeatureType::F32Vector => false,
                FeatureType::String => coded,
                _ => true,
            };
            if !fits {
                return Err(format!(
                    "{at}: '{view}:{feature}' is of type {}, which {}",
                    f.dtype,
                    if coded {
                        "cannot be one-hot encoded or coded"
                    } else {
                        "is not a number (give the entry one_hot or categories)"
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
    use crate::decide::testing::tree_model;

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
        assert_eq!(&*s.store_features, ["card:txn_count".to_string()]);
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

    /// `[input_spec]` of four entries: `request:a`, then `second`, `request:c`, `fourth`.
    fn four(second: &str, fourth: &str) -> String {
        format!(
            "[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\n\
             [[input_spec.features]]\n{second}\n\
             [[input_spec.features]]\nsource = \"request:c\"\n\
             [[input_spec.features]]\n{fourth}\n"
        )
    }

    #[test]
    fn nan_and_codes_are_checked_against_the_model_columns() {
        let codes =
            "source = \"request:country\"\ncategories = [\"US\", \"GB\"]\non_missing = \"refuse\"";
        let nan = "source = \"card:b\"\non_missing = \"nan\"";
        let s = DecisionSpec::from_model(&tree_model(&four(nan, codes)))
            .unwrap()
            .unwrap();
        assert_eq!(s.entries[1].on_missing, OnMissing::Nan);
        assert_eq!(s.entries[3].code("GB"), Some(1));
        assert_eq!(s.entries[3].code("FR"), None);
        assert_eq!(s.entry_at(3).unwrap().name(), "request:country");
        // A plain entry without transforms may carry codes; a const code too.
        for fourth in ["source = \"request:mcc\"", "source = \"const:7\""] {
            assert!(DecisionSpec::from_model(&tree_model(&four(nan, fourth))).is_ok());
        }
        let bad = |second: &str, fourth: &str| {
            DecisionSpec::from_model(&tree_model(&four(second, fourth))).unwrap_err()
        };
        // NaN where the model does not accept missing values.
        let e = bad(
            "source = \"card:b\"",
            "source = \"request:d\"\non_missing = \"nan\"",
        );
        assert!(
            e.starts_with(
                "[input_spec].features[3] (request:d): on_missing = \"nan\" sends NaN to column 3"
            ) && e.contains("[trees] missing"),
            "{e}"
        );
        // A categorical column with transforms, a fraction, or a default that is no code.
        for (fourth, needle) in [
            (
                "source = \"request:mcc\"\ntransforms = [\"log1p\"]",
                "is categorical",
            ),
            ("source = \"const:2.5\"", "is categorical"),
            (
                "source = \"request:mcc\"\ndefault = -1.0",
                "not an integer code",
            ),
        ] {
            let e = bad(nan, fourth);
            assert!(e.contains(needle), "{fourth}: {e}");
        }
        // categories: a default code when defaults apply, no duplicates, no transforms.
        for (fourth, needle) in [
            ("source = \"request:c\"\ncategories = [\"US\"]", "must give its default code"),
            ("source = \"request:c\"\ncategories = [\"US\", \"US\"]\ndefault = 0.0", "'US' twice"),
            ("source = \"request:c\"\ncategories = []\ndefault = 0.0", "at least one"),
            ("source = \"request:c\"\ncategories = [\"US\"]\ndefault = 0.0\ntransforms = [\"log1p\"]", "no transforms"),
        ] {
            let e = bad(nan, fourth);
            assert!(e.contains(needle), "{fourth}: {e}");
        }
        // The MLP takes no NaN at all.
        let e = DecisionSpec::from_model(&model(
            "[input_spec]\non_missing = \"nan\"\n[[input_spec.features]]\nsource = \"request:a\"\none_hot=[\"a\",\"b\",\"c\",\"d\"]\n",
        ))
        .unwrap_err();
        assert!(e.contains("not one_hot"), "{e}");
        let mut text = String::from("[input_spec]\n");
        for i in 0..4 {
            text += &format!("[[input_spec.features]]\nsource = \"request:f{i}\"\n");
        }
        text += "on_missing = \"nan\"\n";
        let e = DecisionSpec::from_model(&model(&text)).unwrap_err();
        assert!(
            e.contains("model 'm' (kind mlp) does not accept missing values")
                && e.contains("only tree models take NaN"),
            "{e}"
        );
    }

    /// A standardize std and decision thresholds that are not ordered numbers (0,
    /// negative, NaN, review above decline) are refused, NaN included.
    #[test]
    fn bad_std_and_thresholds_are_refused_nan_included() {
        let with_std = |std: &str| {
            model(&format!(
                "[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\n\
                 transforms = [{{ standardize = {{ mean = 0.0, std = {std} }} }}]\n\
                 [[input_spec.features]]\nsource = \"request:b\"\none_hot = [\"x\", \"y\", \"z\"]\n"
            ))
        };
        assert!(DecisionSpec::from_model(&with_std("2.0"))
            .unwrap()
            .is_some());
        for bad in ["0.0", "-1.0", "nan"] {
            let e = DecisionSpec::from_model(&with_std(bad)).unwrap_err();
            assert!(e.contains("standardize needs std > 0"), "std = {bad}: {e}");
        }
        let with_thresholds = |review: &str, decline: &str| {
            model(&format!(
                "[input_spec]\n[[input_spec.features]]\nsource = \"request:a\"\n\
                 one_hot = [\"a\", \"b\", \"c\", \"d\"]\n\
                 [decision]\nreview_at = {review}\ndecline_at = {decline}\n"
            ))
        };
        assert!(DecisionSpec::from_model(&with_thresholds("0.5", "0.5")).is_ok());
        for (review, decline) in [("0.9", "0.5"), ("nan", "0.5"), ("0.5", "nan")] {
            let e = DecisionSpec::from_model(&with_thresholds(review, decline)).unwrap_err();
            assert!(
                e.contains("review_at must not exceed decline_at"),
                "{review}/{decline}: {e}"
            );
        }
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
