//! The metric handles every decision records into, registered on first use and kept.
//!
//! A `counter!`/`histogram!` call builds its key (a vector of labels, an owned copy
//! of each label value that is not `'static`), hashes it and looks it up in the
//! recorder's registry, every time. A decision recorded eight such samples (a
//! decisions counter and one histogram sample per stage), so the registry's work
//! came before each one's atomic add. With the handles kept here, a decision adds to
//! them directly: the key of each is built once, when it is first needed.
//!
//! Handles belong to the recorder that was current when they were registered (the
//! process's global one when serving; a test's local one inside
//! `metrics::with_local_recorder`), so a [`DecisionMeters`] registers nothing before
//! its first decision.
use std::collections::HashMap;
use std::sync::OnceLock;

use mesh_prediction_log::StageMicros;
use metrics::{counter, histogram, Counter, Histogram};
use parking_lot::RwLock;

use super::outcome::{stages, Outcome};
use crate::telemetry::names;

/// The `source`, `decision` and `role` labels of one decisions counter.
type DecisionLabels = (&'static str, &'static str, &'static str);

/// One stage histogram per [`StageMicros::NAMES`] entry, and the decisions counter
/// of each (model, source, decision, role) seen. The counters are as many as the
/// registry holds anyway: one per label set that a decision has used, for models
/// the engine has a spec for.
#[derive(Default)]
pub struct DecisionMeters {
    stages: OnceLock<[Histogram; StageMicros::NAMES.len()]>,
    decisions: RwLock<HashMap<String, HashMap<DecisionLabels, Counter>>>,
}

impl DecisionMeters {
    /// Counts the decision in `mesh_router_decisions_total` and adds one sample per
    /// stage to `mesh_router_stage_seconds`.
    pub fn record(&self, o: &Outcome) {
        self.count(o);
        let hists = self
            .stages
            .get_or_init(|| StageMicros::NAMES.map(|s| histogram!(names::STAGE, "stage" => s)));
        for (h, (_, us)) in hists.iter().zip(stages(&o.timings)) {
            h.record(us as f64 / 1e6);
        }
    }

    /// Counts the decision in `mesh_router_decisions_total`.
    pub fn count(&self, o: &Outcome) {
        let labels = (o.source.as_str(), o.decision.as_str(), o.role.as_str());
        if let Some(c) = self
            .decisions
            .read()
            .get(o.model.as_str())
            .and_then(|m| m.get(&labels))
        {
            c.increment(1);
            return;
        }
        let (source, decision, role) = labels;
        let c = counter!(names::DECISIONS, "model" => o.model.clone(), "source" => source, "decision" => decision, "role" => role);
        c.increment(1);
        self.decisions
            .write()
            .entry(o.model.clone())
            .or_default()
            .insert(labels, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::outcome::AnswerSource;
    use crate::decide::spec::Verdict;
    use crate::decide::testing::{request, Recorder};
    use mesh_prediction_log::Role;

    fn outcome(model: &str, source: AnswerSource) -> Outcome {
        let mut o = Outcome::new(
            &request("r", 1.0, None),
            model,
            Role::Primary,
            Verdict::Review,
        );
        o.source = source;
        o.timings.compute = 250;
        o
    }

    /// Each handle is registered once, at its first use; later decisions add to the
    /// same handles, and a new label set (another model, another source) gets its own.
    #[test]
    fn handles_are_registered_once_and_every_decision_is_recorded() {
        let rec = Recorder::default();
        let meters = DecisionMeters::default();
        let stages = StageMicros::NAMES.len();
        metrics::with_local_recorder(&rec, || {
            meters.record(&outcome("fraud", AnswerSource::Model));
            assert_eq!(rec.registered(), 1 + stages);
            meters.record(&outcome("fraud", AnswerSource::Model));
            meters.count(&outcome("fraud", AnswerSource::Model));
            assert_eq!(
                rec.registered(),
                1 + stages,
                "the same label sets: no new handle"
            );
            meters.record(&outcome("fraud", AnswerSource::Rules));
            meters.record(&outcome("other", AnswerSource::Model));
            assert_eq!(rec.registered(), 3 + stages);
        });
        let seen = rec.take();
        let decisions: Vec<Vec<(String, String)>> = seen
            .iter()
            .filter(|m| m.name == names::DECISIONS)
            .map(|m| m.labels.clone())
            .collect();
        let labels = |model: &str, source: &str| {
            [
                ("model", model),
                ("source", source),
                ("decision", "review"),
                ("role", "primary"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec()
        };
        assert_eq!(
            decisions,
            vec![
                labels("fraud", "MODEL"),
                labels("fraud", "MODEL"),
                labels("fraud", "MODEL"),
                labels("fraud", "RULES"),
                labels("other", "MODEL"),
            ]
        );
        let compute: Vec<f64> = seen
            .iter()
            .filter(|m| m.name == names::STAGE && m.labels[0].1 == "compute")
            .map(|m| m.value)
            .collect();
        assert_eq!(
            compute,
            vec![0.00025; 4],
            "one sample per recorded decision"
        );
    }
}
