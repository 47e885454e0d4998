//! One balancer shared by every caller of a stack, without a task of its own.
//!
//! tower's `Retry` needs a `Clone` inner service and the p2c balancer is not
//! `Clone`. tower's `Buffer` solves that with a worker task that owns the
//! balancer: each call is sent to the worker over a channel, the worker picks a
//! replica and sends the call's future back. That is two thread wake-ups per
//! call (caller -> worker -> caller) on the path of every decision, for a step
//! that takes a few hundred nanoseconds.
//!
//! [`Shared`] keeps the balancer behind a mutex instead. A call takes the lock,
//! asks the balancer for a ready replica and dispatches to it (dispatch only
//! builds the replica's future; no model work happens under the lock), then
//! releases the lock and awaits the answer on the caller's own task.
//!
//! When no replica is ready, the caller waits: the balancer is polled with a
//! waker of its own that wakes every waiting caller ([`Notify::notify_waiters`]);
//! each then tries again. A caller registers as waiting before it polls the
//! balancer, so a replica that becomes ready between the poll and the wait
//! still wakes it. At most `capacity` callers wait at once; the next one is
//! refused at once with [`StackError::Overloaded`]. The wait is bounded by the
//! deadline layer above, which drops the call (and its registration) when the
//! request's deadline passes.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tower::Service;

use crate::error::{BoxError, StackError};

/// A service shared by its clones through a mutex; see the module docs.
pub struct Shared<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Shared {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    svc: Mutex<S>,
    /// Wakes every waiting caller; handed to the service's `poll_ready`.
    ready: Arc<Ready>,
    waker: Waker,
    /// Callers waiting for a ready replica now.
    waiting: AtomicUsize,
    capacity: usize,
}

/// The waker the shared service is polled with.
struct Ready(Notify);

impl Wake for Ready {
    fn wake(self: Arc<Self>) {
        self.0.notify_waiters();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_waiters();
    }
}

/// Counts a caller as waiting for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S> Shared<S> {
    /// Shares `svc`; at most `capacity` callers (at least 1) wait for it to be ready.
    pub fn new(svc: S, capacity: usize) -> Self {
        let ready = Arc::new(Ready(Notify::new()));
        Shared {
            inner: Arc::new(Inner {
                svc: Mutex::new(svc),
                waker: Waker::from(ready.clone()),
                ready,
                waiting: AtomicUsize::new(0),
                capacity: capacity.max(1),
            }),
        }
    }

    /// Callers waiting for a ready replica now.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Relaxed)
    }
}

impl<S, Req> Service<Req> for Shared<S>
where
    S: Service<Req> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
{
    type Response = S::Response;
    /// Boxed, as tower's `Buffer` answers: what the retry policy reads.
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    /// Always ready: the wait for a ready replica happens in the call's future,
    /// where the deadline layer bounds it.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let call = match inner.try_call(req) {
                Ok(dispatched) => dispatched.map_err(BoxError::from)?,
                Err(req) => inner.wait_and_call(req).await.map_err(BoxError::from)?,
            };
            call.await.map_err(Into::into)
        })
    }
}

impl<S> Inner<S> {
    /// Dispatches `req` if the service is ready now; hands it back if not.
    /// An error from `poll_ready` becomes the call's error.
    fn try_call<Req>(&self, req: Req) -> Result<Result<S::Future, StackError>, Req>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        let mut svc = self.svc.lock();
        match svc.poll_ready(&mut Context::from_waker(&self.waker)) {
            Poll::Ready(Ok(())) => Ok(Ok(svc.call(req))),
            Poll::Ready(Err(e)) => Ok(Err(StackError::from_boxed(e.into()))),
            Poll::Pending => Err(req),
        }
    }

    /// Waits until the service is ready (see the module docs), then dispatches.
    async fn wait_and_call<Req>(&self, mut req: Req) -> Result<S::Future, StackError>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(StackError::Overloaded {
                in_flight: self.capacity,
                what: "waiting for a ready replica",
            });
        }
        let _waiting = Waiting(&self.waiting);
        loop {
            // Registered before the poll: a wake between the poll and the
            // wait below completes this future (tokio's `Notified` counts
            // every `notify_waiters` from its creation on).
            let woken = self.ready.0.notified();
            match self.try_call(req) {
                Ok(dispatched) => return dispatched,
                Err(back) => req = back,
            }
            woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::ServiceExt;
    use tower_test::mock;

    use super::*;

    type Mock = mock::Mock<u32, u32>;
    type Handle = mock::Handle<u32, u32>;
    type Call = tokio::task::JoinHandle<Result<u32, BoxError>>;

    /// A shared mock that is not ready, and `calls` callers sent to it (0, 1, ...).
    fn not_ready(capacity: usize, calls: u32) -> (Shared<Mock>, Handle, Vec<Call>) {
        let (svc, mut handle) = mock::pair::<u32, u32>();
        handle.allow(0);
        let shared = Shared::new(svc, capacity);
        let calls = (0..calls)
            .map(|i| tokio::spawn(shared.clone().oneshot(i)))
            .collect();
        (shared, handle, calls)
    }

    /// Answers the next `n` requests that reach the mock with `f(request)`.
    async fn answer(handle: &mut Handle, n: u32, f: impl Fn(u32) -> u32) {
        for _ in 0..n {
            let (req, send) = handle.next_request().await.expect("a request");
            send.send_response(f(req));
        }
    }

    async fn until(what: impl Fn() -> bool) {
        for _ in 0..2000 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn callers_wait_for_a_ready_service_and_are_each_answered() {
        let (shared, mut handle, calls) = not_ready(8, 3);
        until(|| shared.waiting() == 3).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(20), handle.next_request())
                .await
                .is_err(),
            "nothing is dispatched to a service that is not ready"
        );
        handle.allow(3);
        answer(&mut handle, 3, |req| req * 10).await;
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await.unwrap().expect("answered"));
        }
        answers.sort();
        assert_eq!(answers, vec![0, 10, 20]);
        assert_eq!(shared.waiting(), 0);
    }

    #[tokio::test]
    async fn a_caller_past_the_capacity_is_refused_at_once() {
        let (shared, mut handle, waiting) = not_ready(2, 2);
        until(|| shared.waiting() == 2).await;
        let refused = shared.clone().oneshot(9).await.expect_err("refused");
        let refused = StackError::from_boxed(refused);
        assert!(
            matches!(refused, StackError::Overloaded { in_flight: 2, .. }),
            "{refused:?}"
        );
        assert_eq!(
            refused.to_string(),
            "overloaded: 2 model calls already waiting for a ready replica"
        );
        // A caller that gives up (its deadline passed) frees its place.
        waiting[0].abort();
        until(|| shared.waiting() == 1).await;
        let third = tokio::spawn(shared.clone().oneshot(3));
        until(|| shared.waiting() == 2).await;
        handle.allow(2);
        answer(&mut handle, 2, |req| req).await;
        assert_eq!(
            waiting.into_iter().nth(1).unwrap().await.unwrap().unwrap(),
            1
        );
        assert_eq!(third.await.unwrap().unwrap(), 3);
    }

    #[tokio::test]
    async fn an_error_from_readiness_fails_that_call_only() {
        let (svc, mut handle) = mock::pair::<u32, u32>();
        let shared: Shared<Mock> = Shared::new(svc, 8);
        handle.send_error("replica gone");
        let err = shared.clone().oneshot(1).await.expect_err("failed");
        assert!(err.to_string().contains("replica gone"), "{err}");
        handle.allow(1);
        let call = tokio::spawn(shared.clone().oneshot(2));
        answer(&mut handle, 1, |req| req + 1).await;
        assert_eq!(call.await.unwrap().unwrap(), 3);
    }

    /// Many callers on two threads, readiness granted one call at a time from
    /// another task: every caller is answered (a wake between a caller's poll
    /// and its wait is never lost).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_wake_is_lost_under_contention() {
        const CALLS: u32 = 400;
        let (_shared, mut handle, calls) = not_ready(CALLS as usize, CALLS);
        let server = tokio::spawn(async move {
            for _ in 0..CALLS {
                handle.allow(1);
                answer(&mut handle, 1, |req| req).await;
                tokio::task::yield_now().await;
            }
        });
        let all = async {
            let mut sum = 0u64;
            for c in calls {
                sum += u64::from(c.await.unwrap().expect("answered"));
            }
            sum
        };
        let sum = tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .expect("every caller answered");
        assert_eq!(sum, u64::from(CALLS * (CALLS - 1) / 2));
        server.await.unwrap();
    }
}
