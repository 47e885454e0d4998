#![cfg_attr(test, allow(clippy::unwrap_used))]
//! The prediction log of inference-mesh: one record per prediction, written off the request
//! path into date-partitioned Parquet segments that DuckDB, Polars, pandas and Spark read
//! as they are; readers, a tail, and the join with labels that arrive later.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mesh_prediction_log::LogError> {
//! use mesh_prediction_log::{LogConfig, PredictionLog, PredictionRecord, Role};
//! let (log, writer) = PredictionLog::start(LogConfig::new("/var/lib/mesh/predictions"))?;
//! let mut rec = PredictionRecord::new("req-1", "fraud", "3", Role::Primary);
//! rec.score = Some(0.91);
//! log.record(rec); // never waits; drops and counts when the writer is behind
//! log.shutdown().await?; // drains, closes the open segment into Parquet
//! writer.join()?;
//! # Ok(()) }
//! ```
//! See README.md for the file layout, the schema, the loss window and the DuckDB join.

mod codec;
pub mod commands;
mod config;
mod error;
pub mod join;
pub mod lock;
mod names;
mod parquet_io;
mod parquet_write;
pub mod priority;
mod reader;
mod record;
mod segment;
mod wal;
mod writer;

pub use config::{LogConfig, ParquetMode};
pub use error::{LogError, Result};
pub use join::{join, JoinOptions, JoinReport};
pub use parquet_io::{
    read_parquet, schema, write_parquet, write_parquet_arrow, FrameEncoder, FrameMaker,
};
pub use reader::{read_all, scan, ReadOptions, Tailer};
pub use record::{
    date_of_us, now_us, source, status, FeatureLogging, FeatureUsed, LoggedFeature,
    PredictionRecord, Protocol, RecordRef, Role, StageMicros, VersionText,
};
pub use segment::{
    convert_closed, parquet_files, recover, wal_files, ConvertedSegment, RecoveryReport,
};
pub use writer::{
    worker_turn, LogStats, PredictionLog, PredictionLogHandle, WriterTask, WORKER_TURN,
};
