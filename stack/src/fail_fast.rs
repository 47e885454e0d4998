//! Fail fast when no replica can take a request.
//!
//! The p2c balancer returns `Pending` from `poll_ready` while no replica is
//! ready, and requests would wait for it until their deadline. That is
//! right when replicas are merely busy, wrong when every replica's breaker is
//! open (or there is no replica): then this gate becomes ready and fails the
//! call at once with [`StackError::NoReplica`] (UNAVAILABLE), so the router
//! can fall back immediately. It keeps polling the balancer, and every breaker
//! transition wakes it, so it stops failing as soon as a breaker lets a probe
//! through.
//!
//! It never returns an error from `poll_ready`: an error from the balancer is
//! turned into a failed call instead, with the stack's own error type.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::breaker::BreakerRegistry;
use crate::error::{BoxError, StackError};
use crate::metrics as m;

/// Builds [`FailFast`]s.
#[derive(Debug, Clone)]
pub struct FailFastLayer {
    registry: BreakerRegistry,
}

/// A fail-fast gate watching the breakers in `registry`.
pub fn layer(registry: BreakerRegistry) -> FailFastLayer {
    FailFastLayer { registry }
}

impl<S> Layer<S> for FailFastLayer {
    type Service = FailFast<S>;

    fn layer(&self, inner: S) -> FailFast<S> {
        FailFast {
            inner,
            registry: self.registry.clone(),
            failing: None,
        }
    }
}

/// Gate in front of the balancer; see the module docs.
#[derive(Debug)]
pub struct FailFast<S> {
    inner: S,
    registry: BreakerRegistry,
    /// Set when the next call must fail instead of reaching the balancer.
    failing: Option<StackError>,
}

impl<S, Req> Service<Req> for FailFast<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.failing.is_some() {
            return Poll::Ready(Ok(()));
        }
        // Register first, so a transition between the checks below wakes us.
        self.registry.register_waker(cx);
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                let e = StackError::from_boxed(e.into());
                tracing::error!(error = %e, "balancer failed; failing the call");
                self.failing = Some(StackError::NoReplica("balancer failed"));
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let reason = if self.registry.is_empty() {
                    "no replicas configured"
                } else if !self.registry.any_admitting(Instant::now()) {
                    "all circuit breakers open"
                } else {
                    return Poll::Pending; // replicas are busy: wait
                };
                self.failing = Some(StackError::NoReplica(reason));
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.failing.take() {
            Some(e) => {
                metrics::counter!(m::NO_REPLICA_TOTAL).increment(1);
                tracing::debug!(error = %e, "failing fast");
                ResponseFuture {
                    inner: None,
                    error: Some(e),
                }
            }
            None => ResponseFuture {
                inner: Some(self.inner.call(req)),
                error: None,
            },
        }
    }
}

pin_project! {
    /// Response future of [`FailFast`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        error: Option<StackError>,
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(f) => f.poll(cx).map_err(Into::into),
            None => {
                Poll::Ready(Err(Box::new(this.error.take().unwrap_or(
                    StackError::Internal("fail-fast future polled twice".into()),
                ))))
            }
        }
    }
}
