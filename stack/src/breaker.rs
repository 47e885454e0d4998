//! Per-replica circuit breaker middleware.
//!
//! The decisions live in [`BreakerState`]; this file only wires them to
//! `poll_ready`/`call`, timers, logs and metrics.
//!
//! How it cooperates with p2c: the balancer only picks replicas whose
//! `poll_ready` returned `Ready`, and re-checks readiness of the one it picked
//! just before dispatching. So an Open breaker returns `Pending` from
//! `poll_ready` (with a timer that wakes the balancer when the backoff ends),
//! and a HalfOpen breaker is `Ready` only until its one probe is dispatched.
//! It never returns an error from `poll_ready`: the balancer would drop the
//! replica for good. A replica whose own `poll_ready` fails trips the breaker
//! instead. Should a call still arrive while the breaker is not admitting (it
//! opened between `poll_ready` and `call`), it fails fast with
//! [`StackError::BreakerOpen`], which the retry layer may retry elsewhere.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::breaker_state::{Admission, BreakerPhase, BreakerState, Outcome, Transition};
use crate::config::BreakerConfig;
use crate::error::StackError;
use crate::metrics as m;
use crate::ReplicaId;

/// State shared by a [`Breaker`], its response futures and the registry.
#[derive(Debug)]
struct Shared {
    replica: ReplicaId,
    state: Mutex<BreakerState>,
    /// Woken when the probe finishes (the balancer is waiting on it).
    waker: AtomicWaker,
    registry: BreakerRegistry,
}

impl Shared {
    /// Logs and exports a transition, and wakes whoever waits on this breaker.
    fn apply(&self, t: Option<Transition>) {
        let Some(t) = t else { return };
        let replica = self.replica.as_str();
        match t.to {
            BreakerPhase::Open => tracing::warn!(
                replica,
                from = t.from.as_str(),
                backoff_ms = t.backoff.map(|d| d.as_millis() as u64),
                "circuit breaker opened"
            ),
            BreakerPhase::HalfOpen => {
                tracing::info!(
                    replica,
                    "circuit breaker half-open: letting one probe through"
                )
            }
            BreakerPhase::Closed => tracing::info!(replica, "circuit breaker closed"),
        }
        metrics::gauge!(m::BREAKER_STATE, "replica" => self.replica.to_string())
            .set(t.to.gauge_value());
        metrics::counter!(
            m::BREAKER_TRANSITIONS_TOTAL,
            "replica" => self.replica.to_string(),
            "to" => t.to.as_str()
        )
        .increment(1);
        self.waker.wake();
        self.registry.notify();
    }

    fn record(&self, probe: bool, outcome: Outcome) {
        let t = self.state.lock().record(Instant::now(), probe, outcome);
        if probe {
            // The probe slot is free again (or the state changed): re-poll.
            self.waker.wake();
        }
        self.apply(t);
    }
}

/// The set of live breakers of one stack: lets the fail-fast gate see whether
/// any replica can take a request, and the router report breaker states.
#[derive(Debug, Clone, Default)]
pub struct BreakerRegistry {
    inner: Arc<RegistryInner>,
}

#[derive(Debug, Default)]
struct RegistryInner {
    breakers: Mutex<Vec<Weak<Shared>>>,
    /// The fail-fast gate, waiting for a breaker to change state.
    waker: AtomicWaker,
}

impl BreakerRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn register(&self, shared: &Arc<Shared>) {
        let mut v = self.inner.breakers.lock();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(shared));
    }

    fn live(&self) -> Vec<Arc<Shared>> {
        let mut v = self.inner.breakers.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }

    /// Number of replicas whose breaker is alive (i.e. in the balancer).
    pub fn len(&self) -> usize {
        self.live().len()
    }

    /// Whether no replica is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether at least one replica's breaker would let a request through now.
    pub fn any_admitting(&self, now: Instant) -> bool {
        self.live().iter().any(|s| s.state.lock().would_admit(now))
    }

    /// The state of every live breaker, sorted by replica id.
    pub fn states(&self) -> Vec<(ReplicaId, BreakerPhase)> {
        let mut v: Vec<_> = self
            .live()
            .iter()
            .map(|s| (s.replica.clone(), s.state.lock().phase()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Registers the task to wake on the next breaker transition.
    pub(crate) fn register_waker(&self, cx: &Context<'_>) {
        self.inner.waker.register(cx.waker());
    }

    fn notify(&self) {
        self.inner.waker.wake();
    }
}

/// Builds [`Breaker`]s for one replica.
#[derive(Debug, Clone)]
pub struct BreakerLayer {
    replica: ReplicaId,
    cfg: BreakerConfig,
    registry: BreakerRegistry,
}

/// A breaker layer for `replica`, registered in `registry`.
pub fn layer(replica: ReplicaId, cfg: BreakerConfig, registry: BreakerRegistry) -> BreakerLayer {
    BreakerLayer {
        replica,
        cfg,
        registry,
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        let shared = Arc::new(Shared {
            replica: self.replica.clone(),
            state: Mutex::new(BreakerState::new(self.cfg.clone())),
            waker: AtomicWaker::new(),
            registry: self.registry.clone(),
        });
        self.registry.register(&shared);
        metrics::gauge!(m::BREAKER_STATE, "replica" => self.replica.to_string())
            .set(BreakerPhase::Closed.gauge_value());
        // Transition counters exist at zero from the start, so rate()/increase() see
        // the first transition (a counter born at 1 has no increase).
        for to in [
            BreakerPhase::Closed,
            BreakerPhase::Open,
            BreakerPhase::HalfOpen,
        ] {
            metrics::counter!(
                m::BREAKER_TRANSITIONS_TOTAL,
                "replica" => self.replica.to_string(),
                "to" => to.as_str()
            )
            .increment(0);
        }
        Breaker {
            inner,
            shared,
            sleep: None,
        }
    }
}

/// Circuit breaker in front of one replica. Not `Clone`: one per replica.
#[derive(Debug)]
pub struct Breaker<S> {
    inner: S,
    shared: Arc<Shared>,
    /// Wakes the balancer when an Open breaker's backoff ends.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> Breaker<S> {
    /// Current state of this breaker.
    pub fn phase(&self) -> BreakerPhase {
        self.shared.state.lock().phase()
    }
}

impl<S, Req> Service<Req> for Breaker<S>
where
    S: Service<Req>,
    S::Error: Into<StackError>,
{
    type Response = S::Response;
    type Error = StackError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        loop {
            let now = Instant::now();
            let (admission, t) = self.shared.state.lock().check(now);
            self.shared.apply(t);
            match admission {
                Admission::Normal | Admission::Probe => match self.inner.poll_ready(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Ok(())),
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => {
                        let e: StackError = e.into();
                        tracing::warn!(
                            replica = self.shared.replica.as_str(),
                            error = %e,
                            "replica readiness failed; opening its breaker"
                        );
                        let t = self.shared.state.lock().trip(now);
                        self.shared.apply(t);
                        // Loop: now Open, so we wait for the backoff.
                    }
                },
                Admission::Rejected { until: Some(until) } => {
                    let sleep = match &mut self.sleep {
                        Some(s) => {
                            if s.deadline() != until {
                                s.as_mut().reset(until);
                            }
                            s
                        }
                        None => self.sleep.insert(Box::pin(tokio::time::sleep_until(until))),
                    };
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Backoff over: loop to go half-open.
                }
                Admission::Rejected { until: None } => {
                    // The probe is in flight: wait for its outcome.
                    self.shared.waker.register(cx.waker());
                    // Re-check after registering, so an outcome recorded in
                    // between is not missed; otherwise loop (e.g. to set the
                    // timer of a re-opened breaker).
                    if self.shared.state.lock().probe_in_flight() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (admission, t) = self.shared.state.lock().start_call(Instant::now());
        self.shared.apply(t);
        let probe = match admission {
            Admission::Normal => false,
            Admission::Probe => {
                tracing::debug!(replica = self.shared.replica.as_str(), "sending probe");
                true
            }
            Admission::Rejected { .. } => {
                return ResponseFuture {
                    inner: None,
                    rejected: Some(StackError::BreakerOpen(self.shared.replica.clone())),
                    guard: Guard {
                        shared: self.shared.clone(),
                        probe: false,
                        done: true,
                    },
                }
            }
        };
        ResponseFuture {
            inner: Some(self.inner.call(req)),
            rejected: None,
            guard: Guard {
                shared: self.shared.clone(),
                probe,
                done: false,
            },
        }
    }
}

/// Records `Abandoned` if the future is dropped before it finished.
#[derive(Debug)]
struct Guard {
    shared: Arc<Shared>,
    probe: bool,
    done: bool,
}

impl Guard {
    fn finish(&mut self, outcome: Outcome) {
        if !self.done {
            self.done = true;
            self.shared.record(self.probe, outcome);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.finish(Outcome::Abandoned);
    }
}

pin_project! {
    /// Response future of [`Breaker`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        rejected: Option<StackError>,
        guard: Guard,
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<StackError>,
{
    type Output = Result<T, StackError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(e) = this.rejected.take() {
            return Poll::Ready(Err(e));
        }
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err(StackError::Internal(
                "breaker future polled after completion".into(),
            )));
        };
        let result = std::task::ready!(inner.poll(cx)).map_err(Into::into);
        let outcome = match &result {
            Ok(_) => Outcome::Success,
            Err(e) if e.counts_against_replica() => Outcome::Failure,
            Err(_) => Outcome::Neutral,
        };
        this.guard.finish(outcome);
        Poll::Ready(result)
    }
}
