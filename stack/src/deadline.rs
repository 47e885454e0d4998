//! Overall deadline: no answer leaves the stack after the request's deadline.
//!
//! The request carries its deadline ([`HasDeadline`]); the router sets it to
//! `min(arrival + grpc-timeout, arrival + [decisions] deadline)`.
//!
//! tower's `Timeout` times only the response future, not `poll_ready`. Here
//! the wait for readiness of everything below (a ready replica)
//! happens *inside* the timed future (`Oneshot` of a clone of the inner
//! service), so `poll_ready` of this layer is always ready and the deadline
//! covers the whole call. The deadline is checked before the inner future is
//! polled, so an answer that is ready exactly at (or after) the deadline is
//! not delivered: the caller gets [`StackError::DeadlineExceeded`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::util::Oneshot;
use tower::{Layer, Service};

use crate::error::{BoxError, StackError};

/// A request that knows when its answer stops being useful.
pub trait HasDeadline {
    /// The instant after which no answer may be delivered.
    fn deadline(&self) -> Instant;
}

/// A request paired with its deadline, for request types that do not carry one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithDeadline<T> {
    /// The request itself.
    pub inner: T,
    /// Its overall deadline.
    pub deadline: Instant,
}

impl<T> WithDeadline<T> {
    /// Pairs `inner` with `deadline`.
    pub fn new(inner: T, deadline: Instant) -> Self {
        WithDeadline { inner, deadline }
    }
}

impl<T> HasDeadline for WithDeadline<T> {
    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Builds [`Deadline`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

/// The deadline layer.
pub fn layer() -> DeadlineLayer {
    DeadlineLayer
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

/// Enforces each request's [`HasDeadline::deadline`].
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, Req> Service<Req> for Deadline<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: HasDeadline,
{
    type Response = S::Response;
    type Error = StackError;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        // Readiness of the inner service is awaited inside the response
        // future, under the deadline.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let deadline = req.deadline();
        let inner = if Instant::now() >= deadline {
            None // already late: do not even queue it
        } else {
            Some(Oneshot::new(self.inner.clone(), req))
        };
        ResponseFuture {
            inner,
            sleep: tokio::time::sleep_until(deadline),
        }
    }
}

pin_project! {
    /// Response future of [`Deadline`].
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        inner: Option<Oneshot<S, Req>>,
        #[pin]
        sleep: Sleep,
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, StackError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Deadline first: an answer that is ready only at the deadline is late.
        if this.sleep.poll(cx).is_ready() {
            return Poll::Ready(Err(StackError::DeadlineExceeded));
        }
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err(StackError::DeadlineExceeded));
        };
        inner.poll(cx).map_err(|e| StackError::from_boxed(e.into()))
    }
}
