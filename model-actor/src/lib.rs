//! Model repository, candle models, tree ensembles (`mesh-trees`), ONNX models (ONNX
//! Runtime through `ort`) and dynamic-batching model actors.
//!
//! A [`ModelRepository`] serves the versions of each model in a directory. Each
//! version is one or more actor groups, each a [`VersionHandle`]: admission (a
//! semaphore sized to the queue capacity, then the deadline rule of
//! `batching::admit`) in front of a queue that the group's runner threads share;
//! each runner owns a copy of the model on its device and takes its next batch from
//! the queue itself.
mod batcher;
pub mod batching;
pub mod config;
pub mod device;
pub mod error;
pub mod handle;
pub mod mlp;
pub mod model;
pub mod onnx;
pub mod repository;
mod runner;
pub mod stats;
pub mod system;
pub mod trees;

pub use config::{DataType, ModelConfig};
pub use error::ModelError;
pub use handle::VersionHandle;
pub use model::{Batch, Forward, Model, ModelFactory};
pub use repository::{ModelRepository, ServedModel};
pub use runner::Output;
pub use system::ActorSystem;
