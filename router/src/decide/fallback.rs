//! The time budgets of one decision and the fallback chain that spends them: the
//! routed version first, then the previous ready versions while time allows, then
//! the precomputed batch score (the rules and the default follow in postprocess).
//!
//! ```text
//! started                                              deadline = started + min(grpc-timeout, [decisions] deadline)
//!   |-- routed version (model call) ----------|-- reserve --|
//!                                  previous versions ...|-- margin --|
//! ```
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use mesh_feature_store::{ColumnValues, FeatureStatus, KeyColumn, LookupRequest};
use mesh_proto::mesh::v1 as pb;

use super::config::{BatchScore, Deployment};
use super::feature_source::FeatureSource;
use super::replica::ModelAnswer;
use crate::error::RouterError;
use mesh_prediction_log::Role;

/// The share of the decision budget (`[decisions] deadline`) kept back from the routed
/// version's call for the fallbacks: one fifth. A model that used the whole budget
/// would leave a timed-out request nothing but the default decision; with a fifth
/// left, a previous version or at least the batch score and rules still answer.
pub const FALLBACK_RESERVE_DIVISOR: u32 = 5;

/// The most the reserve takes, however large the deadline is: the fallbacks after
/// the model call (a previous version on a warm replica, one point lookup, the
/// rules) fit in a few milliseconds, so a long budget goes to the routed version.
pub const FALLBACK_RESERVE_MAX: Duration = Duration::from_millis(5);

/// A previous version is not tried with less than this left before the deadline:
/// less is not enough for a queue + compute round trip, and starting one anyway
/// would only eat the time of the batch score and the rules.
pub const PREVIOUS_VERSION_MIN_LEFT: Duration = Duration::from_micros(500);

/// A previous version's call must end this long before the decision deadline, so
/// that the batch score lookup, the rules and the log still fit when it fails.
pub const PREVIOUS_VERSION_MARGIN: Duration = Duration::from_micros(200);

/// A batch-score lookup (fallback 2) must end this long before the decision
/// deadline, so that the rules and the log still fit.
pub const BATCH_SCORE_MARGIN: Duration = Duration::from_micros(200);

/// The time kept back from the routed version's call for the fallbacks.
pub fn fallback_reserve(budget: Duration) -> Duration {
    (budget / FALLBACK_RESERVE_DIVISOR).min(FALLBACK_RESERVE_MAX)
}

/// The deadline of the routed version's call: the decision deadline less the
/// reserve (the whole deadline when the reserve does not fit in an `Instant`).
pub fn model_call_deadline(deadline: Instant, budget: Duration) -> Instant {
    deadline
        .checked_sub(fallback_reserve(budget))
        .unwrap_or(deadline)
}

/// The budget of a shadow call, from the moment it is sent: a whole decision budget
/// (`[decisions] deadline`) of its own. Nobody waits for the shadow, so the caller's
/// grpc-timeout does not bound it; the budget only stops a stuck shadow version
/// from holding the task (and its row) forever.
pub fn shadow_budget(budget: Duration) -> Duration {
    budget
}

/// Which version answers: pinned by the request, the canary by its weight (when it
/// is ready and `draw()`, uniform in [0, 1), falls under the weight), else the
/// deployment's primary or the newest ready version.
pub fn route(
    deployment: Option<&Deployment>,
    pinned: Option<u64>,
    newest: Option<u64>,
    ready: impl Fn(u64) -> bool,
    draw: impl FnOnce() -> f64,
) -> (Option<u64>, Role) {
    if let Some(v) = pinned {
        return (Some(v), Role::Primary);
    }
    if let Some(c) = deployment.and_then(|d| d.canary.as_ref()) {
        if ready(c.version) && draw() < c.weight {
            return (Some(c.version), Role::Canary);
        }
    }
    (deployment.and_then(|d| d.primary).or(newest), Role::Primary)
}

/// The shadow version that gets a copy of this request: only requests the primary
/// answered unpinned are copied (a canary's or a pinned request is not the
/// traffic the shadow is compared against).
pub fn shadow_target(
    deployment: Option<&Deployment>,
    role: Role,
    pinned: Option<u64>,
) -> Option<u64> {
    let v = deployment.and_then(|d| d.shadow)?;
    (role == Role::Primary && pinned.is_none()).then_some(v)
}

/// Stage 4, the model call: the routed version, ending the fallback reserve before
/// the decision deadline. `call(version, deadline)` sends the row; a failure is
/// written to `reasons` and answers `None` (the fallbacks follow).
pub async fn call_routed<F, Fut>(
    model: &str,
    version: Option<u64>,
    deadline: Instant,
    budget: Duration,
    reasons: &mut Vec<String>,
    call: F,
) -> Option<ModelAnswer>
where
    F: FnOnce(u64, Instant) -> Fut,
    Fut: Future<Output = Result<ModelAnswer, RouterError>>,
{
    let Some(v) = version else {
        reasons.push(format!("model '{model}' has no ready version"));
        return None;
    };
    match call(v, model_call_deadline(deadline, budget)).await {
        Ok(a) => Some(a),
        Err(e) => {
            reasons.push(format!("model v{v}: {e}"));
            None
        }
    }
}

/// Fallback 1: the served versions below `routed` (all of them when nothing was
/// routed), newest first, while at least [`PREVIOUS_VERSION_MIN_LEFT`] is left;
/// each call ends [`PREVIOUS_VERSION_MARGIN`] before the deadline.
pub async fn previous_versions<F, Fut>(
    served: impl DoubleEndedIterator<Item = u64>,
    routed: Option<u64>,
    deadline: Instant,
    reasons: &mut Vec<String>,
    call: F,
) -> Option<ModelAnswer>
where
    F: Fn(u64, Instant) -> Fut,
    Fut: Future<Output = Result<ModelAnswer, RouterError>>,
{
    let below = routed.unwrap_or(u64::MAX);
    for v in served.rev().filter(|v| *v < below) {
        if Instant::now() + PREVIOUS_VERSION_MIN_LEFT >= deadline {
            break;
        }
        match call(v, deadline - PREVIOUS_VERSION_MARGIN).await {
            Ok(a) => return Some(a),
            Err(e) => reasons.push(format!("previous version v{v}: {e}")),
        }
    }
    None
}

/// Fallback 2: the precomputed score of the request's entity, only if fresh
/// (status PRESENT, i.e. within the view's max_age).
pub async fn batch_score(
    store: Option<&FeatureSource>,
    bs: Option<&BatchScore>,
    entities: &HashMap<String, pb::EntityKey>,
    deadline: Instant,
) -> Option<f32> {
    let (store, bs) = (store?, bs?);
    let view = store.view(&bs.view).ok()?;
    let key = entities.get(&view.join_key)?.key.clone()?;
    use pb::entity_key::Key;
    let col = match key {
        Key::Int64Key(k) => KeyColumn::Int64(vec![k]),
        Key::StringKey(k) => KeyColumn::String(vec![k]),
    };
    let name = format!("{}:{}", bs.view, bs.feature);
    let req = LookupRequest::new([name.clone()]).with_keys(view.join_key.clone(), col);
    let until = deadline.checked_sub(BATCH_SCORE_MARGIN).unwrap_or(deadline);
    let resp = store.lookup(req, until).await.ok()?;
    let c = resp.column(&name)?;
    if c.statuses.first() != Some(&FeatureStatus::Present) {
        return None;
    }
    let score = match &c.values {
        ColumnValues::F32(v) => v.first().copied(),
        ColumnValues::F64(v) => v.first().map(|x| *x as f32),
        _ => None,
    };
    // Same rule as a model's score: only a probability answers.
    score.filter(|s| (0.0..=1.0).contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::config::Canary;
    use crate::decide::testing::{self, answer};
    use std::sync::Mutex;

    fn deployment() -> Deployment {
        toml::from_str("model = \"m\"").unwrap()
    }

    #[test]
    fn reserve_is_a_fifth_of_the_budget_capped_at_five_ms() {
        assert_eq!(
            fallback_reserve(Duration::from_millis(10)),
            Duration::from_millis(2)
        );
        assert_eq!(
            fallback_reserve(Duration::from_millis(50)),
            FALLBACK_RESERVE_MAX
        );
        assert_eq!(
            fallback_reserve(Duration::from_secs(2)),
            Duration::from_millis(5)
        );
        let now = Instant::now();
        let d = now + Duration::from_millis(10);
        assert_eq!(
            model_call_deadline(d, Duration::from_millis(10)),
            now + Duration::from_millis(8)
        );
        assert_eq!(
            shadow_budget(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn route_pins_then_canary_then_primary_then_newest() {
        let mut d = deployment();
        // Pinned wins over everything and is the primary role.
        assert_eq!(
            route(Some(&d), Some(3), Some(9), |_| true, || 0.0),
            (Some(3), Role::Primary)
        );
        // No deployment: the newest ready version.
        assert_eq!(
            route(None, None, Some(9), |_| true, || 0.0),
            (Some(9), Role::Primary)
        );
        d.primary = Some(4);
        assert_eq!(
            route(Some(&d), None, Some(9), |_| true, || 0.0),
            (Some(4), Role::Primary)
        );
        d.canary = Some(Canary {
            version: 5,
            weight: 0.25,
        });
        assert_eq!(
            route(Some(&d), None, Some(9), |_| true, || 0.1),
            (Some(5), Role::Canary)
        );
        // A draw above the weight, or a canary that is not ready, goes to the primary.
        assert_eq!(
            route(Some(&d), None, Some(9), |_| true, || 0.3),
            (Some(4), Role::Primary)
        );
        assert_eq!(
            route(Some(&d), None, Some(9), |v| v != 5, || 0.0),
            (Some(4), Role::Primary)
        );
        // Nothing ready at all.
        assert_eq!(
            route(None, None, None, |_| true, || 0.0),
            (None, Role::Primary)
        );
    }

    #[test]
    fn shadow_copies_only_unpinned_primary_requests() {
        let mut d = deployment();
        assert_eq!(shadow_target(Some(&d), Role::Primary, None), None);
        d.shadow = Some(3);
        assert_eq!(shadow_target(Some(&d), Role::Primary, None), Some(3));
        assert_eq!(shadow_target(Some(&d), Role::Canary, None), None);
        assert_eq!(shadow_target(Some(&d), Role::Primary, Some(1)), None);
        assert_eq!(shadow_target(None, Role::Primary, None), None);
    }

    #[tokio::test]
    async fn routed_call_keeps_the_reserve_and_names_failures() {
        let deadline = Instant::now() + Duration::from_millis(10);
        let budget = Duration::from_millis(10);
        let seen = Mutex::new(None);
        let mut reasons = Vec::new();
        let a = call_routed("m", Some(2), deadline, budget, &mut reasons, |v, d| {
            *seen.lock().unwrap() = Some((v, d));
            async move { Ok(answer(v, 0.5)) }
        })
        .await;
        assert_eq!(a.unwrap().version, 2);
        assert_eq!(
            *seen.lock().unwrap(),
            Some((2, deadline - Duration::from_millis(2)))
        );
        assert!(reasons.is_empty());

        let a = call_routed("m", Some(2), deadline, budget, &mut reasons, |_, _| async {
            Err(RouterError::Internal("boom".into()))
        })
        .await;
        assert!(a.is_none());
        assert_eq!(reasons, vec!["model v2: boom".to_string()]);

        let mut reasons = Vec::new();
        let a = call_routed("m", None, deadline, budget, &mut reasons, |_, _| async {
            Ok(answer(9, 0.5))
        })
        .await;
        assert!(a.is_none());
        assert_eq!(reasons, vec!["model 'm' has no ready version".to_string()]);
    }

    #[tokio::test]
    async fn previous_versions_newest_first_below_the_routed_one() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let tried = Mutex::new(Vec::new());
        let mut reasons = Vec::new();
        // v3 was routed (and failed); v2 fails, v1 answers; v4 is never tried.
        let a = previous_versions(
            [1, 2, 3, 4].into_iter(),
            Some(3),
            deadline,
            &mut reasons,
            |v, d| {
                tried.lock().unwrap().push((v, d));
                async move {
                    if v == 2 {
                        Err(RouterError::Internal("down".into()))
                    } else {
                        Ok(answer(v, 0.1))
                    }
                }
            },
        )
        .await;
        assert_eq!(a.unwrap().version, 1);
        let tried = tried.into_inner().unwrap();
        assert_eq!(tried.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!(tried
            .iter()
            .all(|t| t.1 == deadline - PREVIOUS_VERSION_MARGIN));
        assert_eq!(reasons, vec!["previous version v2: down".to_string()]);

        // Nothing routed: every served version, newest first.
        let mut reasons = Vec::new();
        let order = Mutex::new(Vec::new());
        let a = previous_versions([1, 2].into_iter(), None, deadline, &mut reasons, |v, _| {
            order.lock().unwrap().push(v);
            async { Err(RouterError::Internal("x".into())) }
        })
        .await;
        assert!(a.is_none());
        assert_eq!(order.into_inner().unwrap(), vec![2, 1]);
        assert_eq!(reasons.len(), 2);
    }

    #[tokio::test]
    async fn previous_versions_are_not_tried_without_time_left() {
        let deadline = Instant::now() + PREVIOUS_VERSION_MIN_LEFT / 2;
        let mut reasons = Vec::new();
        let tried = Mutex::new(Vec::new());
        let a = previous_versions(
            [1, 2].into_iter(),
            Some(3),
            deadline,
            &mut reasons,
            |v, _| {
                tried.lock().unwrap().push(v);
                async move { Ok(answer(v, 0.5)) }
            },
        )
        .await;
        assert!(a.is_none());
        assert!(tried.into_inner().unwrap().is_empty());
        assert!(reasons.is_empty());
    }

    #[tokio::test]
    async fn batch_score_answers_only_a_fresh_score() {
        let (_dir, store) = testing::source();
        let bs: BatchScore = toml::from_str("view = \"fraud_scores\"").unwrap();
        let entities = |card| testing::request("r", 1.0, card).entities;
        let score = batch_score(
            Some(&store),
            Some(&bs),
            &entities(Some(7)),
            testing::later(),
        )
        .await;
        assert_eq!(score, Some(0.95));
        // Older than the view's max_age (1d): not an answer.
        assert_eq!(
            batch_score(
                Some(&store),
                Some(&bs),
                &entities(Some(8)),
                testing::later()
            )
            .await,
            None
        );
        // Unknown entity, no entity key, no batch_score configured, no store.
        assert_eq!(
            batch_score(
                Some(&store),
                Some(&bs),
                &entities(Some(9)),
                testing::later()
            )
            .await,
            None
        );
        assert_eq!(
            batch_score(Some(&store), Some(&bs), &entities(None), testing::later()).await,
            None
        );
        assert_eq!(
            batch_score(Some(&store), None, &entities(Some(7)), testing::later()).await,
            None
        );
        assert_eq!(
            batch_score(None, Some(&bs), &entities(Some(7)), testing::later()).await,
            None
        );
    }
}
