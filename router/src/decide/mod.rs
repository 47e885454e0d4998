//! Fraud decisions (`mesh.v1.Decisions`): the model's input spec, the replicas a
//! decision can be sent to, the decision engine with its fallback chain, and the
//! gRPC service.
pub mod config;
pub mod engine;
pub mod features;
pub mod replica;
pub mod service;
pub mod spec;

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use mesh_stack::StackError;

pub use engine::{AnswerSource, Engine, Outcome, OutcomeSink, Timings};
use replica::{LocalReplica, ModelAnswer, ModelCall, RemoteReplica};

/// A replica of either kind, so one stack balances over both.
#[derive(Clone)]
pub enum Replica {
    Local(LocalReplica),
    Remote(RemoteReplica),
}

impl tower::Service<ModelCall> for Replica {
    type Response = ModelAnswer;
    type Error = StackError;
    type Future = BoxFuture<'static, Result<ModelAnswer, StackError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        match self {
            Self::Local(r) => r.poll_ready(cx),
            Self::Remote(r) => r.poll_ready(cx),
        }
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        match self {
            Self::Local(r) => r.call(call),
            Self::Remote(r) => r.call(call),
        }
    }
}
