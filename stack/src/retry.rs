//! Retries with a budget: tower's `Retry` driven by [`RetryPolicy`].
//!
//! A failed attempt is retried only if all of these hold:
//!
//! 1. the error is retryable ([`RetryPolicy::is_retryable`]): per-try timeout,
//!    breaker open, replica overloaded or unavailable, and model faults only
//!    when `retry_model_faults` is set. Never the stack's own shedding,
//!    deadline or "no replica" errors;
//! 2. fewer than `max_attempts` (at most 3) attempts were made;
//! 3. the request's deadline has not passed;
//! 4. the shared [`RetryBudget`] grants a retry (each original request
//!    deposits, each retry withdraws).
//!
//! The retry is sent at once, back through the p2c balancer, which usually
//! picks another replica (the failed one is loaded or its breaker is open).
//! The layer sits under the deadline layer, so a retry can never outlive the
//! request's deadline, and over the balancer, which is shared through
//! [`crate::shared::Shared`] because tower's `Retry` needs a `Clone` inner
//! service.

use std::sync::Arc;

use tokio::time::Instant;
use tower::retry::{Policy, RetryLayer};

use crate::budget::RetryBudget;
use crate::config::StackConfig;
use crate::deadline::HasDeadline;
use crate::error::{BoxError, StackError};
use crate::metrics as m;

/// Per-request retry policy; clones share the budget, each request session
/// gets its own attempt count (tower clones the policy per request).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    budget: Arc<RetryBudget>,
    max_attempts: u32,
    retry_model_faults: bool,
    /// Attempts made so far in this request session (1 = first try).
    attempts: u32,
}

impl RetryPolicy {
    /// A policy with the limits of `cfg` drawing on `budget`.
    pub fn new(budget: Arc<RetryBudget>, cfg: &StackConfig) -> Self {
        RetryPolicy {
            budget,
            max_attempts: cfg.max_attempts.clamp(1, crate::config::MAX_ATTEMPTS_CAP),
            retry_model_faults: cfg.retry_model_faults,
            attempts: 1,
        }
    }

    /// Whether an error of this class may be retried at all.
    pub fn is_retryable(&self, err: &StackError) -> bool {
        match err {
            StackError::TryTimeout { .. }
            | StackError::BreakerOpen(_)
            | StackError::ReplicaOverloaded(_)
            | StackError::ReplicaUnavailable(_) => true,
            StackError::ModelFault(_) => self.retry_model_faults,
            StackError::Overloaded { .. }
            | StackError::DeadlineExceeded
            | StackError::NoReplica(_)
            | StackError::Internal(_)
            | StackError::InvalidConfig(_) => false,
        }
    }

    /// The decision for a failed attempt of a request due at `deadline`.
    /// Takes a retry from the budget when it says yes.
    pub fn should_retry(&mut self, err: &StackError, deadline: Instant, now: Instant) -> bool {
        if !self.is_retryable(err) || self.attempts >= self.max_attempts || now >= deadline {
            return false;
        }
        if !self.budget.try_withdraw(now) {
            metrics::counter!(m::RETRY_BUDGET_EXHAUSTED_TOTAL).increment(1);
            tracing::debug!(error = %err, "retry budget exhausted; not retrying");
            return false;
        }
        self.attempts += 1;
        metrics::counter!(m::RETRIES_TOTAL, "reason" => err.label()).increment(1);
        tracing::debug!(error = %err, attempt = self.attempts, "retrying model call");
        true
    }
}

impl<Req, Res> Policy<Req, Res, BoxError> for RetryPolicy
where
    Req: HasDeadline + Clone,
{
    type Future = std::future::Ready<()>;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Self::Future> {
        let Err(err) = result else { return None };
        let err = err.downcast_ref::<StackError>()?;
        self.should_retry(err, req.deadline(), Instant::now())
            .then(|| std::future::ready(()))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        // tower calls this on the service's policy for each new request (where
        // `attempts` is always 1) and on the request's own clone after each
        // retry (where it is > 1).
        if self.attempts == 1 {
            self.budget.deposit(Instant::now());
        }
        (self.attempts < self.max_attempts).then(|| req.clone())
    }
}

/// The retry layer.
pub fn layer(budget: Arc<RetryBudget>, cfg: &StackConfig) -> RetryLayer<RetryPolicy> {
    RetryLayer::new(RetryPolicy::new(budget, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RetryBudgetConfig;
    use crate::ReplicaId;
    use std::time::Duration;

    fn policy(ratio: f64, floor: u32) -> RetryPolicy {
        let cfg = StackConfig {
            retry_budget: RetryBudgetConfig {
                ratio,
                min_per_sec: floor,
                ttl: Duration::from_secs(10),
            },
            ..StackConfig::default()
        };
        RetryPolicy::new(
            Arc::new(RetryBudget::new(&cfg.retry_budget, Instant::now())),
            &cfg,
        )
    }

    #[test]
    fn at_most_three_attempts() {
        let mut p = policy(1.0, 100);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let e = StackError::BreakerOpen(ReplicaId::from("a"));
        assert!(p.should_retry(&e, later, now));
        assert!(p.should_retry(&e, later, now));
        assert!(!p.should_retry(&e, later, now));
    }

    #[test]
    fn not_after_the_deadline() {
        let mut p = policy(1.0, 100);
        let now = Instant::now();
        let e = StackError::ReplicaUnavailable("down".into());
        assert!(!p.should_retry(&e, now, now));
    }

    #[test]
    fn only_retryable_errors() {
        let mut p = policy(1.0, 100);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert!(!p.should_retry(
            &StackError::Overloaded {
                in_flight: 1,
                what: "in flight"
            },
            later,
            now
        ));
        assert!(!p.should_retry(&StackError::DeadlineExceeded, later, now));
        assert!(!p.should_retry(&StackError::NoReplica("x"), later, now));
        assert!(!p.should_retry(&StackError::ModelFault("nan".into()), later, now));
        assert!(p.should_retry(&StackError::ReplicaOverloaded("q".into()), later, now));
    }

    #[test]
    fn not_when_the_budget_is_spent() {
        let mut p = policy(0.0, 0);
        let now = Instant::now();
        let e = StackError::ReplicaUnavailable("down".into());
        assert!(!p.should_retry(&e, now + Duration::from_secs(1), now));
    }
}
