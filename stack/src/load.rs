//! Failure-aware peak-EWMA load, the metric p2c compares.
//!
//! Like tower's `PeakEwma` (which this follows): each replica keeps a latency
//! estimate that jumps to every new peak and otherwise decays towards recent
//! observations over `decay`; its load is `estimate * (in_flight + 1)`.
//!
//! One difference: a failed call is observed as taking at least
//! `failure_penalty` (the per-try timeout), however fast it failed. With
//! plain `PeakEwma` a replica that fails instantly looks *fast*, so p2c keeps
//! choosing it, and a retry lands on the replica that just failed half the
//! time. With the penalty, the retry goes to the other replica, and the
//! penalty fades with the same decay as any latency peak, so the replica
//! gets traffic again later (its breaker decides whether it is usable at
//! all). The estimate uses tokio's clock, so paused-time tests are exact.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::load::Load;
use tower::{Layer, Service};

/// The latency estimate, as a plain type.
#[derive(Debug, Clone, Copy)]
pub struct PeakEwma {
    rtt_ns: f64,
    updated_at: Instant,
    decay_ns: f64,
}

impl PeakEwma {
    /// An estimate starting at `default_rtt`.
    pub fn new(default_rtt: Duration, decay: Duration, now: Instant) -> Self {
        PeakEwma {
            rtt_ns: default_rtt.as_nanos() as f64,
            updated_at: now,
            decay_ns: (decay.as_nanos() as f64).max(1.0),
        }
    }

    /// Records an observed latency at `now`; returns the new estimate (ns).
    pub fn observe(&mut self, rtt: Duration, now: Instant) -> f64 {
        let rtt = rtt.as_nanos() as f64;
        if rtt > self.rtt_ns {
            self.rtt_ns = rtt; // peak: jump at once
        } else {
            let elapsed = now.saturating_duration_since(self.updated_at).as_nanos() as f64;
            let decay = (-elapsed / self.decay_ns).exp();
            self.rtt_ns = self.rtt_ns * decay + rtt * (1.0 - decay);
        }
        self.updated_at = now;
        self.rtt_ns
    }

    /// The estimate at `now`, decayed towards zero since the last update.
    pub fn estimate(&mut self, now: Instant) -> f64 {
        self.observe(Duration::ZERO, now)
    }
}

/// Load of one replica; lower is better.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Cost(pub f64);

#[derive(Debug)]
struct Shared {
    ewma: Mutex<PeakEwma>,
    failure_penalty: Duration,
}

/// Builds [`Measured`] services.
#[derive(Debug, Clone, Copy)]
pub struct MeasuredLayer {
    default_rtt: Duration,
    decay: Duration,
    failure_penalty: Duration,
}

/// A load-measuring layer: estimates start at `default_rtt`, peaks decay over
/// `decay`, failures count as taking at least `failure_penalty`.
pub fn layer(default_rtt: Duration, decay: Duration, failure_penalty: Duration) -> MeasuredLayer {
    MeasuredLayer {
        default_rtt,
        decay,
        failure_penalty,
    }
}

impl<S> Layer<S> for MeasuredLayer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            shared: Arc::new(Shared {
                ewma: Mutex::new(PeakEwma::new(self.default_rtt, self.decay, Instant::now())),
                failure_penalty: self.failure_penalty,
            }),
        }
    }
}

/// A replica service with a [`Load`] for p2c.
#[derive(Debug)]
pub struct Measured<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Load for Measured<S> {
    type Metric = Cost;

    fn load(&self) -> Cost {
        // Every in-flight call holds a clone of `shared`.
        let in_flight = Arc::strong_count(&self.shared) - 1;
        let estimate = self.shared.ewma.lock().estimate(Instant::now());
        Cost(estimate * (in_flight as f64 + 1.0))
    }
}

impl<S, Req> Service<Req> for Measured<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
            handle: Some(Handle {
                shared: self.shared.clone(),
                sent_at: Instant::now(),
                failed: false,
            }),
        }
    }
}

/// Records the call's latency when dropped (also when cancelled).
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
    sent_at: Instant,
    failed: bool,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut rtt = now.saturating_duration_since(self.sent_at);
        if self.failed {
            rtt = rtt.max(self.shared.failure_penalty);
        }
        self.shared.ewma.lock().observe(rtt, now);
    }
}

pin_project! {
    /// Response future of [`Measured`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        handle: Option<Handle>,
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Some(mut h) = this.handle.take() {
            h.failed = result.is_err();
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_jump_and_decay() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(Duration::from_millis(5), Duration::from_secs(10), t0);
        assert_eq!(e.observe(Duration::from_millis(30), t0), 30e6);
        // Ten seconds later a fast answer pulls it down by 1 - 1/e.
        let est = e.observe(Duration::ZERO, t0 + Duration::from_secs(10));
        assert!((est - 30e6 / std::f64::consts::E).abs() < 1.0, "{est}");
        // A lower observation with no time elapsed changes nothing.
        let est2 = e.observe(Duration::ZERO, t0 + Duration::from_secs(10));
        assert_eq!(est, est2);
    }
}
