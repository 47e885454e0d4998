//! Per-try timeout: bounds one attempt on one replica.
//!
//! Like tower's `Timeout`, this times the response future only, not
//! `poll_ready`: waiting for a replica to become ready happens in the
//! balancer, which picks another replica meanwhile, and the overall deadline
//! layer bounds the wait. A timeout is a [`StackError::TryTimeout`], which
//! counts against the replica's breaker (the breaker sits above this layer)
//! and is retryable (the retry layer sends the request to another replica).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service};

use crate::error::StackError;
use crate::ReplicaId;

/// Builds [`TryTimeout`]s.
#[derive(Debug, Clone)]
pub struct TryTimeoutLayer {
    replica: ReplicaId,
    timeout: Duration,
}

/// A per-try timeout of `timeout` for calls to `replica`.
pub fn layer(replica: ReplicaId, timeout: Duration) -> TryTimeoutLayer {
    TryTimeoutLayer { replica, timeout }
}

impl<S> Layer<S> for TryTimeoutLayer {
    type Service = TryTimeout<S>;

    fn layer(&self, inner: S) -> TryTimeout<S> {
        TryTimeout {
            inner,
            replica: self.replica.clone(),
            timeout: self.timeout,
        }
    }
}

/// Fails a call with [`StackError::TryTimeout`] if it takes longer than the
/// per-try timeout.
#[derive(Debug, Clone)]
pub struct TryTimeout<S> {
    inner: S,
    replica: ReplicaId,
    timeout: Duration,
}

impl<S, Req> Service<Req> for TryTimeout<S>
where
    S: Service<Req>,
    S::Error: Into<StackError>,
{
    type Response = S::Response;
    type Error = StackError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
            sleep: tokio::time::sleep(self.timeout),
            replica: Some(self.replica.clone()),
            timeout: self.timeout,
        }
    }
}

pin_project! {
    /// Response future of [`TryTimeout`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Sleep,
        replica: Option<ReplicaId>,
        timeout: Duration,
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
        if let Poll::Ready(r) = this.inner.poll(cx) {
            return Poll::Ready(r.map_err(Into::into));
        }
        std::task::ready!(this.sleep.poll(cx));
        let replica = this.replica.take().unwrap_or_else(|| ReplicaId::from("?"));
        tracing::debug!(
            replica = replica.as_str(),
            timeout_ms = this.timeout.as_millis() as u64,
            "per-try timeout"
        );
        Poll::Ready(Err(StackError::TryTimeout {
            replica,
            timeout: *this.timeout,
        }))
    }
}
