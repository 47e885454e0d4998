//! The replica set of one model version, as a tower `Discover`.
//!
//! It starts with the replicas given at construction; the router may later
//! add, replace or remove replicas through [`ReplicaUpdates`]. Each replica
//! service is wrapped into an [`Endpoint`] (load tracking, breaker, per-try
//! timeout) before the balancer sees it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;
use tower::discover::Change;
use tower::ServiceBuilder;

use crate::breaker::{self, Breaker, BreakerRegistry};
use crate::config::StackConfig;
use crate::error::StackError;
use crate::load::{self, Measured};
use crate::timeout::{self, TryTimeout};
use crate::ReplicaId;

/// One replica as the balancer sees it, outside in: load metric
/// (failure-aware peak-EWMA latency x in-flight requests, for p2c) ->
/// circuit breaker -> per-try timeout -> the replica.
pub type Endpoint<S> = Measured<Breaker<TryTimeout<S>>>;

/// Wraps replica services into [`Endpoint`]s.
#[derive(Debug, Clone)]
pub struct EndpointBuilder {
    cfg: StackConfig,
    registry: BreakerRegistry,
}

impl EndpointBuilder {
    /// Endpoints with the breaker and timeout settings of `cfg`, whose
    /// breakers register in `registry`.
    pub fn new(cfg: &StackConfig, registry: BreakerRegistry) -> Self {
        EndpointBuilder {
            cfg: cfg.clone(),
            registry,
        }
    }

    /// Wraps one replica service.
    pub fn build<S>(&self, id: ReplicaId, svc: S) -> Endpoint<S> {
        ServiceBuilder::new()
            .layer(load::layer(
                self.cfg.load_default_rtt,
                self.cfg.load_decay,
                self.cfg.per_try_timeout,
            ))
            .layer(breaker::layer(
                id.clone(),
                self.cfg.breaker.clone(),
                self.registry.clone(),
            ))
            .layer(timeout::layer(id, self.cfg.per_try_timeout))
            .service(svc)
    }
}

/// `Discover` over the replicas of one model version.
#[derive(Debug)]
pub struct ReplicaDiscover<E> {
    initial: VecDeque<(ReplicaId, E)>,
    updates: mpsc::UnboundedReceiver<Change<ReplicaId, E>>,
}

/// Changes the replica set of a running stack.
#[derive(Debug)]
pub struct ReplicaUpdates<S> {
    tx: mpsc::UnboundedSender<Change<ReplicaId, Endpoint<S>>>,
    builder: EndpointBuilder,
}

impl<S> Clone for ReplicaUpdates<S> {
    fn clone(&self) -> Self {
        ReplicaUpdates {
            tx: self.tx.clone(),
            builder: self.builder.clone(),
        }
    }
}

impl<S> ReplicaUpdates<S> {
    /// Adds a replica, or replaces the one with the same id (its breaker
    /// starts closed).
    pub fn insert(&self, id: ReplicaId, svc: S) -> Result<(), StackError> {
        let ep = self.builder.build(id.clone(), svc);
        self.tx
            .send(Change::Insert(id, ep))
            .map_err(|_| StackError::Internal("model-call stack was dropped".into()))
    }

    /// Removes a replica; requests already sent to it finish.
    pub fn remove(&self, id: ReplicaId) -> Result<(), StackError> {
        self.tx
            .send(Change::Remove(id))
            .map_err(|_| StackError::Internal("model-call stack was dropped".into()))
    }

    /// Resolves when the stack is gone (every clone dropped and its balancer
    /// stopped), so a task that feeds it replica changes can end.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Whether the stack is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The discover for `replicas` and the handle that changes it later.
pub fn replica_set<S>(
    replicas: Vec<(ReplicaId, S)>,
    builder: EndpointBuilder,
) -> (ReplicaDiscover<Endpoint<S>>, ReplicaUpdates<S>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let initial = replicas
        .into_iter()
        .map(|(id, s)| {
            let ep = builder.build(id.clone(), s);
            (id, ep)
        })
        .collect();
    (
        ReplicaDiscover {
            initial,
            updates: rx,
        },
        ReplicaUpdates { tx, builder },
    )
}

impl<E> Stream for ReplicaDiscover<E> {
    type Item = Result<Change<ReplicaId, E>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some((id, ep)) = self.initial.pop_front() {
            return Poll::Ready(Some(Ok(Change::Insert(id, ep))));
        }
        match self.updates.poll_recv(cx) {
            Poll::Ready(Some(change)) => Poll::Ready(Some(Ok(change))),
            // All handles dropped: the set stays as it is, forever.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

// Only owned, Unpin fields: the balancer requires an Unpin discover.
impl<E> Unpin for ReplicaDiscover<E> {}
