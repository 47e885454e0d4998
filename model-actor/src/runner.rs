//! The runner: a thread that owns one instance of the model (and its device),
//! takes the next batch from its group's queue itself, runs it, and answers each
//! caller directly.
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batcher::{Pending, Queue};
use crate::batching::{assemble, split};
use crate::device::DeviceLock;
use crate::error::ModelError;
use crate::model::{Batch, Model};
use crate::stats::{Meters, VersionStats};

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Output {
    /// `rows * cols` values, row-major.
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    /// The version that computed it.
    pub version: u64,
    /// Time spent waiting in the batcher queue, and for the device when its passes run
    /// one at a time (a GPU).
    pub queue: Duration,
    /// Time of the forward pass (input + infer + output) of the batch it rode in.
    pub compute: Duration,
    /// Rows in that batch.
    pub batch_rows: usize,
}

/// Metric labels of one model version.
#[derive(Clone)]
pub(crate) struct Labels {
    pub model: Arc<str>,
    pub version: u64,
    version_label: String,
    replica_label: String,
}

impl Labels {
    pub fn new(model: Arc<str>, version: u64, replica: usize) -> Self {
        Self {
            model,
            version,
            version_label: version.to_string(),
            replica_label: replica.to_string(),
        }
    }
    /// Logs a failed forward pass of this version.
    pub fn log_failure(&self, e: &ModelError) {
        tracing::error!(model = %self.model, version = self.version, error = %e, "forward pass failed");
    }
    pub fn pairs(&self) -> [(&'static str, String); 3] {
        [
            ("model", self.model.to_string()),
            ("version", self.version_label.clone()),
            ("replica", self.replica_label.clone()),
        ]
    }
}

pub(crate) struct Runner {
    pub model: Box<dyn Model>,
    pub queue: Arc<Queue>,
    /// Which of the group's runners this is (its slot in the queue's bookkeeping).
    pub slot: usize,
    pub cols: usize,
    pub stats: Arc<VersionStats>,
    pub labels: Labels,
    pub meters: Arc<Meters>,
    /// The model's device lock (`Model::device_lock`), asked once as the group starts.
    pub device: Option<Arc<DeviceLock>>,
}

impl Runner {
    /// Runs batches until the queue closes.
    pub fn run(mut self) {
        let device = self.device.take();
        let _seat = device.as_deref().map(DeviceLock::join);
        while let Some(items) = self.queue.next_batch(self.slot) {
            self.run_batch(items, device.as_deref());
        }
    }

    /// Takes the callers who stopped waiting (each gives up at its deadline) out of
    /// `items`, counted as cancelled: their rows would answer no one. Returns how many
    /// left, or `None` when none is left to answer, having told the queue this runner
    /// is free.
    fn keep_waiting(&self, items: &mut Vec<Pending>) -> Option<usize> {
        let before = items.len();
        items.retain(|p| !p.reply.is_closed());
        let left = before - items.len();
        if left > 0 {
            self.meters.cancelled.increment(left as u64);
        }
        if items.is_empty() {
            self.queue.finished(self.slot, None);
            return None;
        }
        Some(left)
    }

    /// The rows of `items`, in order, as one batch.
    fn batch_of(&self, items: &[Pending]) -> Batch {
        let rows: usize = items.iter().map(|p| p.rows).sum();
        Batch {
            rows,
            cols: self.cols,
            data: assemble(items.iter().map(|p| &p.data[..]), rows * self.cols),
        }
    }

    /// Computes one batch (holding `device` for the pass, when the model has one),
    /// tells the queue (its cost, and that this runner is free), and answers its
    /// callers.
    fn run_batch(&mut self, mut items: Vec<Pending>, device: Option<&DeviceLock>) {
        // Callers who left while the batch formed are not computed, nor is a batch
        // that everyone left.
        if self.keep_waiting(&mut items).is_none() {
            return;
        }
        let mut batch = self.batch_of(&items);
        let took = Instant::now();
        let pass = device.map(DeviceLock::lock);
        // The wait for the device counts as queueing, not computing.
        let started = Instant::now();
        if pass.is_some() {
            self.meters
                .device_wait
                .record((started - took).as_secs_f64());
            // Nor are those who gave up while it waited for the device, whose pass
            // would otherwise hold it from the batches waiting behind.
            match self.keep_waiting(&mut items) {
                None => return,
                Some(0) => {}
                Some(_) => batch = self.batch_of(&items),
            }
        }
        let rows: Vec<usize> = items.iter().map(|p| p.rows).collect();
        let total = batch.rows;
        for p in &items {
            let waited = started.saturating_duration_since(p.enqueued_at);
            self.stats.queue.add(1, waited);
            self.meters.queue_wait.record(waited.as_secs_f64());
        }
        let (compute, done, result) =
            forward(&mut *self.model, &batch, &rows, &self.stats, &self.meters);
        drop(pass);
        // The queue's cost of a batch includes that wait: admission estimates how long
        // this runner takes per batch, other models' passes on its device included.
        self.queue
            .finished(self.slot, Some((total, compute + (started - took))));
        match result {
            Ok((cols, parts)) => {
                for (p, data) in items.into_iter().zip(parts) {
                    tracing::trace!(parent: &p.span, rows = p.rows, batch_rows = batch.rows, "computed");
                    let answer = answer(done, p.deadline, &self.meters, || Output {
                        data,
                        rows: p.rows,
                        cols,
                        version: self.labels.version,
                        queue: started.saturating_duration_since(p.enqueued_at),
                        compute,
                        batch_rows: batch.rows,
                    });
                    let _ = p.reply.send(answer);
                }
            }
            Err(e) => {
                self.labels.log_failure(&e);
                // Each caller gets the error as the model gave it (not wrapped twice).
                let msg = match e {
                    ModelError::Compute(m) => m,
                    other => other.to_string(),
                };
                for p in items {
                    let _ = p.reply.send(Err(ModelError::Compute(msg.clone())));
                }
            }
        }
    }
}

/// A batch's output: its columns, and each request's rows of it, in order.
pub(crate) type Split = (usize, Vec<Vec<f32>>);

/// The forward pass of `batch`, which holds the rows of requests of `rows` rows
/// each, in order: its time, when it ended, and the output's columns and each
/// request's part of it. The time, the batch size and the split of the time go to
/// `stats` and `meters`.
pub(crate) fn forward(
    model: &mut dyn Model,
    batch: &Batch,
    rows: &[usize],
    stats: &VersionStats,
    meters: &Meters,
) -> (Duration, Instant, Result<Split, ModelError>) {
    let started = Instant::now();
    let result = model.forward(batch);
    let done = Instant::now();
    let compute = done - started;
    meters.compute.record(compute.as_secs_f64());
    meters.batch_size.record(batch.rows as f64);
    let result = result.and_then(|f| {
        let parts = split(&f.data, f.cols, rows).ok_or_else(|| {
            ModelError::Compute(format!(
                "model returned {} values for {} rows",
                f.data.len(),
                batch.rows
            ))
        })?;
        // A model that does not time its parts (all three zero) spent it all computing.
        let unsplit = f.input.is_zero() && f.infer.is_zero() && f.output.is_zero();
        stats.record_batch(
            rows.len() as u64,
            batch.rows as u64,
            f.input,
            if unsplit { compute } else { f.infer },
            f.output,
        );
        Ok((f.cols, parts))
    });
    (compute, done, result)
}

/// What a caller whose answer was ready at `done` gets: the output, or, when that
/// was after its `deadline`, `DeadlineExceeded` (the caller has stopped waiting,
/// and a late answer must not count as served).
pub(crate) fn answer(
    done: Instant,
    deadline: Instant,
    meters: &Meters,
    output: impl FnOnce() -> Output,
) -> Result<Output, ModelError> {
    if done > deadline {
        meters.late.increment(1);
        Err(ModelError::DeadlineExceeded(
            "the answer was ready after the deadline",
        ))
    } else {
        Ok(output())
    }
}
