//! What the demo reports: `summary.json` and the text printed at the end, built
//! from the traffic's tallies, the mesh's breaker transitions, the prediction log
//! and the label join.
use std::collections::BTreeMap;
use std::path::PathBuf;

use hdrhistogram::Histogram;
use mesh_prediction_log::JoinReport;
use serde::Serialize;

use super::traffic::{fallbacks, PhaseTally, Traffic, PHASES};

#[derive(Debug, Serialize)]
pub struct PhaseSummary {
    pub name: String,
    pub from_s: f64,
    pub to_s: f64,
    pub decisions: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub sources: BTreeMap<String, u64>,
    pub fallbacks: u64,
    pub errors: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct VersionSummary {
    /// Empty for answers no model version gave (batch score, rules, default).
    pub version: String,
    pub role: String,
    pub predictions: u64,
    pub labelled: u64,
    pub positives: u64,
    pub roc_auc: Option<f64>,
    pub fallback_rate: f64,
    pub sources: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    /// The model the decisions used (`--model`).
    pub model: String,
    pub seconds: f64,
    pub concurrency: usize,
    pub decisions: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub errors: BTreeMap<String, u64>,
    pub sources: BTreeMap<String, u64>,
    pub fallbacks: u64,
    pub fallbacks_during_stall: u64,
    /// Seconds from clearing the faults to the first answer a model gave again
    /// (a breaker's half-open probe succeeding); none without a stall.
    pub model_back_after_s: Option<f64>,
    pub phases: Vec<PhaseSummary>,
    /// `replica -> state` -> count, from the mesh's own /metrics.
    pub breaker_transitions: BTreeMap<String, u64>,
    pub log_records: u64,
    pub transactions: u64,
    pub fraud: u64,
    pub versions: Vec<VersionSummary>,
    pub files: BTreeMap<String, PathBuf>,
}

/// What the later phases add to the traffic's tallies.
pub(super) struct Findings {
    pub concurrency: usize,
    pub no_stall: bool,
    /// `replica -> state` -> count.
    pub breaker_transitions: BTreeMap<String, u64>,
    pub log_records: u64,
    pub fraud: u64,
    pub join: JoinReport,
    pub files: BTreeMap<String, PathBuf>,
    /// The model the decisions used (`--model`).
    pub model: String,
}

/// The summary of the run.
pub(super) fn build(traffic: Traffic, found: Findings) -> anyhow::Result<Summary> {
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in &traffic.tallies {
        let _ = all.add(&t.latency);
    }
    let phases = phase_summaries(&traffic.tallies, traffic.planned.as_secs_f64());
    let (mut sources, mut errors) = (BTreeMap::new(), BTreeMap::new());
    for t in &traffic.tallies {
        add_counts(&mut sources, &t.sources);
        add_counts(&mut errors, &t.errors);
    }
    let elapsed = traffic.elapsed_s;
    Ok(Summary {
        seconds: elapsed,
        concurrency: found.concurrency,
        decisions: all.len(),
        throughput: all.len() as f64 / elapsed,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        p999_us: all.value_at_quantile(0.999),
        max_us: all.max(),
        errors,
        fallbacks: fallbacks(&sources),
        sources,
        fallbacks_during_stall: phases[1..3].iter().map(|p| p.fallbacks).sum(),
        model_back_after_s: model_back_after(
            found.no_stall,
            traffic.first_model_after_clear_us,
            phases[PHASES.len() - 1].from_s,
        ),
        phases,
        breaker_transitions: found.breaker_transitions,
        log_records: found.log_records,
        transactions: traffic.truths.len() as u64,
        fraud: found.fraud,
        versions: versions(&found.join, &found.model),
        model: found.model,
        files: found.files,
    })
}

fn add_counts(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_insert(0) += v;
    }
}

/// One summary per phase; boundaries as scheduled (the drill runs on the planned
/// clock of `planned_s` seconds).
pub(super) fn phase_summaries(tallies: &[PhaseTally], planned_s: f64) -> Vec<PhaseSummary> {
    PHASES
        .iter()
        .zip(tallies)
        .enumerate()
        .map(|(i, ((name, at), g))| {
            let to = PHASES.get(i + 1).map_or(1.0, |p| p.1);
            let (from_s, to_s) = (planned_s * at, planned_s * to);
            PhaseSummary {
                name: name.to_string(),
                from_s,
                to_s,
                decisions: g.latency.len(),
                throughput: g.latency.len() as f64 / (to_s - from_s).max(1e-9),
                p50_us: g.latency.value_at_quantile(0.5),
                p99_us: g.latency.value_at_quantile(0.99),
                fallbacks: g.fallbacks(),
                sources: g.sources.clone(),
                errors: g.errors.clone(),
            }
        })
        .collect()
}

/// Seconds from the clear (the recovered phase's start, `cleared_s`) to the first
/// model answer after it; none without a stall or without such an answer.
pub(super) fn model_back_after(
    no_stall: bool,
    first_model_us: Option<u64>,
    cleared_s: f64,
) -> Option<f64> {
    match first_model_us {
        _ if no_stall => None,
        None => None,
        Some(at) => Some((at as f64 / 1e6 - cleared_s).max(0.0)),
    }
}

/// The join's groups of the demo's model, one per version and role.
fn versions(report: &JoinReport, model: &str) -> Vec<VersionSummary> {
    report
        .groups
        .iter()
        .filter(|g| g.model == model)
        .map(|g| VersionSummary {
            version: g.version.clone(),
            role: format!("{:?}", g.role).to_lowercase(),
            predictions: g.predictions,
            labelled: g.labelled,
            positives: g.positives,
            roc_auc: g.roc_auc,
            fallback_rate: g.fallback_rate,
            sources: g
                .sources
                .iter()
                .map(|(k, s)| (k.clone(), s.count))
                .collect(),
        })
        .collect()
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.fmt_traffic(f)?;
        self.fmt_breakers(f)?;
        self.fmt_versions(f)?;
        writeln!(f, "\n== files")?;
        for (k, v) in &self.files {
            writeln!(f, "{k:<12} {}", v.display())?;
        }
        Ok(())
    }
}

impl Summary {
    /// Throughput, latency and answers overall and per phase.
    fn fmt_traffic(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "\n== traffic: {} callers, Decide over gRPC",
            self.concurrency
        )?;
        writeln!(
            f,
            "decisions   {} in {:.1} s = {:.0}/s   errors {:?}",
            self.decisions, self.seconds, self.throughput, self.errors
        )?;
        writeln!(
            f,
            "latency     p50 {} µs   p99 {} µs   p99.9 {} µs   max {} µs",
            self.p50_us, self.p99_us, self.p999_us, self.max_us
        )?;
        writeln!(f, "answers     {:?}", self.sources)?;
        writeln!(
            f,
            "\n{:<24} {:>11} {:>10} {:>9} {:>9} {:>10}  answered by",
            "phase", "seconds", "decided/s", "p50 µs", "p99 µs", "fallbacks"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<24} {:>5.1}-{:<5.1} {:>10.0} {:>9} {:>9} {:>10}  {:?}",
                p.name, p.from_s, p.to_s, p.throughput, p.p50_us, p.p99_us, p.fallbacks, p.sources
            )?;
        }
        if let Some(s) = self.model_back_after_s {
            writeln!(
                f,
                "after the faults cleared, the model answered again within {s:.1} s (a breaker's half-open probe; probes back off while a replica keeps failing)"
            )?;
        }
        Ok(())
    }

    /// The breakers' transitions, from the mesh's /metrics.
    fn fmt_breakers(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "\n== circuit breakers (mesh_router_breaker_transitions_total)"
        )?;
        if self.breaker_transitions.is_empty() {
            writeln!(f, "no transitions")?;
        }
        for (k, v) in &self.breaker_transitions {
            writeln!(f, "{k:<40} {v}")?;
        }
        Ok(())
    }

    /// Each model version against the outcomes.
    fn fmt_versions(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "\n== {} versions against outcomes ({} transactions, {} fraud; {} log records)",
            self.model, self.transactions, self.fraud, self.log_records
        )?;
        writeln!(
            f,
            "{:<8} {:<8} {:>11} {:>9} {:>9} {:>8}  answered by",
            "version", "role", "predictions", "labelled", "fallback", "ROC AUC"
        )?;
        for v in &self.versions {
            writeln!(
                f,
                "{:<8} {:<8} {:>11} {:>9} {:>8.1}% {:>8}  {:?}",
                if v.version.is_empty() {
                    "-"
                } else {
                    &v.version
                },
                v.role,
                v.predictions,
                v.labelled,
                v.fallback_rate * 100.0,
                v.roc_auc.map_or("-".into(), |a| format!("{a:.3}")),
                v.sources
            )?;
        }
        writeln!(f, "(version - : answers no model gave: the precomputed batch score, rules or the default)")?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tally(latencies: &[u64], sources: &[(&str, u64)]) -> PhaseTally {
        let mut t = PhaseTally::new().unwrap();
        for us in latencies {
            t.latency.record(*us).unwrap();
        }
        t.sources = sources.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        t
    }

    fn traffic() -> Traffic {
        Traffic {
            planned: Duration::from_secs(20),
            elapsed_s: 20.5,
            tallies: vec![
                tally(&[100, 200, 300, 400], &[("MODEL", 4)]),
                tally(&[1_000, 2_000], &[("MODEL", 1), ("BATCH_SCORE", 1)]),
                tally(&[50_000], &[("RULES", 1)]),
                tally(&[150, 250], &[("MODEL", 2)]),
            ],
            truths: (0..9).map(|i| (format!("demo-{i}"), i as f64)).collect(),
            first_model_after_clear_us: Some(13_400_000),
        }
    }

    fn findings(no_stall: bool) -> Findings {
        Findings {
            concurrency: 3,
            no_stall,
            breaker_transitions: BTreeMap::from([("fraud_mlp/v1/local0 -> open".into(), 1)]),
            log_records: 9,
            fraud: 1,
            model: "fraud_mlp".into(),
            join: JoinReport {
                logs_dir: "p".into(),
                labels_path: "o".into(),
                key: "request_id".into(),
                label_column: "label".into(),
                records: 9,
                unlabelled_predictions: 0,
                labels: Default::default(),
                groups: Vec::new(),
            },
            files: BTreeMap::from([("data".into(), PathBuf::from("d"))]),
        }
    }

    #[test]
    fn phases_follow_the_planned_clock() {
        let p = phase_summaries(&traffic().tallies, 20.0);
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "steady",
                "one replica stalled",
                "both replicas stalled",
                "recovered"
            ]
        );
        let bounds: Vec<(f64, f64)> = p.iter().map(|p| (p.from_s, p.to_s)).collect();
        let expect = [(0.0, 7.0), (7.0, 11.0), (11.0, 13.0), (13.0, 20.0)];
        for ((f, t), (ef, et)) in bounds.iter().zip(expect) {
            assert!((f - ef).abs() < 1e-9 && (t - et).abs() < 1e-9, "{bounds:?}");
        }
        assert_eq!((p[0].decisions, p[1].fallbacks, p[2].fallbacks), (4, 1, 1));
        assert!((p[0].throughput - 4.0 / 7.0).abs() < 1e-9);
        assert!((p[2].throughput - 0.5).abs() < 1e-9);
    }

    #[test]
    fn the_model_is_back_from_its_first_answer_after_the_clear() {
        assert_eq!(
            model_back_after(false, Some(13_400_000), 13.0).map(|s| (s * 10.0).round()),
            Some(4.0)
        );
        // An answer stamped a hair before the planned clear counts as at once.
        assert_eq!(model_back_after(false, Some(12_999_000), 13.0), Some(0.0));
        assert_eq!(model_back_after(false, None, 13.0), None);
        assert_eq!(model_back_after(true, Some(13_400_000), 13.0), None);
    }

    #[test]
    fn the_summary_adds_up_the_phases() {
        let s = build(traffic(), findings(false)).unwrap();
        assert_eq!((s.decisions, s.transactions, s.concurrency), (9, 9, 3));
        assert_eq!(
            s.sources,
            BTreeMap::from([
                ("BATCH_SCORE".into(), 1),
                ("MODEL".into(), 7),
                ("RULES".into(), 1)
            ])
        );
        assert_eq!((s.fallbacks, s.fallbacks_during_stall), (2, 2));
        assert!((s.model_back_after_s.unwrap() - 0.4).abs() < 1e-6);
        assert!(
            s.max_us >= 50_000 && s.p50_us < 1_000,
            "{} {}",
            s.max_us,
            s.p50_us
        );
        assert!(build(traffic(), findings(true))
            .unwrap()
            .model_back_after_s
            .is_none());
    }

    #[test]
    fn the_summary_keeps_its_json_fields_and_printed_sections() {
        let s = build(traffic(), findings(false)).unwrap();
        // The fields tests/e2e/test_demo.py and readers of summary.json use.
        let json = serde_json::to_value(&s).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "breaker_transitions",
                "concurrency",
                "decisions",
                "errors",
                "fallbacks",
                "fallbacks_during_stall",
                "files",
                "fraud",
                "log_records",
                "max_us",
                "model",
                "model_back_after_s",
                "p50_us",
                "p999_us",
                "p99_us",
                "phases",
                "seconds",
                "sources",
                "throughput",
                "transactions",
                "versions",
            ]
        );
        let phase = json["phases"][3].as_object().unwrap();
        for k in [
            "name",
            "from_s",
            "to_s",
            "decisions",
            "throughput",
            "p50_us",
            "p99_us",
            "sources",
            "fallbacks",
            "errors",
        ] {
            assert!(phase.contains_key(k), "{k}");
        }
        // The printed summary names the phases, the breakers and the version table.
        let text = s.to_string();
        for needle in [
            "both replicas stalled",
            "ROC AUC",
            "fraud_mlp/v1/local0 -> open",
            "within 0.4 s",
            "== fraud_mlp versions against outcomes",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
    }
}
