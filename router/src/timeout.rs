//! The HTTP port's `request_timeout`: a request that is not answered within it (its
//! body read, the handler run) is answered 408, naming the setting. A tower layer
//! with its own future, where an axum `from_fn` middleware would box every
//! request's future and clone the whole router for it.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::{IntoResponse, Response};

/// Answers 408 to a request not answered within its duration.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeoutLayer(pub Duration);

impl<S> tower::Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> RequestTimeout<S> {
        RequestTimeout {
            inner,
            limit: self.0,
        }
    }
}

/// The service of [`RequestTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    limit: Duration,
}

impl<S, B> tower::Service<http::Request<B>> for RequestTimeout<S>
where
    S: tower::Service<http::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        TimeoutFuture {
            inner: tokio::time::timeout(self.limit, self.inner.call(req)),
            limit: self.limit,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`RequestTimeout`]: the inner answer, or 408 once the limit passed.
    pub struct TimeoutFuture<F> {
        #[pin]
        inner: tokio::time::Timeout<F>,
        limit: Duration,
    }
}

impl<F, E> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.inner.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(answer)) => Poll::Ready(answer),
            Poll::Ready(Err(_elapsed)) => Poll::Ready(Ok((
                http::StatusCode::REQUEST_TIMEOUT,
                axum::Json(serde_json::json!({
                    "error": format!(
                        "request not complete within {:?} (request_timeout)",
                        this.limit
                    )
                })),
            )
                .into_response())),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tower::ServiceExt;

    fn app() -> axum::Router {
        axum::Router::new()
            .route("/fast", get(|| async { "done" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    "never"
                }),
            )
            .layer(RequestTimeoutLayer(Duration::from_secs(3)))
    }

    async fn call(path: &str) -> (http::StatusCode, String) {
        let req = http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let res = app().oneshot(req).await.unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_the_limit_is_answered_408_naming_the_setting() {
        let started = tokio::time::Instant::now();
        let (status, body) = call("/slow").await;
        assert_eq!(status, http::StatusCode::REQUEST_TIMEOUT);
        assert!(
            body.contains("request not complete within 3s (request_timeout)"),
            "{body}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_within_the_limit_gets_its_answer() {
        assert_eq!(call("/fast").await, (http::StatusCode::OK, "done".into()));
    }
}
