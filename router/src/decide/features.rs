//! Preprocessing: one looked-up row of features plus the request's own features
//! become the model's input row, following the model's input spec.
use std::collections::HashMap;
use std::sync::Arc;

use mesh_feature_store::{ColumnValues, FeatureStatus, LookupResponse};
use mesh_prediction_log::status;

use mesh_model_actor::config::ColumnRules;

use super::spec::{DecisionSpec, Entry, OnMissing, Source};

/// One feature as used for a prediction (for the prediction log).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureUsed {
    /// The spec entry's name (`view:feature`, `request:name`), shared with the spec.
    pub name: Arc<str>,
    /// The raw value before transforms (`None` when missing).
    pub value: Option<f64>,
    /// One of `mesh_prediction_log::status`: `PRESENT`, `NOT_FOUND`, `NULL`,
    /// `OUTSIDE_MAX_AGE` (the store's, as `mesh.v1.FeatureStatus` spells them),
    /// `MISSING` (a request feature not sent), `UNAVAILABLE` (the store could
    /// not be read) or `UNSEEN` (a categorical value not in the entry's categories).
    pub status: &'static str,
    /// Event time of a stored value (Unix µs).
    pub event_time_us: Option<i64>,
}

/// The request-side inputs of one decision.
pub struct RequestFeatures<'a> {
    pub numeric: &'a HashMap<String, f64>,
    pub categorical: &'a HashMap<String, String>,
}

enum Raw {
    Number(f64),
    Text(String),
}

impl Raw {
    /// The value as a category: text as is, a number as its decimal text (`7`, `2.5`).
    fn text(self) -> String {
        match self {
            Raw::Text(t) => t,
            Raw::Number(n) => n.to_string(),
        }
    }
}

fn column_value(v: &ColumnValues, i: usize) -> Option<Raw> {
    Some(match v {
        ColumnValues::F32(x) => Raw::Number(f64::from(*x.get(i)?)),
        ColumnValues::F64(x) => Raw::Number(*x.get(i)?),
        ColumnValues::I64(x) => Raw::Number(*x.get(i)? as f64),
        ColumnValues::Bool(x) => Raw::Number(if *x.get(i)? { 1.0 } else { 0.0 }),
        ColumnValues::String(x) => Raw::Text(x.get(i)?.clone()),
        ColumnValues::F32Vector(_) => return None,
    })
}

fn status_str(s: FeatureStatus) -> &'static str {
    match s {
        FeatureStatus::Present => status::PRESENT,
        FeatureStatus::NotFound => status::NOT_FOUND,
        FeatureStatus::Null => status::NULL,
        FeatureStatus::OutsideMaxAge => status::OUTSIDE_MAX_AGE,
        FeatureStatus::Unavailable => status::UNAVAILABLE,
    }
}

/// The log reads a decision's features as they are (see `plog::LogSink`).
impl mesh_prediction_log::LoggedFeature for FeatureUsed {
    fn name(&self) -> &str {
        &self.name
    }
    fn value(&self) -> Option<f64> {
        self.value
    }
    fn status(&self) -> &str {
        self.status
    }
    fn event_time_us(&self) -> Option<i64> {
        self.event_time_us
    }
}

impl FeatureUsed {
    /// Whether the row used the spec's default (or NaN, for `on_missing = "nan"`)
    /// here because the value was missing, null, stale, unreadable or unseen,
    /// rather than a value.
    pub fn defaulted(&self) -> bool {
        self.value.is_none() && self.status != status::PRESENT
    }

    /// The view of a store feature (`card` of `card:txn_count_1h`), `request` for a
    /// request feature.
    pub fn view(&self) -> &str {
        self.name.split_once(':').map_or("", |(v, _)| v)
    }
}

/// Builds the input row for `row` of `lookup` (None when the store could not be
/// read). `Err` is the refusal: a feature marked `refuse` was missing, stale or
/// unseen, or a value does not fit the model's column (not a category code).
pub fn build_row(
    spec: &DecisionSpec,
    req: &RequestFeatures<'_>,
    lookup: Option<&LookupResponse>,
    row: usize,
) -> Result<(Vec<f32>, Vec<FeatureUsed>), String> {
    let mut out = Vec::with_capacity(spec.entries.len());
    let mut used = Vec::with_capacity(spec.entries.len());
    for e in &spec.entries {
        let name = e.label.clone();
        let (raw, status, event_time) = read(e, req, lookup, row, &name);
        // A categorical source: the value's code, or unseen (treated as missing).
        let (raw, status) = match (&e.categories, raw) {
            (Some(_), Some(r)) => match e.code(&r.text()) {
                Some(code) => (Some(Raw::Number(code as f64)), status),
                None => (None, status::UNSEEN),
            },
            (_, r) => (r, status),
        };
        let Some(raw) = raw else {
            match e.on_missing {
                OnMissing::Refuse => return Err(format!("{name} is {status}")),
                OnMissing::Nan => out.push(f32::NAN),
                OnMissing::Default => match &e.one_hot {
                    Some(cats) => out.extend(std::iter::repeat_n(0.0, cats.len())),
                    None => out.push(e.default as f32),
                },
            }
            used.push(FeatureUsed {
                name,
                value: None,
                status,
                event_time_us: event_time,
            });
            continue;
        };
        match (&e.one_hot, raw) {
            (Some(cats), raw) => {
                let text = raw.text();
                out.extend(cats.iter().map(|c| if *c == text { 1.0 } else { 0.0 }));
                used.push(FeatureUsed {
                    name,
                    value: cats.iter().position(|c| *c == text).map(|i| i as f64),
                    status,
                    event_time_us: event_time,
                });
            }
            (None, Raw::Number(x)) => {
                // Fail closed: a value that does not survive the conversion to the
                // model's f32 (1e300 becomes inf) is refused, never scored.
                let v = e.transform(x) as f32;
                if !v.is_finite() {
                    return Err(format!(
                        "{name} = {x:e} is not a finite f32 after its transforms; refused"
                    ));
                }
                out.push(v);
                used.push(FeatureUsed {
                    name,
                    value: Some(x),
                    status,
                    event_time_us: event_time,
                });
            }
            (None, Raw::Text(_)) => {
                return Err(format!(
                    "{name} is text but the spec uses it as a number (give it one_hot or categories)"
                ));
            }
        }
    }
    check_columns(spec, &out)?;
    Ok((out, used))
}

/// The raw value of entry `e` for `row`, its status and event time.
fn read(
    e: &Entry,
    req: &RequestFeatures<'_>,
    lookup: Option<&LookupResponse>,
    row: usize,
    name: &str,
) -> (Option<Raw>, &'static str, Option<i64>) {
    match &e.source {
        Source::Const(c) => (Some(Raw::Number(*c)), status::PRESENT, None),
        Source::Request(n) => match (req.numeric.get(n), req.categorical.get(n)) {
            (Some(v), _) => (Some(Raw::Number(*v)), status::PRESENT, None),
            (None, Some(s)) => (Some(Raw::Text(s.clone())), status::PRESENT, None),
            (None, None) => (None, status::MISSING, None),
        },
        Source::Store { .. } => match lookup.and_then(|l| l.column(name)) {
            None => (None, status::UNAVAILABLE, None),
            Some(col) => {
                let status = col
                    .statuses
                    .get(row)
                    .copied()
                    .unwrap_or(FeatureStatus::NotFound);
                let et = col.event_times.get(row).copied().filter(|t| *t != 0);
                match status {
                    FeatureStatus::Present => {
                        (column_value(&col.values, row), status_str(status), et)
                    }
                    // Stale values are reported (for the log) but never used as live.
                    other => (None, status_str(other), et),
                }
            }
        },
    }
}

/// The built row against the model's column rules (category codes where the model
/// takes them, NaN only where it accepts missing): a value that does not fit is
/// refused naming its entry, so the model never sees it.
fn check_columns(spec: &DecisionSpec, row: &[f32]) -> Result<(), String> {
    let Some(c) = (0..row.len()).find(|&c| !spec.columns.accepts(c, row[c])) else {
        return Ok(());
    };
    let name = spec.entry_at(c).map(Entry::name).unwrap_or_default();
    let x = row[c];
    Err(if spec.columns.column(c) & ColumnRules::CATEGORICAL != 0 {
        format!(
            "{name} = {x} is not a category code (an integer from 0 to {}) for the model's categorical column {c}; refused",
            mesh_model_actor::config::MAX_CATEGORY
        )
    } else {
        format!("{name} = {x} is not accepted in column {c} of the model; refused")
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mesh_prediction_log::status;

    /// A tree model of 4 inputs (column 1 may be missing, column 3 is categorical)
    /// reading `request:a`, `request:b` (NaN when missing), `request:c` (default 5)
    /// and `request:country` (codes of US, GB, DE; unseen or missing take code 0).
    fn spec(fourth: &str) -> DecisionSpec {
        let text = format!(
            r#"
            [input_spec]
            [[input_spec.features]]
            source = "request:a"
            [[input_spec.features]]
            source = "request:b"
            on_missing = "nan"
            [[input_spec.features]]
            source = "request:c"
            default = 5.0
            [[input_spec.features]]
            {fourth}
            "#
        );
        let c = crate::decide::testing::tree_model(&text);
        DecisionSpec::from_model(&c).unwrap().unwrap()
    }

    fn build(
        spec: &DecisionSpec,
        numeric: &[(&str, f64)],
        categorical: &[(&str, &str)],
    ) -> Result<(Vec<f32>, Vec<FeatureUsed>), String> {
        let numeric: HashMap<String, f64> =
            numeric.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let categorical: HashMap<String, String> = categorical
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let req = RequestFeatures {
            numeric: &numeric,
            categorical: &categorical,
        };
        build_row(spec, &req, None, 0)
    }

    #[test]
    fn missing_values_become_nan_or_defaults_and_categories_become_codes() {
        let s = spec(
            "source = \"request:country\"\ncategories = [\"US\", \"GB\", \"DE\"]\ndefault = 0.0",
        );
        let (row, used) = build(&s, &[("a", 1.5), ("b", 2.0)], &[("country", "DE")]).unwrap();
        assert_eq!(row, vec![1.5, 2.0, 5.0, 2.0]);
        assert_eq!(used[3].value, Some(2.0));
        assert_eq!(used[3].status, status::PRESENT);
        assert!(used[2].defaulted() && !used[3].defaulted());
        // b missing: NaN (the model's missing), said so in the status.
        let (row, used) = build(&s, &[("a", 1.5)], &[("country", "GB")]).unwrap();
        assert!(row[1].is_nan());
        assert_eq!((row[3], used[1].status), (1.0, status::MISSING));
        assert!(used[1].defaulted());
        // A number is read as its text; an unseen category takes the default code.
        let (row, used) = build(&s, &[("a", 1.0), ("country", 7.0)], &[]).unwrap();
        assert_eq!(row[3], 0.0);
        assert_eq!((used[3].status, used[3].value), (status::UNSEEN, None));
        assert!(used[3].defaulted());
    }

    #[test]
    fn unseen_refused_and_values_that_are_not_codes_are_refused() {
        let s =
            spec("source = \"request:country\"\ncategories = [\"US\"]\non_missing = \"refuse\"");
        let e = build(&s, &[("a", 1.0)], &[("country", "FR")]).unwrap_err();
        assert_eq!(e, "request:country is UNSEEN");
        let e = build(&s, &[("a", 1.0)], &[]).unwrap_err();
        assert_eq!(e, "request:country is MISSING");
        // A plain entry on the categorical column: codes pass, anything else is refused.
        let s = spec("source = \"request:mcc\"");
        let (row, _) = build(&s, &[("a", 1.0), ("mcc", 42.0)], &[]).unwrap();
        assert_eq!(row[3], 42.0);
        for bad in [2.5, -1.0, 1e9] {
            let e = build(&s, &[("a", 1.0), ("mcc", bad)], &[]).unwrap_err();
            assert!(
                e.starts_with(&format!("request:mcc = {}", bad as f32))
                    && e.contains("not a category code")
                    && e.contains("column 3"),
                "{e}"
            );
        }
    }
}
