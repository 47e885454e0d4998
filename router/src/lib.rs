//! The inference-mesh router: the serving front ends (Open Inference Protocol v2
//! over gRPC and HTTP), configuration, telemetry, and the `mesh` command line.
pub mod batch_score;
pub mod bench;
pub mod bench_html;
pub mod cli;
pub mod config;
pub mod decide;
pub mod demo;
pub mod error;
pub mod oip;
pub mod plog;
pub mod server;
pub mod telemetry;

pub use error::RouterError;
