//! The router's model-call stack: tower middleware in front of the replicas
//! (local model actors or remote gRPC replicas) of one model version.
//!
//! Outside in: shed -> deadline -> retry with budget -> p2c balance over
//! replicas -> per-replica circuit breaker -> per-try timeout -> replica.
//! [`model_call_stack`] composes it; `README.md` explains the order.
//! Each middleware is one module with a `layer()` constructor; the policies
//! ([`RetryBudget`], [`BreakerState`]) are plain types with their own tests.

pub mod balance;
pub mod breaker;
pub mod breaker_state;
pub mod budget;
pub mod config;
pub mod deadline;
pub mod discover;
pub mod error;
pub mod fail_fast;
pub mod load;
pub mod metrics;
pub mod retry;
pub mod shared;
pub mod shed;
mod stack;
pub mod timeout;

use std::fmt;
use std::sync::Arc;

pub use breaker::BreakerRegistry;
pub use breaker_state::{BreakerPhase, BreakerState};
pub use budget::RetryBudget;
pub use config::{
    collect_deprecations, deprecated, format_duration, parse_duration, BreakerConfig,
    RetryBudgetConfig, StackConfig,
};
pub use deadline::{HasDeadline, WithDeadline};
pub use discover::ReplicaUpdates;
pub use error::{BoxError, ErrorKind, StackError};
pub use retry::RetryPolicy;
pub use stack::{
    model_call_stack, model_call_stack_with_updates, ModelCallStack, StackWithUpdates,
};

/// Identifies one replica of a model version (e.g. `"fraud-v3/local-0"` or a
/// remote address). Used as the balancer key and the `replica` metric label.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(Arc<str>);

impl ReplicaId {
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ReplicaId {
    fn from(s: &str) -> Self {
        ReplicaId(Arc::from(s))
    }
}

impl From<String> for ReplicaId {
    fn from(s: String) -> Self {
        ReplicaId(Arc::from(s))
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}
