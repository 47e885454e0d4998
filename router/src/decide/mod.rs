//! Fraud decisions (`mesh.v1.Decisions`): the model's input spec, the replicas a
//! decision can be sent to, the decision engine with its fallback chain, and the
//! gRPC service.
//!
//! A decision's stages (DESIGN.md, "How a decision flows"), and where each lives:
//! validate, features, preprocess, postprocess and log in [`stages`]; routing, the
//! model call, the time budgets and the fallback chain in [`fallback`]; the engine
//! ([`engine`]) runs them in order against the repository, the feature source
//! ([`feature_source`]: this process's store, or a features role through
//! [`remote_features`]) and the model-call stacks (kept in [`cache`]; remote
//! replica names are resolved by [`discovery`]).
pub mod arms;
pub mod cache;
pub mod config;
pub mod discovery;
pub mod engine;
pub mod fallback;
pub mod feature_source;
pub mod features;
pub mod meters;
pub mod outcome;
pub mod remote_features;
pub mod replica;
pub mod service;
pub mod spec;
pub mod stages;
#[cfg(test)]
mod testing;

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use mesh_stack::StackError;

pub use engine::Engine;
pub use outcome::{AnswerSource, Outcome, OutcomeSink, Timings};
use replica::{LocalReplica, ModelAnswer, ModelCall, RemoteReplica};

/// A replica of either kind, so one stack balances over both.
// Held once per replica by the stack's balancer, never in bulk: boxing the remote
// kind would save little memory and add a pointer to follow on every call.
#[allow(clippy::large_enum_variant)]
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
