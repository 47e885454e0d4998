//! The `Model` trait and the plain types that cross the batcher/runner boundary.
//! Free of candle and of threads so tests can plug in fakes.
use std::sync::Arc;
use std::time::Duration;

use crate::device::DeviceLock;
use crate::error::ModelError;

/// A batch of rows, row-major: `data.len() == rows * cols`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Batch {
    /// Checks that the batch is `rows` rows of `width` values each (what a model's
    /// `forward` requires before it reads the data).
    pub fn check_width(&self, width: usize) -> Result<(), ModelError> {
        if self.cols != width || self.data.len() != self.rows * self.cols {
            return Err(ModelError::InvalidInput(format!(
                "batch of {} values is not {} rows of {}",
                self.data.len(),
                self.rows,
                width
            )));
        }
        Ok(())
    }
}

/// What a forward pass returns: `rows * cols` outputs and where the time went
/// (the three parts Triton's statistics report).
///
/// The three times are the model's own split of its forward pass; a model that does
/// not split it reports all three as zero, and the whole pass, as timed around
/// `forward`, is counted as `infer`.
#[derive(Debug, Clone, Default)]
pub struct Forward {
    pub data: Vec<f32>,
    pub cols: usize,
    /// Building the input tensor (and copying it to the device).
    pub input: Duration,
    /// The layers themselves.
    pub infer: Duration,
    /// Copying the output back to host memory.
    pub output: Duration,
}

/// A loaded model: `load(config)` happens in its constructor, `forward(batch)` here.
pub trait Model: Send + 'static {
    /// Elements in one input row.
    fn input_width(&self) -> usize;
    /// Elements in one output row.
    fn output_width(&self) -> usize;
    /// Runs the batch; the output has `batch.rows` rows in the same order.
    fn forward(&mut self, batch: &Batch) -> Result<Forward, ModelError>;
    /// The lock of the device this model computes on, when its passes must run one at
    /// a time with those of every other model there (a GPU: see [`crate::device`]).
    /// `None`, the default, for the CPU.
    fn device_lock(&self) -> Option<Arc<DeviceLock>> {
        None
    }
}

/// Builds one model instance per runner thread (instances share read-only weights).
pub type ModelFactory = std::sync::Arc<dyn Fn() -> Box<dyn Model> + Send + Sync>;
