//! The runner: a SyncArbiter actor that owns one instance of the model (and its
//! device) and runs one batch at a time, answering each caller directly.
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Handler, Message, SyncContext};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::batching::split;
use crate::error::ModelError;
use crate::model::{Batch, Model};
use crate::stats::VersionStats;

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Output {
    /// `rows * cols` values, row-major.
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    /// The version that computed it.
    pub version: u64,
    /// Time spent waiting in the batcher queue.
    pub queue: Duration,
    /// Time of the forward pass (input + infer + output) of the batch it rode in.
    pub compute: Duration,
    /// Rows in that batch.
    pub batch_rows: usize,
}

/// A request waiting for its batch. Holding it holds one admission permit, so
/// the permit returns when the request is answered or dropped.
pub struct Pending {
    pub data: Vec<f32>,
    pub rows: usize,
    pub enqueued_at: Instant,
    pub deadline: Instant,
    pub reply: oneshot::Sender<Result<Output, ModelError>>,
    pub span: tracing::Span,
    pub(crate) _permit: OwnedSemaphorePermit,
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
    pub fn pairs(&self) -> [(&'static str, String); 3] {
        [
            ("model", self.model.to_string()),
            ("version", self.version_label.clone()),
            ("replica", self.replica_label.clone()),
        ]
    }
}

/// One formed batch and the requests it answers.
pub(crate) struct RunBatch {
    pub batch: Batch,
    pub items: Vec<Pending>,
}

impl Message for RunBatch {
    /// The forward-pass time, or `None` when nothing was computed.
    type Result = Option<Duration>;
}

pub(crate) struct Runner {
    model: Box<dyn Model>,
    stats: Arc<VersionStats>,
    labels: Labels,
    meters: Arc<crate::stats::Meters>,
}

impl Runner {
    pub fn new(
        model: Box<dyn Model>,
        stats: Arc<VersionStats>,
        labels: Labels,
        meters: Arc<crate::stats::Meters>,
    ) -> Self {
        Self {
            model,
            stats,
            labels,
            meters,
        }
    }
}

impl Actor for Runner {
    type Context = SyncContext<Self>;
}

impl Handler<RunBatch> for Runner {
    type Result = Option<Duration>;

    fn handle(&mut self, msg: RunBatch, _: &mut Self::Context) -> Self::Result {
        let RunBatch { batch, items } = msg;
        // Everyone left while the batch waited for this runner: skip the work.
        if items.iter().all(|p| p.reply.is_closed()) {
            self.meters.cancelled.increment(items.len() as u64);
            return None;
        }
        let started = Instant::now();
        for p in &items {
            let waited = started.saturating_duration_since(p.enqueued_at);
            self.stats.queue.add(1, waited);
            self.meters.queue_wait.record(waited.as_secs_f64());
        }
        let result = self.model.forward(&batch);
        let compute = started.elapsed();
        self.meters.compute.record(compute.as_secs_f64());
        self.meters.batch_size.record(batch.rows as f64);
        let rows: Vec<usize> = items.iter().map(|p| p.rows).collect();
        match result.and_then(|f| {
            let parts = split(&f.data, f.cols, &rows).ok_or_else(|| {
                ModelError::Compute(format!(
                    "model returned {} values for {} rows",
                    f.data.len(),
                    batch.rows
                ))
            })?;
            Ok((f, parts))
        }) {
            Ok((f, parts)) => {
                self.stats.record_batch(
                    items.len() as u64,
                    batch.rows as u64,
                    f.input,
                    f.infer,
                    f.output,
                );
                for (p, data) in items.into_iter().zip(parts) {
                    tracing::trace!(parent: &p.span, rows = p.rows, batch_rows = batch.rows, "computed");
                    let _ = p.reply.send(Ok(Output {
                        data,
                        rows: p.rows,
                        cols: f.cols,
                        version: self.labels.version,
                        queue: started.saturating_duration_since(p.enqueued_at),
                        compute,
                        batch_rows: batch.rows,
                    }));
                }
            }
            Err(e) => {
                tracing::error!(model = %self.labels.model, version = self.labels.version, error = %e, "forward pass failed");
                let msg = e.to_string();
                for p in items {
                    let _ = p.reply.send(Err(ModelError::Compute(msg.clone())));
                }
            }
        }
        Some(compute)
    }
}
