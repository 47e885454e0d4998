//! Load shedding: at most `max_in_flight` model calls; the next one fails at
//! once with [`StackError::Overloaded`] (RESOURCE_EXHAUSTED in the router).
//!
//! This is tower's `ConcurrencyLimit` + `LoadShed` in one, over a shared
//! semaphore: `poll_ready` takes a permit if one is free and is always
//! `Ready`; `call` without a permit sheds. The permit lives in the response
//! future, so it is released when the call ends or is dropped. It is the
//! outermost layer: a shed request costs nothing and is never retried
//! (retrying overload only makes it worse).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::error::StackError;
use crate::metrics as m;

/// Builds [`Shed`]s; all services built by one layer share its limit.
#[derive(Debug, Clone)]
pub struct ShedLayer {
    semaphore: Arc<Semaphore>,
    limit: usize,
}

/// A shedding layer allowing `max_in_flight` calls at once.
pub fn layer(max_in_flight: usize) -> ShedLayer {
    ShedLayer {
        semaphore: Arc::new(Semaphore::new(max_in_flight)),
        limit: max_in_flight,
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            semaphore: self.semaphore.clone(),
            limit: self.limit,
            permit: None,
        }
    }
}

/// Sheds calls beyond the concurrency limit.
#[derive(Debug)]
pub struct Shed<S> {
    inner: S,
    semaphore: Arc<Semaphore>,
    limit: usize,
    /// Permit taken in `poll_ready` for the next `call`.
    permit: Option<OwnedSemaphorePermit>,
}

impl<S: Clone> Clone for Shed<S> {
    fn clone(&self) -> Self {
        Shed {
            inner: self.inner.clone(),
            semaphore: self.semaphore.clone(),
            limit: self.limit,
            permit: None, // permits are not cloned
        }
    }
}

impl<S> Shed<S> {
    /// Calls in flight right now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.semaphore.available_permits()
    }
}

impl<S, Req> Service<Req> for Shed<S>
where
    S: Service<Req>,
    S::Error: Into<StackError>,
{
    type Response = S::Response;
    type Error = StackError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        if self.permit.is_none() {
            self.permit = self.semaphore.clone().try_acquire_owned().ok();
        }
        if self.permit.is_none() {
            // Saturated: ready, so that `call` can shed.
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.permit.take() {
            Some(permit) => ResponseFuture {
                inner: Some(self.inner.call(req)),
                _permit: Some(permit),
                limit: self.limit,
            },
            None => {
                metrics::counter!(m::SHED_TOTAL).increment(1);
                tracing::debug!(limit = self.limit, "model call shed");
                ResponseFuture {
                    inner: None,
                    _permit: None,
                    limit: self.limit,
                }
            }
        }
    }
}

pin_project! {
    /// Response future of [`Shed`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        _permit: Option<OwnedSemaphorePermit>,
        limit: usize,
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
        match this.inner.as_pin_mut() {
            Some(f) => f.poll(cx).map_err(Into::into),
            None => Poll::Ready(Err(StackError::Overloaded {
                in_flight: *this.limit,
                what: "in flight",
            })),
        }
    }
}
