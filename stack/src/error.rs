//! The one error type of the model-call stack and its classification.
//!
//! Every layer of the stack fails with a [`StackError`]. Layers that tower
//! boxes (the p2c balancer, the retry layer) box a `StackError`, and
//! [`StackError::from_boxed`] gets it back out again.
//!
//! The router maps [`ErrorKind`] to a gRPC status in one place:
//!
//! | kind               | gRPC code            |
//! |--------------------|----------------------|
//! | `Overloaded`       | `RESOURCE_EXHAUSTED` |
//! | `DeadlineExceeded` | `DEADLINE_EXCEEDED`  |
//! | `Unavailable`      | `UNAVAILABLE`        |
//! | `Internal`         | `INTERNAL`           |

use std::fmt;
use std::time::Duration;

use crate::ReplicaId;

/// A boxed error, as tower uses between layers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in a model call.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// The stack itself shed the request: `max_in_flight` calls were already
    /// running, or `buffer_capacity` calls were already waiting for a ready
    /// replica. Never retried (retrying overload only adds to it).
    #[error("overloaded: {in_flight} model calls already {what}")]
    Overloaded {
        /// The configured limit that was reached.
        in_flight: usize,
        /// Which limit: "in flight" or "waiting for a ready replica".
        what: &'static str,
    },

    /// The request's overall deadline passed (or had passed on arrival).
    #[error("deadline exceeded")]
    DeadlineExceeded,

    /// One attempt on one replica took longer than the per-try timeout.
    #[error("replica {replica} did not answer within the per-try timeout of {timeout:?}")]
    TryTimeout {
        /// The replica that was too slow.
        replica: ReplicaId,
        /// The per-try timeout.
        timeout: Duration,
    },

    /// The replica's circuit breaker is open (or its one probe is in flight).
    #[error("circuit breaker of replica {0} is open")]
    BreakerOpen(ReplicaId),

    /// No replica can take the request: none is configured, or the breakers of
    /// all of them are open.
    #[error("no replica available ({0})")]
    NoReplica(&'static str),

    /// The replica answered that it is overloaded (its queue is full).
    #[error("replica overloaded: {0}")]
    ReplicaOverloaded(#[source] BoxError),

    /// The replica could not be reached or is shutting down.
    #[error("replica unavailable: {0}")]
    ReplicaUnavailable(#[source] BoxError),

    /// The model failed while running the request.
    #[error("model fault: {0}")]
    ModelFault(#[source] BoxError),

    /// A bug or broken invariant inside the stack.
    #[error("internal stack error: {0}")]
    Internal(String),

    /// [`crate::StackConfig::validate`] rejected the configuration.
    #[error("invalid stack config: {0}")]
    InvalidConfig(String),
}

/// Coarse class of a [`StackError`]; the router turns it into a gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `RESOURCE_EXHAUSTED`
    Overloaded,
    /// `DEADLINE_EXCEEDED`
    DeadlineExceeded,
    /// `UNAVAILABLE`
    Unavailable,
    /// `INTERNAL`
    Internal,
}

impl ErrorKind {
    /// The gRPC status code name, for logs and metric labels.
    pub fn grpc_code_name(self) -> &'static str {
        match self {
            ErrorKind::Overloaded => "RESOURCE_EXHAUSTED",
            ErrorKind::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorKind::Unavailable => "UNAVAILABLE",
            ErrorKind::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.grpc_code_name())
    }
}

impl StackError {
    /// The class of this error; see the module docs for the gRPC mapping.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StackError::Overloaded { .. } | StackError::ReplicaOverloaded(_) => {
                ErrorKind::Overloaded
            }
            StackError::DeadlineExceeded => ErrorKind::DeadlineExceeded,
            // A per-try timeout that ends the request before its deadline means
            // "that replica did not answer": the client may try again.
            StackError::TryTimeout { .. }
            | StackError::BreakerOpen(_)
            | StackError::NoReplica(_)
            | StackError::ReplicaUnavailable(_) => ErrorKind::Unavailable,
            StackError::ModelFault(_) | StackError::Internal(_) | StackError::InvalidConfig(_) => {
                ErrorKind::Internal
            }
        }
    }

    /// Whether this failure counts against the replica's circuit breaker.
    ///
    /// Overload is back-pressure, not breakage: it neither counts as a failure
    /// nor resets the run of failures. Errors made by the stack itself (shed,
    /// deadline, no replica) never reach a breaker.
    pub fn counts_against_replica(&self) -> bool {
        matches!(
            self,
            StackError::TryTimeout { .. }
                | StackError::ReplicaUnavailable(_)
                | StackError::ModelFault(_)
        )
    }

    /// Gets a `StackError` back from a boxed error; anything else (which no
    /// layer of this crate produces) becomes [`StackError::Internal`].
    pub fn from_boxed(err: BoxError) -> StackError {
        match err.downcast::<StackError>() {
            Ok(e) => *e,
            Err(other) => StackError::Internal(other.to_string()),
        }
    }

    /// A short label for metrics (`reason="..."`).
    pub fn label(&self) -> &'static str {
        match self {
            StackError::Overloaded { .. } => "overloaded",
            StackError::DeadlineExceeded => "deadline_exceeded",
            StackError::TryTimeout { .. } => "try_timeout",
            StackError::BreakerOpen(_) => "breaker_open",
            StackError::NoReplica(_) => "no_replica",
            StackError::ReplicaOverloaded(_) => "replica_overloaded",
            StackError::ReplicaUnavailable(_) => "replica_unavailable",
            StackError::ModelFault(_) => "model_fault",
            StackError::Internal(_) => "internal",
            StackError::InvalidConfig(_) => "invalid_config",
        }
    }
}

/// Lets a replica service with `Error = BoxError` (e.g. `tower_test::mock`)
/// sit under the stack: a boxed `StackError` is unboxed, anything else is a
/// model fault.
impl From<BoxError> for StackError {
    fn from(err: BoxError) -> Self {
        match err.downcast::<StackError>() {
            Ok(e) => *e,
            Err(other) => StackError::ModelFault(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_documented_codes() {
        let boxed = || -> BoxError { "x".into() };
        assert_eq!(
            StackError::Overloaded {
                in_flight: 1,
                what: "in flight"
            }
            .kind(),
            ErrorKind::Overloaded
        );
        assert_eq!(
            StackError::ReplicaOverloaded(boxed()).kind(),
            ErrorKind::Overloaded
        );
        assert_eq!(
            StackError::DeadlineExceeded.kind(),
            ErrorKind::DeadlineExceeded
        );
        assert_eq!(
            StackError::BreakerOpen(ReplicaId::from("a")).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(StackError::NoReplica("x").kind(), ErrorKind::Unavailable);
        assert_eq!(StackError::ModelFault(boxed()).kind(), ErrorKind::Internal);
        assert_eq!(ErrorKind::Overloaded.grpc_code_name(), "RESOURCE_EXHAUSTED");
    }

    #[test]
    fn boxed_stack_errors_round_trip() {
        let b: BoxError = Box::new(StackError::BreakerOpen(ReplicaId::from("r1")));
        assert!(matches!(
            StackError::from_boxed(b),
            StackError::BreakerOpen(id) if id.as_str() == "r1"
        ));
        let other: BoxError = "boom".into();
        assert!(matches!(StackError::from(other), StackError::ModelFault(_)));
        let other: BoxError = "boom".into();
        assert!(matches!(
            StackError::from_boxed(other),
            StackError::Internal(_)
        ));
    }

    #[test]
    fn overload_does_not_count_against_the_replica() {
        assert!(!StackError::ReplicaOverloaded("q full".into()).counts_against_replica());
        assert!(StackError::ReplicaUnavailable("down".into()).counts_against_replica());
    }
}
