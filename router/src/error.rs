//! The router's error type and its one mapping to gRPC status and HTTP status.
use mesh_model_actor::ModelError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Stack(#[from] mesh_stack::StackError),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// A request message over the configured size limit.
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unavailable(String),
    /// The request's deadline passed: before its work started, or before its
    /// answer was ready.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
}

impl RouterError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// The gRPC code of this error: overloaded -> RESOURCE_EXHAUSTED, bad input ->
    /// INVALID_ARGUMENT, unknown model/version -> NOT_FOUND, deadline ->
    /// DEADLINE_EXCEEDED, nothing to serve -> UNAVAILABLE, model fault -> INTERNAL.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::ResourceExhausted(_) | Self::TooLarge(_) => Code::ResourceExhausted,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Internal(_) => Code::Internal,
            Self::Stack(e) => match e.kind() {
                mesh_stack::ErrorKind::Overloaded => Code::ResourceExhausted,
                mesh_stack::ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
                mesh_stack::ErrorKind::Unavailable => Code::Unavailable,
                mesh_stack::ErrorKind::Internal => Code::Internal,
            },
            Self::Model(e) => match e {
                ModelError::ModelNotFound(_) | ModelError::VersionNotFound { .. } => Code::NotFound,
                ModelError::NotReady(_) | ModelError::Unavailable { .. } => Code::Unavailable,
                ModelError::InvalidInput(_) => Code::InvalidArgument,
                ModelError::Overloaded { .. } | ModelError::CannotMeetDeadline { .. } => {
                    Code::ResourceExhausted
                }
                ModelError::DeadlineExceeded(_) => Code::DeadlineExceeded,
                ModelError::Config { .. }
                | ModelError::Load { .. }
                | ModelError::Compute(_)
                | ModelError::Io { .. } => Code::Internal,
            },
        }
    }

    /// The HTTP status of the same error, for the REST mirror.
    pub fn http_status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        if let Self::TooLarge(_) = self {
            return S::PAYLOAD_TOO_LARGE;
        }
        match self.code() {
            Code::InvalidArgument | Code::OutOfRange => S::BAD_REQUEST,
            Code::NotFound => S::NOT_FOUND,
            Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
            Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
            Code::Unavailable => S::SERVICE_UNAVAILABLE,
            _ => S::INTERNAL_SERVER_ERROR,
        }
    }

    /// Whether the server (overload, deadline, an unavailable or faulty model) rather
    /// than the request is the cause.
    pub fn is_server_side(&self) -> bool {
        !matches!(
            self.code(),
            Code::InvalidArgument | Code::NotFound | Code::OutOfRange | Code::Cancelled
        ) && !matches!(self, Self::TooLarge(_))
    }

    /// The message a caller (or a log line) gets: cut to [`MAX_MESSAGE_BYTES`], since
    /// messages name what the request sent (model names, versions, ids), and a
    /// request must not be able to make the answer or the log as large as itself.
    pub fn message(&self) -> String {
        clip(&self.to_string(), MAX_MESSAGE_BYTES)
    }

    /// Low-cardinality label for metrics.
    pub fn code_label(&self) -> &'static str {
        code_label(self.code())
    }
}

/// The metric label of a gRPC code (`ok`, `invalid_argument`, ...).
pub fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::InvalidArgument => "invalid_argument",
        Code::NotFound => "not_found",
        Code::ResourceExhausted => "resource_exhausted",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::Unavailable => "unavailable",
        Code::Cancelled => "cancelled",
        Code::OutOfRange => "out_of_range",
        _ => "internal",
    }
}

/// A duration as milliseconds with three decimals, for messages.
pub fn ms(d: std::time::Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Longest error message a caller gets, bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `s` cut to at most `max` bytes (at a character boundary), saying how much was cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &s[..end], s.len() - end)
}

impl From<RouterError> for Status {
    fn from(e: RouterError) -> Self {
        Status::new(e.code(), e.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        let long = "é".repeat(2000); // 4,000 bytes
        let c = clip(&long, MAX_MESSAGE_BYTES);
        assert!(c.len() < MAX_MESSAGE_BYTES + 32, "{}", c.len());
        assert!(c.ends_with("(2976 bytes cut)"), "{c}");
        let e = RouterError::NotFound(format!("model '{}' is not loaded", "x".repeat(1 << 20)));
        let status = Status::from(e);
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().len() < 1100);
        assert!(status.message().starts_with("model 'xxx"));
    }
}
