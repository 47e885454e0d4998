//! A served model version: admission, the call into its batcher, and its stats.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, SyncArbiter};
use metrics::gauge;
use tokio::sync::{oneshot, Semaphore};
use tracing::Instrument;

use crate::batcher::Batcher;
use crate::batching::Policy;
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::model::{Batch, ModelFactory};
use crate::runner::{Labels, Output, Pending, Runner};
use crate::stats::{names, VersionStats};
use crate::system::ActorSystem;

/// One loaded version of a model. Cheap to share; dropping the last handle stops
/// its actors once the requests they hold are answered.
pub struct VersionHandle {
    pub config: Arc<ModelConfig>,
    pub version: u64,
    /// Which actor group of the version this is (0-based).
    pub replica: usize,
    batcher: Addr<Batcher>,
    permits: Arc<Semaphore>,
    capacity: usize,
    pub stats: Arc<VersionStats>,
    ready: AtomicBool,
    labels: Labels,
    meters: Arc<crate::stats::Meters>,
}

impl std::fmt::Debug for VersionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionHandle")
            .field("model", &self.config.name)
            .field("version", &self.version)
            .finish()
    }
}

impl VersionHandle {
    /// Starts the batcher and `runner_instances` runners of one version on `system`.
    /// The version is not ready until [`VersionHandle::mark_ready`] (after warmup).
    pub fn spawn(
        system: &ActorSystem,
        config: Arc<ModelConfig>,
        version: u64,
        replica: usize,
        factory: ModelFactory,
    ) -> Result<Self, ModelError> {
        let b = &config.batching;
        let instances = b.runner_instances.get();
        let capacity = b.queue_capacity.get();
        let policy = Policy {
            max_batch_size: b.max_batch_size.get(),
            max_queue_delay: b.max_queue_delay(),
            compute_reserve: Duration::from_micros(50),
        };
        let cols = config.input().row_width();
        let labels = Labels::new(Arc::from(config.name.as_str()), version, replica);
        let stats = Arc::new(VersionStats::default());
        let meters = Arc::new(crate::stats::Meters::new(&config.name, version, replica));
        let (st, lb, m1, m2) = (
            stats.clone(),
            labels.clone(),
            meters.clone(),
            meters.clone(),
        );
        let batcher = system
            .run(move || {
                let runner = SyncArbiter::start(instances, move || {
                    Runner::new(factory(), st.clone(), lb.clone(), m1.clone())
                });
                Batcher::new(runner, policy, cols, instances, m2).start()
            })
            .map_err(|e| ModelError::Load {
                model: config.name.clone(),
                version,
                msg: e.to_string(),
            })?;
        gauge!(names::QUEUE_CAPACITY, &labels.pairs()).set(capacity as f64);
        Ok(Self {
            config,
            version,
            replica,
            batcher,
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            stats,
            ready: AtomicBool::new(false),
            labels,
            meters,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
        gauge!(names::READY, &self.labels.pairs()).set(1.0);
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    /// Runs `batch` through the batcher. Fails at once with `Overloaded` when the
    /// queue is full, with `InvalidInput` when the batch does not fit the model, and
    /// with `DeadlineExceeded` at `deadline` (default: the model's timeout) whatever
    /// the state of the queue.
    pub async fn infer(
        &self,
        batch: Batch,
        deadline: Option<Instant>,
    ) -> Result<Output, ModelError> {
        let started = Instant::now();
        let result = self.infer_inner(batch, deadline, started).await;
        self.stats.record_request(result.is_ok(), started.elapsed());
        result
    }

    async fn infer_inner(
        &self,
        batch: Batch,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<Output, ModelError> {
        let max = self.config.batching.max_batch_size.get();
        let cols = self.config.input().row_width();
        if batch.rows == 0 || batch.rows > max {
            return Err(ModelError::InvalidInput(format!(
                "a request carries 1 to {max} rows for model '{}', not {}",
                self.config.name, batch.rows
            )));
        }
        if batch.cols != cols || batch.data.len() != batch.rows * cols {
            return Err(ModelError::InvalidInput(format!(
                "expected {} values ({} rows of {cols}), got {}",
                batch.rows * cols,
                batch.rows,
                batch.data.len()
            )));
        }
        // NaN only where model.toml declares missing values, category codes where
        // it declares categorical columns, never infinity.
        // Every caller (OIP, decisions, batch scoring) passes here, once.
        self.config.check_values(&batch.data, cols).map_err(|e| {
            ModelError::InvalidInput(format!("input '{}': {e}", self.config.input().name))
        })?;
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.meters.overloaded.increment(1);
            return Err(ModelError::Overloaded {
                model: self.config.name.clone(),
                version: self.version,
                capacity: self.capacity,
            });
        };
        self.meters.in_flight.set(self.in_flight() as f64);
        let deadline = deadline.unwrap_or(now + self.config.batching.default_timeout());
        let (tx, rx) = oneshot::channel();
        let span = tracing::debug_span!("model", model = %self.config.name, version = self.version);
        self.batcher.do_send(Pending {
            data: batch.data,
            rows: batch.rows,
            enqueued_at: Instant::now(),
            deadline,
            reply: tx,
            span: span.clone(),
            _permit: permit,
        });
        let res = tokio::time::timeout_at(deadline.into(), rx)
            .instrument(span)
            .await;
        self.meters.in_flight.set(self.in_flight() as f64);
        match res {
            Err(_) => Err(ModelError::DeadlineExceeded("waiting for the model")),
            Ok(Err(_)) => Err(ModelError::Unavailable {
                model: self.config.name.clone(),
                version: self.version,
            }),
            Ok(Ok(r)) => r,
        }
    }
}
