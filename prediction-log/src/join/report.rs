//! The join's result: serde for `--json`, `Display` for people.

use super::stats::Confusion;
use crate::record::{Protocol, Role, StageMicros};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize)]
pub struct JoinReport {
    pub logs_dir: PathBuf,
    pub labels_path: PathBuf,
    pub key: String,
    pub label_column: String,
    /// Prediction records joined (of `JoinOptions::protocol`, when one was given).
    pub records: u64,
    /// Records whose key has no (valid) label.
    pub unlabelled_predictions: u64,
    pub labels: LabelSummary,
    /// One per (model, version, role, protocol), sorted.
    pub groups: Vec<GroupReport>,
}

/// What was in the labels file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LabelSummary {
    pub rows: u64,
    pub distinct_keys: u64,
    pub positives: u64,
    /// Rows repeating a key already seen; the first row wins.
    pub duplicate_rows: u64,
    /// Of those, rows whose label differs from the first.
    pub conflicting_duplicates: u64,
    /// Rows with an empty key or an unreadable label.
    pub invalid_rows: u64,
    /// Distinct label keys that match no prediction record.
    pub unknown_keys: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    pub model: String,
    pub version: String,
    pub role: Role,
    /// `decide`, `oip_grpc`, `oip_http`, or `unknown` (records written before the
    /// log recorded it).
    pub protocol: Protocol,
    pub predictions: u64,
    pub labelled: u64,
    pub positives: u64,
    pub unlabelled: u64,
    /// Labelled records with a finite score (the base of AUC and Brier).
    pub scored_labelled: u64,
    /// Mann-Whitney ROC AUC, ties counted one half; null without both classes.
    pub roc_auc: Option<f64>,
    pub brier: Option<f64>,
    pub operating_points: Vec<OperatingPoint>,
    /// Share of predictions not answered by the model (source != MODEL).
    pub fallback_rate: f64,
    /// Predictions by answer source.
    pub sources: BTreeMap<String, SourceShare>,
    /// Per stage (validate, features, preprocess, queue, compute, postprocess, total).
    pub stages: BTreeMap<String, StagePercentiles>,
}

/// Precision and recall when the records matching `rule` are flagged.
#[derive(Debug, Clone, Serialize)]
pub struct OperatingPoint {
    pub rule: String,
    /// Labelled records this point applies to (with a decision, or with a score).
    pub evaluated: u64,
    pub flagged: u64,
    pub true_positives: u64,
    pub false_positives: u64,
    pub false_negatives: u64,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
}

impl OperatingPoint {
    pub(crate) fn new(rule: String, evaluated: u64, c: Confusion) -> Self {
        Self {
            rule,
            evaluated,
            flagged: c.tp + c.fp,
            true_positives: c.tp,
            false_positives: c.fp,
            false_negatives: c.fn_,
            precision: c.precision(),
            recall: c.recall(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct SourceShare {
    pub count: u64,
    pub rate: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StagePercentiles {
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

impl fmt::Display for JoinReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.labels;
        writeln!(
            f,
            "predictions: {} records in {}",
            self.records,
            self.logs_dir.display()
        )?;
        writeln!(
            f,
            "labels:      {} rows in {} (key {}, label {}): {} distinct keys, {} positive",
            l.rows,
            self.labels_path.display(),
            self.key,
            self.label_column,
            l.distinct_keys,
            l.positives
        )?;
        writeln!(
            f,
            "anomalies:   {} unknown keys, {} duplicate rows ({} conflicting, first kept), {} invalid rows, \
             {} predictions without a label",
            l.unknown_keys, l.duplicate_rows, l.conflicting_duplicates, l.invalid_rows, self.unlabelled_predictions
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<16} {:>8} {:<8} {:<9} {:>11} {:>9} {:>7} {:>7} {:>7} {:>9}",
            "model",
            "version",
            "role",
            "protocol",
            "predictions",
            "labelled",
            "pos",
            "AUC",
            "Brier",
            "fallback"
        )?;
        for g in &self.groups {
            writeln!(
                f,
                "{:<16} {:>8} {:<8} {:<9} {:>11} {:>9} {:>7} {:>7} {:>7} {:>8.2}%",
                g.model,
                g.version,
                g.role.as_str(),
                g.protocol.as_str(),
                g.predictions,
                g.labelled,
                g.positives,
                opt(g.roc_auc, 4),
                opt(g.brier, 4),
                g.fallback_rate * 100.0
            )?;
        }
        for g in &self.groups {
            writeln!(f)?;
            writeln!(
                f,
                "{} version {} ({}, {})",
                g.model, g.version, g.role, g.protocol
            )?;
            for p in &g.operating_points {
                writeln!(
                    f,
                    "  {:<32} flagged {:>7} of {:>7}  precision {:>6}  recall {:>6}",
                    p.rule,
                    p.flagged,
                    p.evaluated,
                    opt(p.precision, 4),
                    opt(p.recall, 4)
                )?;
            }
            let sources: Vec<String> = g
                .sources
                .iter()
                .map(|(s, c)| format!("{s} {} ({:.2}%)", c.count, c.rate * 100.0))
                .collect();
            writeln!(f, "  sources: {}", sources.join(", "))?;
            write!(f, "  stage p50/p99 µs:")?;
            for name in StageMicros::NAMES {
                if let Some(s) = g.stages.get(name) {
                    write!(f, " {name} {}/{}", s.p50_us, s.p99_us)?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
