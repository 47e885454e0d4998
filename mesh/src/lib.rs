//! The `mesh` command line over the serving library ([`mesh_router`]): argument
//! parsing, the demo, the load generator and its report, and the offline commands
//! (feature ingest, batch scoring, prediction-log joins). Errors here are
//! `anyhow` errors for a person to read; the serving path's `RouterError` stays
//! in the library.
pub mod batch_score;
pub mod bench;
pub mod cli;
pub mod cpu;
pub mod decide;
pub mod demo;
pub mod features;
pub mod logs;
pub mod out;
pub mod signals;
