//! The crate's one error type, and its one mapping to a gRPC status.
use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = FeatureStoreError> = std::result::Result<T, E>;

/// Why the store could not be opened; each says what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFailure {
    /// Another process holds the database's lock file.
    LockHeld,
    /// sled found corrupt data (or panicked while recovering it).
    Corrupt,
    /// Any other I/O error (permissions, missing directory, full disk).
    Io,
}

#[derive(Debug, Error)]
pub enum FeatureStoreError {
    /// The views file is malformed or inconsistent on its own.
    #[error("views config: {what}")]
    Config { what: String },

    /// The views file conflicts with what the store recorded earlier (a changed key
    /// type or feature type would need the stored rows rewritten).
    #[error("views config conflicts with the store: {what}; to change it, rebuild the store from its source files (see feature-store/README.md)")]
    RegistryConflict { what: String },

    #[error("{}", open_message(path, *kind, detail))]
    Open {
        path: PathBuf,
        kind: OpenFailure,
        detail: String,
    },

    #[error("unknown feature view {0:?}")]
    UnknownView(String),

    #[error("view {view:?} has no feature {feature:?}")]
    UnknownFeature { view: String, feature: String },

    /// Malformed or mistyped input from a caller (lookup, push, ingest file).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A request larger than a configured limit; the message names the limit.
    #[error("{what} is {got}, over the limit of {limit} ({setting})")]
    LimitExceeded {
        what: &'static str,
        got: usize,
        limit: usize,
        setting: &'static str,
    },

    /// A stored value this build cannot decode (a newer encoding version, or damage).
    #[error("stored value for view {view:?} cannot be decoded: {what}")]
    Decode { view: String, what: String },

    #[error("storage error: {0}")]
    Storage(#[from] sled::Error),

    /// sled failed part-way through a write: the rows before the failure are stored
    /// (each row is written whole), the rest are not.
    #[error("storage error after {written} of {rows} rows of view {view:?} were written: {source}; writing the rows again is safe (a row never replaces a newer one)")]
    WriteInterrupted {
        view: String,
        written: u64,
        rows: u64,
        source: sled::Error,
    },

    /// The Redis backend could not be reached or answered with an error (a write
    /// or a startup step; lookups degrade instead, see `LookupResponse::degraded`).
    #[error("feature store backend (redis): {0}")]
    Backend(String),

    #[error("ingest of {path}: {what}")]
    Ingest { path: PathBuf, what: String },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A blocking read task died (panic or runtime shutdown).
    #[error("internal error: {0}")]
    Internal(String),
}

fn open_message(path: &std::path::Path, kind: OpenFailure, detail: &str) -> String {
    let p = path.display();
    let rebuild = format!(
        "To rebuild: move {p} aside, start again with an empty directory at that path, and \
         re-ingest each view from its source files with `mesh features ingest --view <view> <file>` \
         (see feature-store/README.md, \"Rebuilding the store\")"
    );
    match kind {
        OpenFailure::LockHeld => format!(
            "feature store at {p} is locked by another process (is another `mesh` running on it?): {detail}. \
             To write to a running mesh's store, go through it: `mesh features ingest --addr <grpc address>` \
             (Push, with the writer token). Otherwise stop that process, or point this one at another directory."
        ),
        OpenFailure::Corrupt => format!(
            "feature store at {p} is corrupt and cannot be opened: {detail}. {rebuild}"
        ),
        OpenFailure::Io => format!("feature store at {p} cannot be opened: {detail}. {rebuild}"),
    }
}

impl From<FeatureStoreError> for tonic::Status {
    fn from(e: FeatureStoreError) -> Self {
        use tonic::Status;
        let msg = e.to_string();
        match e {
            FeatureStoreError::UnknownView(_) | FeatureStoreError::UnknownFeature { .. } => {
                Status::not_found(msg)
            }
            FeatureStoreError::InvalidArgument(_) | FeatureStoreError::LimitExceeded { .. } => {
                Status::invalid_argument(msg)
            }
            // Startup-time errors should never reach a request, but if they do they are
            // the server's fault, not the caller's.
            FeatureStoreError::Config { .. }
            | FeatureStoreError::RegistryConflict { .. }
            | FeatureStoreError::Open { .. } => Status::failed_precondition(msg),
            FeatureStoreError::Storage(_)
            | FeatureStoreError::WriteInterrupted { .. }
            | FeatureStoreError::Io { .. }
            | FeatureStoreError::Backend(_) => Status::unavailable(msg),
            FeatureStoreError::Decode { .. }
            | FeatureStoreError::Ingest { .. }
            | FeatureStoreError::Internal(_) => Status::internal(msg),
        }
    }
}
