//! A global budget of request bytes in flight. Every request body, on both ports,
//! draws its bytes from one pool (`[server] max_inflight_bytes`) as they arrive and
//! gives them back when the body is dropped (after decoding). When the pool is
//! empty the request is refused (RESOURCE_EXHAUSTED over gRPC, 503 over HTTP)
//! instead of buffering more: many large requests at once cannot take the process
//! past its memory.
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Bytes, HttpBody};
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Metric: request bytes currently held by bodies being read.
pub const INFLIGHT_BYTES: &str = "mesh_router_inflight_request_bytes";
/// Metric: requests refused because the pool was empty.
pub const REFUSED: &str = "mesh_router_inflight_budget_refused_total";

/// The shared pool.
#[derive(Clone)]
pub struct InFlightBytes {
    sem: Arc<Semaphore>,
    total: usize,
    /// [`INFLIGHT_BYTES`], looked up once (not in the registry for every frame).
    gauge: metrics::Gauge,
}

/// The error a body yields when the pool is empty.
#[derive(Debug, thiserror::Error)]
#[error("the server holds {held} of its {total} bytes of in-flight requests; retry later (max_inflight_bytes)")]
pub struct BudgetExhausted {
    pub held: usize,
    pub total: usize,
}

impl InFlightBytes {
    pub fn new(total: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            sem: Arc::new(Semaphore::new(total)),
            total,
            gauge: metrics::gauge!(INFLIGHT_BYTES),
        }
    }

    /// Bytes in use now.
    pub fn held(&self) -> usize {
        self.total - self.sem.available_permits()
    }

    /// `body`, drawing its bytes from the pool as they arrive.
    pub fn wrap<B>(&self, body: B) -> Counted<B> {
        Counted {
            inner: body,
            pool: self.clone(),
            held: None,
        }
    }
}

/// A request body that holds its bytes' share of the pool until dropped.
pub struct Counted<B> {
    inner: B,
    pool: InFlightBytes,
    held: Option<OwnedSemaphorePermit>,
}

impl<B> HttpBody for Counted<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
            match self.pool.sem.clone().try_acquire_many_owned(n) {
                Ok(p) => {
                    self.pool.gauge.increment(f64::from(n));
                    match &mut self.held {
                        Some(h) => h.merge(p),
                        None => self.held = Some(p),
                    }
                }
                Err(_) => {
                    metrics::counter!(REFUSED).increment(1);
                    let e = BudgetExhausted {
                        held: self.pool.held(),
                        total: self.pool.total,
                    };
                    return Poll::Ready(Some(Err(Box::new(tonic::Status::resource_exhausted(
                        e.to_string(),
                    )))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(p) = &self.held {
            self.pool.gauge.decrement(p.num_permits() as f64);
        }
    }
}

/// The refusal inside an error chain (an axum body rejection, say), if the pool
/// was empty: the HTTP handlers answer it as RESOURCE_EXHAUSTED (429).
pub fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(s) = err.downcast_ref::<tonic::Status>() {
            if s.code() == tonic::Code::ResourceExhausted {
                return Some(s.message().to_owned());
            }
        }
        cur = err.source();
    }
    None
}

/// A tower layer that wraps every request body of a service whose bodies are `B`
/// (tonic's or axum's body type, rebuilt with `B::new`).
#[derive(Clone)]
pub struct BudgetLayer {
    pool: InFlightBytes,
}

impl BudgetLayer {
    pub fn new(pool: InFlightBytes) -> Self {
        Self { pool }
    }
}

impl<S> tower::Layer<S> for BudgetLayer {
    type Service = BudgetService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BudgetService {
            inner,
            pool: self.pool.clone(),
        }
    }
}

#[derive(Clone)]
pub struct BudgetService<S> {
    inner: S,
    pool: InFlightBytes,
}

/// Body types a budgeted body can be turned back into.
pub trait FromCounted: Sized {
    fn from_counted(c: Counted<Self>) -> Self;
}

impl FromCounted for tonic::body::Body {
    fn from_counted(c: Counted<Self>) -> Self {
        tonic::body::Body::new(c)
    }
}

impl FromCounted for axum::body::Body {
    fn from_counted(c: Counted<Self>) -> Self {
        axum::body::Body::new(c)
    }
}

impl<S, B> tower::Service<http::Request<B>> for BudgetService<S>
where
    S: tower::Service<http::Request<B>>,
    B: FromCounted,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let body = B::from_counted(self.pool.wrap(body));
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::BodyExt;

    fn body(chunks: &[usize]) -> axum::body::Body {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|n| Ok(Frame::data(Bytes::from(vec![0u8; *n]))))
            .collect();
        axum::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_until_dropped_and_are_refused_past_the_pool() {
        let pool = InFlightBytes::new(1000);
        let mut a = pool.wrap(body(&[300, 300]));
        while let Some(f) = a.frame().await {
            f.unwrap();
        }
        assert_eq!(pool.held(), 600);
        // A second body fits its first 300 bytes, not its next 200.
        let mut b = pool.wrap(body(&[300, 200]));
        b.frame().await.unwrap().unwrap();
        let e = b.frame().await.unwrap().unwrap_err();
        let status = e.downcast_ref::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("max_inflight_bytes"),
            "{}",
            status.message()
        );
        drop(b);
        assert_eq!(pool.held(), 600);
        drop(a);
        assert_eq!(pool.held(), 0);
        // With the pool free again, the same body passes.
        let mut c = pool.wrap(body(&[300, 200]));
        while let Some(f) = c.frame().await {
            f.unwrap();
        }
        assert_eq!(pool.held(), 500);
    }
}
