//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong in the prediction log, its readers and the label join.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parquet error on {path}: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("file {path} does not have the prediction log schema: {reason}")]
    Schema { path: PathBuf, reason: String },
    #[error("record encoding failed: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("labels file {path}: {reason}")]
    Labels { path: PathBuf, reason: String },
    #[error("csv error in {path}: {source}")]
    Csv {
        path: PathBuf,
        #[source]
        source: csv::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(
        "prediction log directory {0} does not exist (give the writer's [prediction_log] dir)"
    )]
    NoLogDir(PathBuf),
    #[error("prediction log directory {dir} is in use by {holder}; one writer per directory (stop it, or give this process another directory)")]
    Locked { dir: PathBuf, holder: String },
    #[error("the prediction log writer has stopped")]
    Closed,
    #[error("record {request_id:?} encodes to {bytes} bytes, over the {limit} bytes a wal frame may hold")]
    RecordTooLarge {
        request_id: String,
        bytes: usize,
        limit: usize,
    },
    #[error("the prediction log writer thread panicked")]
    WriterPanicked,
}

impl LogError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn parquet(path: impl Into<PathBuf>, source: parquet::errors::ParquetError) -> Self {
        Self::Parquet {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn schema(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Schema {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = LogError> = std::result::Result<T, E>;
