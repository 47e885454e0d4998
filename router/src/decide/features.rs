//! Preprocessing: one looked-up row of features plus the request's own features
//! become the model's input row, following the model's input spec.
use std::collections::HashMap;
use std::sync::Arc;

use mesh_feature_store::{ColumnValues, FeatureStatus, LookupResponse};
use mesh_prediction_log::status;

use super::spec::{DecisionSpec, OnMissing, Source};

/// One feature as used for a prediction (for the prediction log).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureUsed {
    /// The spec entry's name (`view:feature`, `request:name`), shared with the spec.
    pub name: Arc<str>,
    /// The raw value before transforms (`None` when missing).
    pub value: Option<f64>,
    /// One of `mesh_prediction_log::status`: `PRESENT`, `NOT_FOUND`, `NULL`,
    /// `OUTSIDE_MAX_AGE` (the store's, as `mesh.v1.FeatureStatus` spells them),
    /// `MISSING` (a request feature not sent) or `UNAVAILABLE` (the store could
    /// not be read).
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

impl FeatureUsed {
    /// Whether the row used the spec's default here (the value was missing, null,
    /// stale or unreadable), rather than a value.
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
/// read). `Err` is the refusal: a feature marked `refuse` was missing or stale.
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
        let (raw, status, event_time) = match &e.source {
            Source::Const(c) => (Some(Raw::Number(*c)), status::PRESENT, None),
            Source::Request(n) => match (req.numeric.get(n), req.categorical.get(n)) {
                (Some(v), _) => (Some(Raw::Number(*v)), status::PRESENT, None),
                (None, Some(s)) => (Some(Raw::Text(s.clone())), status::PRESENT, None),
                (None, None) => (None, status::MISSING, None),
            },
            Source::Store { .. } => match lookup.and_then(|l| l.column(&name)) {
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
        };
        let Some(raw) = raw else {
            if e.on_missing == OnMissing::Refuse {
                return Err(format!("{name} is {status}"));
            }
            used.push(FeatureUsed {
                name,
                value: None,
                status,
                event_time_us: event_time,
            });
            match &e.one_hot {
                Some(cats) => out.extend(std::iter::repeat_n(0.0, cats.len())),
                None => out.push(e.default as f32),
            }
            continue;
        };
        match (&e.one_hot, raw) {
            (Some(cats), raw) => {
                let text = match raw {
                    Raw::Text(t) => t,
                    Raw::Number(n) => n.to_string(),
                };
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
                    "{name} is text but the spec uses it as a number (give it one_hot categories)"
                ));
            }
        }
    }
    Ok((out, used))
}
