//! The stages of a decision that need neither a model nor the engine, in the order
//! a request meets them (see DESIGN.md, "How a decision flows"): validate ->
//! features -> preprocess -> [model call and fallbacks: `fallback`] ->
//! postprocess -> log.
use std::collections::HashMap;

use std::time::Instant;

use mesh_feature_store::{KeyColumn, KeyType, LookupRequest, LookupResponse};
use mesh_proto::mesh::v1 as pb;
use metrics::counter;

use super::config::Rule;
use super::feature_source::FeatureSource;
use super::features::{build_row, FeatureUsed, RequestFeatures};
use super::meters::DecisionMeters;
use super::outcome::{AnswerSource, Outcome, OutcomeSink};
use super::replica::ModelAnswer;
use super::spec::{DecisionSpec, Thresholds};
use crate::error::RouterError;
use crate::telemetry::names;

/// One validated request of a batch.
pub struct Item<'a> {
    pub req: &'a pb::DecideRequest,
    pub pinned: Option<u64>,
}

/// Stage 1: sizes, one model per batch, ids, finite features, the version's form.
pub fn validate(
    reqs: &[pb::DecideRequest],
    max_batch_items: usize,
) -> Result<Vec<Item<'_>>, RouterError> {
    if reqs.is_empty() {
        return Err(RouterError::invalid(
            "DecideBatch needs at least one request",
        ));
    }
    if reqs.len() > max_batch_items {
        return Err(RouterError::invalid(format!(
            "{} requests in one DecideBatch; the limit is {max_batch_items} (max_batch_items)",
            reqs.len(),
        )));
    }
    let model = &reqs[0].model;
    let mut items = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let at = |m: String| {
            if reqs.len() > 1 {
                RouterError::invalid(format!("requests[{i}]: {m}"))
            } else {
                RouterError::invalid(m)
            }
        };
        if r.request_id.is_empty() {
            return Err(at("request_id is empty".into()));
        }
        if r.model.is_empty() {
            return Err(at("model is empty".into()));
        }
        if r.model != *model {
            return Err(at(format!(
                "model '{}' differs from requests[0]'s '{model}'; a batch is for one model",
                r.model
            )));
        }
        // Models compute in f32: a finite f64 past f32's range (1e300) would become
        // inf there, so it is refused here, naming the feature.
        if let Some((k, v)) = r
            .features
            .iter()
            .find(|(_, v)| !v.is_finite() || v.abs() > f64::from(f32::MAX))
        {
            return Err(at(format!(
                "feature '{}' is {v:e}: request features must be finite numbers within f32's range",
                crate::error::clip(k, 64)
            )));
        }
        crate::request::check_request_id(&r.request_id)?;
        let pinned = crate::request::parse_version(&r.model, &r.version)?;
        items.push(Item { req: r, pinned });
    }
    Ok(items)
}

/// The join keys the spec's views need, with their key types and the views.
fn join_keys(
    store: &FeatureSource,
    spec: &DecisionSpec,
) -> Result<Vec<(String, KeyType, Vec<String>)>, RouterError> {
    let mut out: Vec<(String, KeyType, Vec<String>)> = Vec::new();
    for v in &spec.views {
        let view = store
            .view(v)
            .map_err(|e| RouterError::Internal(format!("input spec reads view '{v}': {e}")))?;
        match out.iter_mut().find(|(k, _, _)| *k == view.join_key) {
            Some((_, _, views)) => views.push(v.clone()),
            None => out.push((view.join_key.clone(), view.key_type, vec![v.clone()])),
        }
    }
    Ok(out)
}

/// Every item's key of `join_key` (needed by `views`), as one column.
fn key_column(
    items: &[Item<'_>],
    join_key: &str,
    key_type: KeyType,
    views: &[String],
) -> Result<KeyColumn, RouterError> {
    use pb::entity_key::Key;
    let mut ints = Vec::new();
    let mut strs = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let key = it
            .req
            .entities
            .get(join_key)
            .and_then(|k| k.key.clone())
            .ok_or_else(|| {
                RouterError::invalid(format!(
                    "{}missing entity key '{join_key}' (needed by view {})",
                    if items.len() > 1 {
                        format!("requests[{i}]: ")
                    } else {
                        String::new()
                    },
                    views.join(", ")
                ))
            })?;
        match (key_type, key) {
            (KeyType::Int64, Key::Int64Key(k)) => ints.push(k),
            (KeyType::String, Key::StringKey(k)) if !k.is_empty() => strs.push(k),
            (t, _) => {
                return Err(RouterError::invalid(format!(
                    "entity key '{join_key}' must be a non-empty {} key",
                    t.as_str()
                )))
            }
        }
    }
    Ok(match key_type {
        KeyType::Int64 => KeyColumn::Int64(ints),
        KeyType::String => KeyColumn::String(strs),
    })
}

/// Stage 2: one batched lookup for every item, ending by `deadline` (a remote
/// store's gRPC timeout); `None` when the spec reads no store feature, there is
/// no store, or the lookup failed (a store failure, or a remote that did not
/// answer in time, degrades to defaults / refusals per the spec, it is not an
/// error).
pub async fn lookup(
    store: Option<&FeatureSource>,
    spec: &DecisionSpec,
    items: &[Item<'_>],
    deadline: Instant,
) -> Result<Option<LookupResponse>, RouterError> {
    let Some(store) = store else {
        return Ok(None);
    };
    if spec.store_features.is_empty() {
        return Ok(None);
    }
    let mut req = LookupRequest::shared(spec.store_features.clone());
    for (join_key, key_type, views) in join_keys(store, spec)? {
        let col = key_column(items, &join_key, key_type, &views)?;
        req = req.with_keys(join_key, col);
    }
    // The source counts and logs a failure.
    Ok(store.lookup(req, deadline).await.ok())
}

/// Stage 3: the input row of item `i` (row `i` of the lookup); `Err` is the
/// refusal to score (a feature marked `refuse` was missing or stale).
pub fn preprocess(
    spec: &DecisionSpec,
    it: &Item<'_>,
    lookup: Option<&LookupResponse>,
    i: usize,
) -> Result<(Vec<f32>, Vec<FeatureUsed>), String> {
    let req_features = RequestFeatures {
        numeric: &it.req.features,
        categorical: &it.req.categorical,
    };
    build_row(spec, &req_features, lookup, i)
}

/// Stage 3, after the row is built: when the store's backend (Redis) did not
/// answer this item's entities within its lookup budget, the reason says so (its
/// values came from the cache as OUTSIDE_MAX_AGE, or are UNAVAILABLE; the
/// defaults they took are named by [`note_defaults`]).
pub fn note_degraded(o: &mut Outcome, lookup: Option<&LookupResponse>, i: usize) {
    if let Some(d) = lookup.and_then(|l| l.degraded.as_ref()) {
        if d.rows.get(i).copied().unwrap_or(false) {
            o.reasons.push(format!("features degraded: {}", d.reason));
        }
    }
}

/// Stage 3, after the row is built: the features that took the spec's default
/// (unknown entity, null, stale, a failed lookup, a request feature not sent) are
/// named in the reasons, grouped by view and status, and counted per view
/// (`mesh_router_defaulted_features_total`). `Err` when there are more than
/// `limit` (the deployment's `max_defaulted_features`): the row is not scored.
pub fn note_defaults(o: &mut Outcome, limit: Option<usize>) -> Result<(), String> {
    let defaulted: Vec<&FeatureUsed> = o.features.iter().filter(|f| f.defaulted()).collect();
    if defaulted.is_empty() {
        return Ok(());
    }
    // (view, status) -> feature names, in spec order.
    let mut groups: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    for f in &defaulted {
        let key = (f.view(), f.status);
        let short = f.name.split_once(':').map_or(&*f.name, |(_, n)| n);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, names)) => names.push(short),
            None => groups.push((key, vec![short])),
        }
    }
    let mut per_view: Vec<(&str, u64)> = Vec::new();
    for ((view, _), names) in &groups {
        match per_view.iter_mut().find(|(v, _)| v == view) {
            Some((_, n)) => *n += names.len() as u64,
            None => per_view.push((view, names.len() as u64)),
        }
    }
    for (view, n) in per_view {
        counter!(names::DEFAULTED_FEATURES, "model" => o.model.clone(), "view" => view.to_owned())
            .increment(n);
    }
    let listed: Vec<String> = groups
        .iter()
        .map(|((view, status), names)| format!("{view} {status}: {}", names.join(", ")))
        .collect();
    let n = defaulted.len();
    o.reasons.push(format!(
        "{n} feature{} took the spec's default: {}",
        if n == 1 { "" } else { "s" },
        listed.join("; ")
    ));
    match limit {
        Some(max) if n > max => Err(format!(
            "{n} feature{} took defaults, more than this deployment's max_defaulted_features = {max}",
            if n == 1 { "" } else { "s" },
        )),
        _ => Ok(()),
    }
}

/// Stage 6, postprocess of a model answer (routed or previous version): its score
/// through the thresholds.
pub fn score_answer(o: &mut Outcome, a: &ModelAnswer, source: AnswerSource, t: &Thresholds) {
    let score = a.scores.first().copied().unwrap_or(f32::NAN);
    o.version = Some(a.version);
    o.score = Some(score);
    o.source = source;
    o.timings.queue = a.queue.as_micros() as u64;
    o.timings.compute = a.compute.as_micros() as u64;
    o.decision = t.verdict(f64::from(score));
    o.reasons
        .push(format!("score {score:.4} -> {}", o.decision.as_str()));
}

/// Stage 6, postprocess of the precomputed batch score (fallback 2).
pub fn score_batch(o: &mut Outcome, score: f32, t: &Thresholds) {
    o.score = Some(score);
    o.source = AnswerSource::BatchScore;
    o.decision = t.verdict(f64::from(score));
    o.reasons
        .push(format!("batch score {score:.4} -> {}", o.decision.as_str()));
}

/// Stage 6, the rules (fallback 3) and the default (fallback 4): rules escalate a
/// scored answer (the strictest wins) and decide on their own when nothing scored;
/// with neither, the default decision stands.
pub fn apply_rules(o: &mut Outcome, rules: &[Rule], features: &HashMap<String, f64>) {
    let fired: Vec<&Rule> = rules.iter().filter(|r| r.fires(features)).collect();
    for r in &fired {
        o.reasons
            .push(format!("rule {} -> {}", r.name, r.decision.as_str()));
    }
    let strictest = fired.iter().map(|r| r.decision).max();
    match (o.source, strictest) {
        (AnswerSource::Default, Some(d)) => {
            o.source = AnswerSource::Rules;
            o.decision = d;
        }
        (AnswerSource::Default, None) => o
            .reasons
            .push(format!("default -> {}", o.decision.as_str())),
        (_, Some(d)) => o.decision = o.decision.max(d),
        _ => {}
    }
}

/// Stage 8, log: the debug line, the metrics (decisions, fallbacks, one histogram
/// sample per stage) and the outcome sink (the prediction log), which never blocks.
/// A decision whose deadline passed before it was ready: not an answer. Its source
/// becomes `DEADLINE` (what it would have answered stays in the record, with the
/// reason), so neither the metrics nor the log count it as answered.
pub fn mark_late(o: &mut Outcome, why: &crate::error::RouterError) {
    o.reasons.push(format!(
        "not answered: {} (was {})",
        why.message(),
        o.source.as_str()
    ));
    o.source = AnswerSource::Deadline;
}

pub fn log(o: &Outcome, sink: Option<&dyn OutcomeSink>, meters: &DecisionMeters) {
    if o.source == AnswerSource::Model {
        tracing::debug!(request_id = %o.request_id, version = ?o.version, score = ?o.score, decision = o.decision.as_str(), "decided");
    } else {
        tracing::debug!(request_id = %o.request_id, source = o.source.as_str(), decision = o.decision.as_str(), reasons = ?o.reasons, "answered by a fallback");
    }
    meters.record(o);
    if !matches!(o.source, AnswerSource::Model | AnswerSource::Deadline) {
        counter!(names::FALLBACKS, "model" => o.model.clone(), "source" => o.source.as_str())
            .increment(1);
    }
    if let Some(s) = sink {
        s.record(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::spec::Verdict;
    use crate::decide::testing::{self, answer, request};
    use mesh_feature_store::FeatureStatus;
    use mesh_prediction_log::Role;

    fn outcome() -> Outcome {
        Outcome::new(
            &request("r", 1.0, None),
            "fraud",
            Role::Primary,
            Verdict::Review,
        )
    }

    fn rules() -> Vec<Rule> {
        toml::from_str::<HashMap<String, Vec<Rule>>>(
            r#"
            [[r]]
            name = "big"
            feature = "amount"
            above = 5000.0
            decision = "review"
            [[r]]
            name = "huge"
            feature = "amount"
            above = 9000.0
            decision = "decline"
            "#,
        )
        .unwrap()
        .remove("r")
        .unwrap()
    }

    fn message(e: RouterError) -> String {
        match e {
            RouterError::InvalidArgument(m) => m,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn validate_refuses_bad_batches_and_parses_the_version() {
        let ok = request("a", 1.0, None);
        assert!(message(validate(&[], 10).err().unwrap()).contains("at least one"));
        let two = [ok.clone(), ok.clone()];
        assert!(message(validate(&two, 1).err().unwrap()).contains("limit is 1"));
        let mut other = ok.clone();
        other.model = "other".into();
        let m = message(validate(&[ok.clone(), other], 10).err().unwrap());
        assert!(m.starts_with("requests[1]: model 'other' differs"), "{m}");
        let mut nan = ok.clone();
        nan.features.insert("x".into(), f64::NAN);
        let m = message(validate(std::slice::from_ref(&nan), 10).err().unwrap());
        assert_eq!(
            m,
            "feature 'x' is NaN: request features must be finite numbers within f32's range"
        );
        // Finite in f64, infinite in the model's f32: refused, naming the feature.
        for big in [1e300, -1e39, f64::from(f32::MAX) * 2.0] {
            let mut r = ok.clone();
            r.features.insert("amount".into(), big);
            let m = message(validate(std::slice::from_ref(&r), 10).err().unwrap());
            assert!(m.starts_with("feature 'amount' is"), "{m}");
        }
        let mut edge = ok.clone();
        edge.features.insert("amount".into(), f64::from(f32::MAX));
        assert!(validate(std::slice::from_ref(&edge), 10).is_ok());
        let mut long_id = ok.clone();
        long_id.request_id = "r".repeat(300);
        assert!(message(validate(&[long_id], 10).err().unwrap()).contains("limit is 256"));
        let mut no_id = ok.clone();
        no_id.request_id.clear();
        assert!(message(validate(&[no_id], 10).err().unwrap()).contains("request_id is empty"));
        let mut pinned = ok.clone();
        pinned.version = "3".into();
        let items = validate(std::slice::from_ref(&pinned), 10).unwrap();
        assert_eq!(items[0].pinned, Some(3));
        pinned.version = "x".into();
        assert!(matches!(
            validate(std::slice::from_ref(&pinned), 10),
            Err(RouterError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn lookup_reads_one_batch_and_names_missing_keys() {
        let (_dir, store) = testing::source();
        let spec = testing::spec();
        let reqs = [request("a", 1.0, Some(7)), request("b", 1.0, Some(9))];
        let items = validate(&reqs, 10).unwrap();
        let resp = lookup(Some(&store), &spec, &items, testing::later())
            .await
            .unwrap()
            .unwrap();
        let col = resp.column("card:f31").unwrap();
        assert_eq!(
            col.statuses,
            vec![FeatureStatus::Present, FeatureStatus::NotFound]
        );
        // No store, or a spec that reads none: no lookup, no error.
        assert!(lookup(None, &spec, &items, testing::later())
            .await
            .unwrap()
            .is_none());
        let mut request_only = testing::spec();
        request_only.store_features = Vec::new().into();
        assert!(
            lookup(Some(&store), &request_only, &items, testing::later())
                .await
                .unwrap()
                .is_none()
        );
        // A missing key is the caller's mistake, named with its item.
        let reqs = [request("a", 1.0, Some(7)), request("b", 1.0, None)];
        let items = validate(&reqs, 10).unwrap();
        let m = message(
            lookup(Some(&store), &spec, &items, testing::later())
                .await
                .err()
                .unwrap(),
        );
        assert_eq!(
            m,
            "requests[1]: missing entity key 'card_id' (needed by view card)"
        );
    }

    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn a_failed_lookup_is_no_lookup_and_is_counted() {
        use crate::decide::feature_source::FeatureSource;
        use crate::decide::remote_features::RemoteFeatures;
        // A features role that is not there: a port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (_dir, local) = testing::source();
        let remote = FeatureSource::Remote(Box::new(RemoteFeatures::unconnected(
            &format!("http://127.0.0.1:{port}"),
            local.views().to_vec(),
            None,
        )));
        let spec = testing::spec();
        let reqs = [request("a", 1.0, Some(7))];
        let items = validate(&reqs, 10).unwrap();
        let rec = testing::Recorder::default();
        let guard = metrics::set_default_local_recorder(&rec);
        let started = std::time::Instant::now();
        let got = lookup(
            Some(&remote),
            &spec,
            &items,
            started + std::time::Duration::from_millis(300),
        )
        .await
        .unwrap();
        assert!(got.is_none());
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // No time left: not sent, and a failure too.
        assert!(
            lookup(Some(&remote), &spec, &items, std::time::Instant::now())
                .await
                .unwrap()
                .is_none()
        );
        drop(guard);
        let failures: Vec<_> = rec
            .take()
            .into_iter()
            .filter(|m| m.name == names::FEATURE_LOOKUP_FAILURES)
            .collect();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert_eq!(
            failures[0].labels,
            vec![("store".to_string(), "remote".to_string())]
        );
        // The row then takes the spec's default, UNAVAILABLE.
        let (row, used) = preprocess(&spec, &items[0], None, 0).unwrap();
        assert_eq!(row, vec![1.0, -1.0]);
        assert_eq!(used[1].status, "UNAVAILABLE");
    }

    #[tokio::test]
    async fn preprocess_builds_the_row_or_refuses() {
        let (_dir, store) = testing::source();
        let spec = testing::spec();
        let reqs = [request("a", 12.5, Some(7)), request("b", 3.0, Some(9))];
        let items = validate(&reqs, 10).unwrap();
        let resp = lookup(Some(&store), &spec, &items, testing::later())
            .await
            .unwrap();
        let (row, used) = preprocess(&spec, &items[0], resp.as_ref(), 0).unwrap();
        assert_eq!(row, vec![12.5, 0.25]);
        assert_eq!(used[1].status, "PRESENT");
        // Card 9 is unknown: its f31 takes the spec's default.
        let (row, used) = preprocess(&spec, &items[1], resp.as_ref(), 1).unwrap();
        assert_eq!(row, vec![3.0, -1.0]);
        assert_eq!(used[1].status, "NOT_FOUND");
        // `amount` is marked refuse: without it the request is not scored.
        let mut no_amount = request("c", 1.0, Some(7));
        no_amount.features.clear();
        let items = validate(std::slice::from_ref(&no_amount), 10).unwrap();
        let refusal = preprocess(&spec, &items[0], None, 0).unwrap_err();
        assert!(refusal.contains("amount"), "{refusal}");
    }

    #[test]
    fn postprocess_scores_through_the_thresholds() {
        let t = testing::spec().thresholds;
        let mut o = outcome();
        score_answer(&mut o, &answer(2, 0.93), AnswerSource::PreviousVersion, &t);
        assert_eq!(o.source, AnswerSource::PreviousVersion);
        assert_eq!(
            (o.version, o.score, o.decision),
            (Some(2), Some(0.93), Verdict::Decline)
        );
        assert_eq!((o.timings.queue, o.timings.compute), (7, 11));
        assert_eq!(o.reasons, vec!["score 0.9300 -> decline".to_string()]);

        let mut o = outcome();
        score_batch(&mut o, 0.2, &t);
        assert_eq!(
            (o.source, o.version, o.decision),
            (AnswerSource::BatchScore, None, Verdict::Approve)
        );
        assert_eq!(o.reasons, vec!["batch score 0.2000 -> approve".to_string()]);
    }

    #[test]
    fn rules_escalate_decide_alone_or_leave_the_default() {
        let t = testing::spec().thresholds;
        let rules = rules();
        // A scored approve is escalated to the strictest rule that fired.
        let mut o = outcome();
        score_answer(&mut o, &answer(1, 0.1), AnswerSource::Model, &t);
        apply_rules(&mut o, &rules, &request("r", 9500.0, None).features);
        assert_eq!(
            (o.source, o.decision),
            (AnswerSource::Model, Verdict::Decline)
        );
        assert!(o.reasons.contains(&"rule big -> review".to_string()));
        assert!(o.reasons.contains(&"rule huge -> decline".to_string()));
        // A rule never lowers a scored decision.
        let mut o = outcome();
        score_answer(&mut o, &answer(1, 0.95), AnswerSource::Model, &t);
        apply_rules(&mut o, &rules, &request("r", 6000.0, None).features);
        assert_eq!(o.decision, Verdict::Decline);
        // Nothing scored: the rules answer.
        let mut o = outcome();
        apply_rules(&mut o, &rules, &request("r", 6000.0, None).features);
        assert_eq!(
            (o.source, o.decision),
            (AnswerSource::Rules, Verdict::Review)
        );
        // Nothing scored, no rule: the default, said so.
        let mut o = outcome();
        apply_rules(&mut o, &rules, &request("r", 10.0, None).features);
        assert_eq!(
            (o.source, o.decision),
            (AnswerSource::Default, Verdict::Review)
        );
        assert_eq!(o.reasons, vec!["default -> review".to_string()]);
    }

    #[test]
    fn log_counts_labels_every_stage_and_reaches_the_sink() {
        use std::sync::Mutex;
        struct Sink(Mutex<Vec<(String, Role, AnswerSource)>>);
        impl OutcomeSink for Sink {
            fn record(&self, o: &Outcome) {
                self.0
                    .lock()
                    .unwrap()
                    .push((o.request_id.clone(), o.role, o.source));
            }
        }
        let rec = testing::Recorder::default();
        let sink = Sink(Mutex::new(Vec::new()));
        let mut o = outcome();
        o.role = Role::Canary;
        o.source = AnswerSource::BatchScore;
        o.timings.compute = 1500;
        let meters = DecisionMeters::default();
        metrics::with_local_recorder(&rec, || log(&o, Some(&sink), &meters));
        assert_eq!(
            sink.0.into_inner().unwrap(),
            vec![("r".to_string(), Role::Canary, AnswerSource::BatchScore)]
        );
        let got = rec.take();
        let decisions = got.iter().find(|m| m.name == names::DECISIONS).unwrap();
        assert!(decisions.labels.contains(&("role".into(), "canary".into())));
        assert!(decisions
            .labels
            .contains(&("source".into(), "BATCH_SCORE".into())));
        assert!(got.iter().any(|m| m.name == names::FALLBACKS));
        let stages: Vec<(String, f64)> = got
            .iter()
            .filter(|m| m.name == names::STAGE)
            .map(|m| (m.labels[0].1.clone(), m.value))
            .collect();
        let want: Vec<String> = mesh_prediction_log::StageMicros::NAMES
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(stages.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), want);
        assert_eq!(stages[4], ("compute".to_string(), 0.0015));
    }

    #[test]
    fn defaults_are_named_counted_and_limited() {
        let used = |name: &str, status: &'static str, value: Option<f64>| FeatureUsed {
            name: name.into(),
            value,
            status,
            event_time_us: None,
        };
        use mesh_prediction_log::status;
        let mut o = outcome();
        o.features = vec![
            used("request:amount", status::PRESENT, Some(1.0)),
            used("card:a", status::NOT_FOUND, None),
            used("card:b", status::NOT_FOUND, None),
            used("merchant:c", status::UNAVAILABLE, None),
            used("request:f1", status::MISSING, None),
        ];
        let rec = testing::Recorder::default();
        let r = metrics::with_local_recorder(&rec, || note_defaults(&mut o, None));
        assert!(r.is_ok());
        assert_eq!(
            o.reasons,
            vec!["4 features took the spec's default: card NOT_FOUND: a, b; merchant UNAVAILABLE: c; request MISSING: f1".to_string()]
        );
        let got = rec.take();
        let card = got
            .iter()
            .find(|m| {
                m.name == names::DEFAULTED_FEATURES
                    && m.labels.contains(&("view".into(), "card".into()))
            })
            .unwrap();
        assert_eq!(card.value, 2.0);
        // Over the deployment's limit: refused.
        let mut o2 = outcome();
        o2.features = o.features.clone();
        let e = note_defaults(&mut o2, Some(3)).unwrap_err();
        assert!(e.contains("max_defaulted_features = 3"), "{e}");
        assert!(note_defaults(&mut o.clone(), Some(4)).is_ok());
        // Nothing defaulted: no reason.
        let mut o3 = outcome();
        o3.features = vec![used("card:a", status::PRESENT, Some(1.0))];
        assert!(note_defaults(&mut o3, Some(0)).is_ok());
        assert!(o3.reasons.is_empty());
    }
}
