//! The inference-mesh serving path, as a library: the Open Inference Protocol v2
//! front door (gRPC and HTTP), the decision engine and its `mesh.v1.Decisions`
//! service, the admin plane, offline scoring, configuration, telemetry and the
//! server wiring. The `mesh` binary (crate `mesh`) is its command line.
//!
//! Modules depend one way: `server` wires `oip`, `decide` and `admin`; those use
//! `request` (what both front doors share), `arrival` (when a request arrived, the
//! start of its deadline), `plog` (prediction-log records),
//! `telemetry` (metric names) and `error`.
pub mod admin;
pub mod arrival;
pub mod auth;
pub mod budget;
pub mod config;
pub mod decide;
pub mod error;
pub mod listen;
pub mod offline;
pub mod oip;
pub mod plog;
pub mod request;
pub mod server;
pub mod telemetry;
pub mod timeout;
pub mod tls;

pub use error::RouterError;
