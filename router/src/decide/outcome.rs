//! What a decision answers and logs: the outcome, where it came from, and the
//! time spent in each stage.
use mesh_prediction_log::{Role, StageMicros};
use mesh_proto::mesh::v1 as pb;

use super::features::FeatureUsed;
use super::spec::Verdict;

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerSource {
    Model,
    PreviousVersion,
    BatchScore,
    Rules,
    Default,
    /// Not an answer: the deadline passed before the decision was ready (or before
    /// its work started). The caller got DEADLINE_EXCEEDED; the log keeps the record.
    Deadline,
}

impl AnswerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "MODEL",
            Self::PreviousVersion => "PREVIOUS_VERSION",
            Self::BatchScore => "BATCH_SCORE",
            Self::Rules => "RULES",
            Self::Default => "DEFAULT",
            Self::Deadline => "DEADLINE",
        }
    }
    fn proto(self) -> pb::AnswerSource {
        match self {
            Self::Model => pb::AnswerSource::Model,
            Self::PreviousVersion => pb::AnswerSource::PreviousVersion,
            Self::BatchScore => pb::AnswerSource::BatchScore,
            Self::Rules => pb::AnswerSource::Rules,
            Self::Default => pb::AnswerSource::Default,
            // Never sent: a late decision is a DEADLINE_EXCEEDED status.
            Self::Deadline => pb::AnswerSource::Unspecified,
        }
    }
}

/// Microseconds per stage: the prediction log's one list of stages
/// ([`StageMicros::NAMES`]), which also names the `stage` label of
/// `mesh_router_stage_seconds` and the `<stage>_us` Parquet columns.
pub type Timings = StageMicros;

/// The stages with their values, in [`StageMicros::NAMES`] order.
pub fn stages(t: &Timings) -> impl Iterator<Item = (&'static str, u64)> {
    StageMicros::NAMES.into_iter().zip(t.as_array())
}

/// The decision with everything the log needs.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub request_id: String,
    pub model: String,
    pub version: Option<u64>,
    pub role: Role,
    pub score: Option<f32>,
    pub decision: Verdict,
    pub source: AnswerSource,
    pub reasons: Vec<String>,
    pub features: Vec<FeatureUsed>,
    pub entities: Vec<(String, String)>,
    pub timings: Timings,
}

impl Outcome {
    /// Nothing decided yet: the default decision from the default source.
    pub fn new(req: &pb::DecideRequest, model: &str, role: Role, default: Verdict) -> Self {
        Self {
            request_id: req.request_id.clone(),
            model: model.to_owned(),
            version: None,
            role,
            score: None,
            decision: default,
            source: AnswerSource::Default,
            reasons: Vec::new(),
            features: Vec::new(),
            entities: entities(req),
            timings: Timings::default(),
        }
    }

    pub fn to_proto(&self) -> pb::DecideResponse {
        let t = &self.timings;
        pb::DecideResponse {
            request_id: self.request_id.clone(),
            score: self.score,
            decision: match self.decision {
                Verdict::Approve => pb::Decision::Approve,
                Verdict::Review => pb::Decision::Review,
                Verdict::Decline => pb::Decision::Decline,
            } as i32,
            model: self.model.clone(),
            model_version: self.version.map(|v| v.to_string()).unwrap_or_default(),
            source: self.source.proto() as i32,
            timings: Some(pb::StageTimings {
                validate_us: t.validate,
                features_us: t.features,
                preprocess_us: t.preprocess,
                queue_us: t.queue,
                compute_us: t.compute,
                postprocess_us: t.postprocess,
                total_us: t.total,
            }),
            reasons: self.reasons.clone(),
            role: self.role.as_str().to_owned(),
        }
    }
}

/// Receives every outcome (primary, canary and shadow) without blocking.
pub trait OutcomeSink: Send + Sync {
    fn record(&self, outcome: &Outcome);
}

/// The request's entity keys as text, for the log.
pub fn entities(req: &pb::DecideRequest) -> Vec<(String, String)> {
    req.entities
        .iter()
        .map(|(k, v)| (k.clone(), entity_str(v)))
        .collect()
}

fn entity_str(k: &pb::EntityKey) -> String {
    use pb::entity_key::Key;
    match &k.key {
        Some(Key::Int64Key(v)) => v.to_string(),
        Some(Key::StringKey(s)) => s.clone(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_list_is_the_prediction_logs() {
        let t = Timings {
            validate: 1,
            features: 2,
            preprocess: 3,
            queue: 4,
            compute: 5,
            postprocess: 6,
            total: 30,
        };
        let got: Vec<_> = stages(&t).collect();
        assert_eq!(
            got,
            vec![
                ("validate", 1),
                ("features", 2),
                ("preprocess", 3),
                ("queue", 4),
                ("compute", 5),
                ("postprocess", 6),
                ("total", 30),
            ]
        );
    }

    #[test]
    fn proto_carries_role_source_and_timings() {
        let req = crate::decide::testing::request("r1", 10.0, Some(7));
        let mut o = Outcome::new(&req, "fraud", Role::Canary, Verdict::Review);
        assert_eq!(o.source, AnswerSource::Default);
        assert_eq!(o.entities, vec![("card_id".to_string(), "7".to_string())]);
        o.version = Some(2);
        o.source = AnswerSource::PreviousVersion;
        o.timings.queue = 40;
        let p = o.to_proto();
        assert_eq!(p.role, "canary");
        assert_eq!(p.model_version, "2");
        assert_eq!(p.source, pb::AnswerSource::PreviousVersion as i32);
        assert_eq!(p.decision, pb::Decision::Review as i32);
        assert_eq!(p.timings.unwrap().queue_us, 40);
    }
}
