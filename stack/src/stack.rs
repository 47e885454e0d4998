//! The model-call stack, composed in one place.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

use crate::breaker::BreakerRegistry;
use crate::breaker_state::BreakerPhase;
use crate::budget::RetryBudget;
use crate::config::StackConfig;
use crate::deadline::HasDeadline;
use crate::discover::{replica_set, EndpointBuilder, ReplicaUpdates};
use crate::error::StackError;
use crate::shared::Shared;
use crate::{balance, deadline, fail_fast, retry, shed, ReplicaId};

/// The composed stack: a cheap-to-clone, `Send + Sync` service.
pub struct ModelCallStack<Req, Res> {
    svc: BoxCloneSyncService<Req, Res, StackError>,
    registry: BreakerRegistry,
    budget: Arc<RetryBudget>,
}

impl<Req, Res> Clone for ModelCallStack<Req, Res> {
    fn clone(&self) -> Self {
        ModelCallStack {
            svc: self.svc.clone(),
            registry: self.registry.clone(),
            budget: self.budget.clone(),
        }
    }
}

impl<Req, Res> std::fmt::Debug for ModelCallStack<Req, Res> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCallStack")
            .field("breakers", &self.registry.states())
            .finish_non_exhaustive()
    }
}

impl<Req, Res> ModelCallStack<Req, Res> {
    /// Breaker state of every replica, sorted by id (for `/readyz` and tests).
    pub fn breaker_states(&self) -> Vec<(ReplicaId, BreakerPhase)> {
        self.registry.states()
    }

    /// Whether some replica would take a request now.
    pub fn any_replica_available(&self) -> bool {
        self.registry.any_admitting(Instant::now())
    }

    /// Retries the budget would grant right now.
    pub fn retry_budget_available(&self) -> u64 {
        self.budget.available(Instant::now())
    }
}

impl<Req, Res> Service<Req> for ModelCallStack<Req, Res> {
    type Response = Res;
    type Error = StackError;
    type Future = futures::future::BoxFuture<'static, Result<Res, StackError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        self.svc.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.svc.call(req)
    }
}

/// What [`model_call_stack_with_updates`] returns.
pub type StackWithUpdates<S, Req> = (
    ModelCallStack<Req, <S as Service<Req>>::Response>,
    ReplicaUpdates<S>,
);

/// Builds the stack over the replicas of one model version.
///
/// Must be called inside a tokio runtime (the breakers' timers are tokio's).
/// The request type carries its deadline and is cloned for retries (make it
/// cheap to clone, e.g. tensors behind an `Arc`). Replica errors convert into
/// [`StackError`], which is where the router says what kind of failure a
/// replica's error is.
pub fn model_call_stack<S, Req>(
    replicas: Vec<(ReplicaId, S)>,
    cfg: &StackConfig,
) -> Result<ModelCallStack<Req, S::Response>, StackError>
where
    S: Service<Req> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<StackError> + Send + 'static,
    Req: HasDeadline + Clone + Send + Sync + 'static,
{
    model_call_stack_with_updates(replicas, cfg).map(|(stack, _)| stack)
}

/// Like [`model_call_stack`], and also returns the handle that adds and
/// removes replicas later.
pub fn model_call_stack_with_updates<S, Req>(
    replicas: Vec<(ReplicaId, S)>,
    cfg: &StackConfig,
) -> Result<StackWithUpdates<S, Req>, StackError>
where
    S: Service<Req> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<StackError> + Send + 'static,
    Req: HasDeadline + Clone + Send + Sync + 'static,
{
    cfg.validate()?;
    let registry = BreakerRegistry::new();
    let budget = Arc::new(RetryBudget::new(&cfg.retry_budget, Instant::now()));

    // Per replica, outside in (see `discover::Endpoint`):
    //   load metric -> circuit breaker -> per-try timeout -> replica service
    // The breaker sits above the per-try timeout so timeouts count as
    // failures; the load metric is outermost so p2c sees every call.
    let (replicas, updates) = replica_set(replicas, EndpointBuilder::new(cfg, registry.clone()));

    // The balanced half, outside in:
    //   fail-fast gate -> p2c balance over the replicas
    // shared by every clone of the stack (`shared::Shared`: a mutex, no task
    // of its own), because retry needs a Clone inner service and p2c is not
    // Clone. The fail-fast gate turns "no replica can take it" into a failed
    // call instead of a wait until the deadline.
    let balanced = ServiceBuilder::new()
        .layer(fail_fast::layer(registry.clone()))
        .layer(balance::layer::<Req>(cfg.balance_seed))
        .service(replicas);
    let shared = Shared::new(balanced, cfg.effective_buffer_capacity());

    // The whole stack, outside in:
    //   shed      - at most max_in_flight calls, else Overloaded at once; never
    //               retried, costs nothing
    //   deadline  - nothing is answered after the request's deadline; it also
    //               bounds the wait for a ready replica, which tower's
    //               Timeout would not
    //   retry     - retryable errors only, at most 3 attempts, only before the
    //               deadline, only within the retry budget; each retry goes
    //               back through p2c, so usually to another replica
    //   [shared -> fail-fast -> p2c -> breaker -> per-try timeout -> replica]
    let svc = ServiceBuilder::new()
        .layer(shed::layer(cfg.max_in_flight))
        .layer(deadline::layer())
        .layer(retry::layer(budget.clone(), cfg))
        .service(shared);

    Ok((
        ModelCallStack {
            svc: BoxCloneSyncService::new(svc),
            registry,
            budget,
        },
        updates,
    ))
}
