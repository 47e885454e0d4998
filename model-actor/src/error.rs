//! The one error type of the model-actor crate.
use std::path::PathBuf;
use std::time::Duration;

/// A duration as milliseconds with three decimals, for messages.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Everything that can go wrong loading or calling a model.
///
/// The router maps each variant to one gRPC status (see its `error.rs`); the
/// `is_*` helpers keep that mapping out of string matching.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model '{0}' is not in the repository")]
    ModelNotFound(String),
    #[error("model '{model}' has no ready version {version}")]
    VersionNotFound { model: String, version: String },
    #[error("model '{0}' has no ready version")]
    NotReady(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error(
        "model '{model}' version {version} is overloaded: its queue of {capacity} requests is full"
    )]
    Overloaded {
        model: String,
        version: u64,
        capacity: usize,
    },
    /// Admission by deadline: the answer is expected after the request's deadline
    /// (see `batching::admit`), so the request is refused instead of queued.
    #[error(
        "model '{model}' version {version} cannot answer in time: expected answer in {} ({batches_ahead} full batches ahead of {} each, on {runners} runners), but only {} of the request's deadline is left",
        ms(*expected), ms(*batch_time), ms(*remaining)
    )]
    CannotMeetDeadline {
        model: String,
        version: u64,
        expected: Duration,
        remaining: Duration,
        batches_ahead: usize,
        batch_time: Duration,
        runners: usize,
    },
    #[error("deadline exceeded {0}")]
    DeadlineExceeded(&'static str),
    #[error("model '{model}' version {version} is shutting down")]
    Unavailable { model: String, version: u64 },
    #[error("model configuration {path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("loading model '{model}' version {version}: {msg}")]
    Load {
        model: String,
        version: u64,
        msg: String,
    },
    #[error("model execution failed: {0}")]
    Compute(String),
    #[error("i/o on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// The label used for this error in metrics (`code`), low-cardinality.
    pub fn code(&self) -> &'static str {
        match self {
            Self::ModelNotFound(_) | Self::VersionNotFound { .. } => "not_found",
            Self::NotReady(_) | Self::Unavailable { .. } => "unavailable",
            Self::InvalidInput(_) => "invalid_argument",
            Self::Overloaded { .. } | Self::CannotMeetDeadline { .. } => "resource_exhausted",
            Self::DeadlineExceeded(_) => "deadline_exceeded",
            Self::Config { .. } | Self::Load { .. } | Self::Compute(_) | Self::Io { .. } => {
                "internal"
            }
        }
    }
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        Self::Compute(candle_message(&e))
    }
}

/// A candle error as one line. Candle appends the backtrace it captured to its
/// errors' text when `RUST_BACKTRACE` is set (a GPU's errors always take one), and
/// that must not reach a gRPC status, a log line or the repository index.
pub fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        // A backtrace wrapped deeper: the first line is the message.
        other => other.to_string().lines().next().unwrap_or("").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candle_error_with_its_backtrace_is_one_line() {
        let with_bt = |inner| candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let e = with_bt(candle_core::Error::Msg("invalid device ordinal".into()));
        assert!(e.to_string().contains('\n'), "no backtrace was captured");
        assert_eq!(candle_message(&e), "invalid device ordinal");
        let m = ModelError::from(with_bt(candle_core::Error::Msg("out of memory".into())));
        assert_eq!(m.to_string().lines().count(), 1, "{m}");
        assert!(m.to_string().contains("out of memory"), "{m}");
        // Wrapped deeper, the message's first line is kept (candle puts the path first).
        let deep = candle_core::Error::WithPath {
            inner: Box::new(with_bt(candle_core::Error::Msg("bad header".into()))),
            path: "model.safetensors".into(),
        };
        assert!(deep.to_string().lines().count() > 1);
        let m = candle_message(&deep);
        assert_eq!(m.lines().count(), 1, "{m}");
        assert!(
            m.contains("bad header") && m.contains("model.safetensors"),
            "{m}"
        );
    }
}
