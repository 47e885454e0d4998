//! When each request arrived. The outermost layer of both servers stamps the time
//! in the request's extensions as the request's headers are handed to the service,
//! before its body is read and decoded and before a thread picks up its handler; the
//! front doors count its deadline from there (`request::deadline`). Under load a
//! request can wait long for a thread: that wait is part of its deadline, not free.
use std::task::{Context, Poll};
use std::time::Instant;

/// When a request arrived, in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival(pub Instant);

impl Arrival {
    /// The arrival stamped in `ext`, or now when there is none (a service called
    /// directly, not through the servers).
    pub fn of(ext: &http::Extensions) -> Instant {
        ext.get::<Arrival>().map_or_else(Instant::now, |a| a.0)
    }

    /// The arrival of a gRPC request (tonic keeps the HTTP request's extensions).
    pub fn of_grpc<T>(req: &tonic::Request<T>) -> Instant {
        req.extensions()
            .get::<Arrival>()
            .map_or_else(Instant::now, |a| a.0)
    }
}

/// Stamps [`Arrival`] on every request (the first stamp wins, when layers nest).
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrivalLayer;

impl<S> tower::Layer<S> for ArrivalLayer {
    type Service = Stamp<S>;

    fn layer(&self, inner: S) -> Stamp<S> {
        Stamp { inner }
    }
}

/// The service of [`ArrivalLayer`].
#[derive(Debug, Clone)]
pub struct Stamp<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Stamp<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if req.extensions().get::<Arrival>().is_none() {
            req.extensions_mut().insert(Arrival(Instant::now()));
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};

    /// A request delayed between the stamp and its handler (a slow layer, a busy
    /// thread) keeps the time it arrived: the handler sees the delay as spent.
    #[tokio::test]
    async fn the_stamp_is_taken_before_inner_layers_delay_the_request() {
        let handler = tower::service_fn(|req: http::Request<()>| async move {
            Ok::<_, std::convert::Infallible>(Arrival::of(req.extensions()).elapsed())
        });
        let delay = tower::service_fn(move |req: http::Request<()>| {
            let h = handler.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                h.oneshot(req).await
            }
        });
        let svc = ArrivalLayer.layer(delay);
        let waited = svc.oneshot(http::Request::new(())).await.unwrap();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // Without a stamp, a handler counts from when it looks.
        let ext = http::Extensions::new();
        assert!(Arrival::of(&ext).elapsed() < Duration::from_millis(30));
    }

    #[test]
    fn the_first_stamp_wins() {
        let early = Instant::now() - Duration::from_millis(5);
        let mut req = http::Request::new(());
        req.extensions_mut().insert(Arrival(early));
        let mut svc = ArrivalLayer.layer(tower::service_fn(|r: http::Request<()>| async move {
            Ok::<_, std::convert::Infallible>(Arrival::of(r.extensions()))
        }));
        let got = futures::executor::block_on(async {
            futures::future::poll_fn(|cx| tower::Service::poll_ready(&mut svc, cx))
                .await
                .unwrap();
            tower::Service::call(&mut svc, req).await.unwrap()
        });
        assert_eq!(got, early);
    }
}
