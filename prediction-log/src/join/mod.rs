//! Joining the prediction log with labels that arrive later: per model version, role and
//! protocol (decisions apart from OIP calls), how good the scores were and how the requests
//! were served.

mod labels;
mod report;
pub mod stats;

pub use report::{
    GroupReport, JoinReport, LabelSummary, OperatingPoint, SourceShare, StagePercentiles,
};

use crate::error::Result;
use crate::reader::{scan, ReadOptions};
use crate::record::{source, PredictionRecord, Protocol, Role, StageMicros};
use stats::{percentile, roc_auc, Confusion};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What to join on and what to report.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// Join key: `request_id`, or the name of an entity key (e.g. `card_id`, when labels
    /// are per entity). The labels file has a column of the same name.
    pub key: String,
    /// Label column of the labels file: 1/0, true/false, yes/no (or a number, > 0.5 = 1).
    pub label: String,
    /// Extra operating points: flag when `score >= t`.
    pub score_thresholds: Vec<f64>,
    /// Also read wal files (records not yet in a closed segment).
    pub include_wal: bool,
    /// Keep only the records of this protocol (`None`: all, each in its own group).
    pub protocol: Option<Protocol>,
}

impl Default for JoinOptions {
    fn default() -> Self {
        Self {
            key: "request_id".into(),
            label: "label".into(),
            score_thresholds: Vec::new(),
            include_wal: false,
            protocol: None,
        }
    }
}

/// The decisions counted as "flagged" at each decision operating point.
pub(crate) const DECISION_POINTS: [(&str, &[&str]); 2] = [
    ("decision=decline", &["decline"]),
    ("decision in (review, decline)", &["review", "decline"]),
];

#[derive(Default)]
struct GroupAcc {
    predictions: u64,
    labelled: u64,
    positives: u64,
    scored: Vec<(f64, bool)>,
    decision_points: [Confusion; 2],
    decided_labelled: u64,
    score_points: Vec<Confusion>,
    sources: BTreeMap<String, u64>,
    stages: [Vec<u64>; 7],
}

/// Joins every record of `logs_dir` with the labels in `labels_path` (CSV with a header
/// row, or `.parquet`). Label anomalies are counted in the report, never errors.
pub fn join(logs_dir: &Path, labels_path: &Path, opts: &JoinOptions) -> Result<JoinReport> {
    let mut labels = labels::load(labels_path, &opts.key, &opts.label)?;
    let mut groups: HashMap<GroupKey, GroupAcc> = HashMap::new();
    let mut records = 0u64;
    let mut unlabelled = 0u64;
    let key_of = |r: &PredictionRecord| -> Option<String> {
        if opts.key == "request_id" {
            Some(r.request_id.clone())
        } else {
            r.entity_keys
                .iter()
                .find(|(k, _)| *k == opts.key)
                .map(|(_, v)| v.clone())
        }
    };
    scan(
        logs_dir,
        ReadOptions {
            include_wal: opts.include_wal,
        },
        |r| {
            if opts.protocol.is_some_and(|p| p != r.protocol) {
                return;
            }
            records += 1;
            let label = key_of(&r).and_then(|k| {
                labels.map.get_mut(&k).map(|(label, matched)| {
                    *matched = true;
                    *label
                })
            });
            let g = groups
                .entry((r.model.clone(), r.version.clone(), r.role, r.protocol))
                .or_insert_with(|| GroupAcc {
                    score_points: vec![Confusion::default(); opts.score_thresholds.len()],
                    ..GroupAcc::default()
                });
            g.predictions += 1;
            *g.sources.entry(r.source.clone()).or_default() += 1;
            for (v, s) in g.stages.iter_mut().zip(r.stages.as_array()) {
                v.push(s);
            }
            let Some(y) = label else {
                unlabelled += 1;
                return;
            };
            g.labelled += 1;
            g.positives += u64::from(y);
            if let Some(d) = r.decision.as_deref() {
                g.decided_labelled += 1;
                let d = d.to_ascii_lowercase();
                for (c, (_, flagged)) in g.decision_points.iter_mut().zip(DECISION_POINTS) {
                    c.add(flagged.contains(&d.as_str()), y);
                }
            }
            if let Some(s) = r.score.filter(|s| s.is_finite()) {
                g.scored.push((s, y));
                for (c, t) in g.score_points.iter_mut().zip(&opts.score_thresholds) {
                    c.add(s >= *t, y);
                }
            }
        },
    )?;

    let unknown = labels.map.values().filter(|(_, matched)| !matched).count() as u64;
    let label_summary = LabelSummary {
        rows: labels.rows,
        distinct_keys: labels.map.len() as u64,
        positives: labels.map.values().filter(|(l, _)| *l).count() as u64,
        duplicate_rows: labels.duplicate_rows,
        conflicting_duplicates: labels.conflicting_duplicates,
        invalid_rows: labels.invalid_rows,
        unknown_keys: unknown,
    };
    labels.map.clear();

    let mut out: Vec<GroupReport> = groups
        .into_iter()
        .map(|(k, g)| finish_group(k, g, opts))
        .collect();
    out.sort_by(|a, b| {
        (
            &a.model,
            a.version.parse::<u64>().ok(),
            &a.version,
            a.role,
            a.protocol,
        )
            .cmp(&(
                &b.model,
                b.version.parse::<u64>().ok(),
                &b.version,
                b.role,
                b.protocol,
            ))
    });
    Ok(JoinReport {
        logs_dir: logs_dir.to_path_buf(),
        labels_path: PathBuf::from(labels_path),
        key: opts.key.clone(),
        label_column: opts.label.clone(),
        records,
        unlabelled_predictions: unlabelled,
        labels: label_summary,
        groups: out,
    })
}

/// What records are grouped by: model, version, role, protocol.
type GroupKey = (String, String, Role, Protocol);

fn finish_group(
    (model, version, role, protocol): GroupKey,
    mut g: GroupAcc,
    opts: &JoinOptions,
) -> GroupReport {
    let brier = stats::brier(&g.scored);
    let roc_auc = roc_auc(&mut g.scored);
    let mut operating_points: Vec<OperatingPoint> = DECISION_POINTS
        .iter()
        .zip(g.decision_points)
        .map(|((name, _), c)| OperatingPoint::new(name.to_string(), g.decided_labelled, c))
        .collect();
    let scored = g.scored.len() as u64;
    for (t, c) in opts.score_thresholds.iter().zip(&g.score_points) {
        operating_points.push(OperatingPoint::new(format!("score >= {t}"), scored, *c));
    }
    let n = g.predictions.max(1) as f64;
    let fallbacks: u64 = g
        .sources
        .iter()
        .filter(|(s, _)| s.as_str() != source::MODEL)
        .map(|(_, c)| *c)
        .sum();
    let sources = g
        .sources
        .into_iter()
        .map(|(s, count)| {
            (
                s,
                SourceShare {
                    count,
                    rate: count as f64 / n,
                },
            )
        })
        .collect();
    let mut stages = BTreeMap::new();
    for (name, mut v) in StageMicros::NAMES.iter().zip(g.stages) {
        v.sort_unstable();
        stages.insert(
            name.to_string(),
            StagePercentiles {
                p50_us: percentile(&v, 0.50).unwrap_or(0),
                p99_us: percentile(&v, 0.99).unwrap_or(0),
                max_us: v.last().copied().unwrap_or(0),
            },
        );
    }
    GroupReport {
        model,
        version,
        role,
        protocol,
        predictions: g.predictions,
        labelled: g.labelled,
        positives: g.positives,
        unlabelled: g.predictions - g.labelled,
        scored_labelled: scored,
        roc_auc,
        brier,
        operating_points,
        fallback_rate: fallbacks as f64 / n,
        sources,
        stages,
    }
}
