//! A served model version: admission, the call into its actor group's queue, and
//! its stats.
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::gauge;
use tokio::sync::{oneshot, Semaphore};
use tracing::Instrument;

use crate::batcher::{Pending, Queue, Refusal};
use crate::batching::Policy;
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::model::{Batch, Model, ModelFactory};
use crate::runner::{answer, forward, Labels, Output, Runner};
use crate::stats::{names, VersionStats};
use crate::system::ActorSystem;

/// One loaded version of a model (one actor group of it). Cheap to share; dropping
/// the handle stops its runners once they finish the batch in hand.
pub struct VersionHandle {
    pub config: Arc<ModelConfig>,
    pub version: u64,
    /// Which actor group of the version this is (0-based).
    pub replica: usize,
    queue: Arc<Queue>,
    permits: Arc<Semaphore>,
    capacity: usize,
    pub stats: Arc<VersionStats>,
    ready: AtomicBool,
    labels: Labels,
    meters: Arc<crate::stats::Meters>,
    /// Computing on the callers' threads; `None` when it is off.
    inline: Option<Inline>,
}

/// `[batching] inline_below_us` and the instance of the model that callers compute
/// on themselves. The instance is taken away (`None`) if a forward pass on it
/// panics: the version then only queues.
struct Inline {
    limit: Duration,
    instance: parking_lot::Mutex<Option<Box<dyn Model>>>,
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
    /// Starts the queue and `runner_instances` runner threads of one version on
    /// `system`. The version is not ready until [`VersionHandle::mark_ready`] (after
    /// warmup).
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
            idle_spin: b.idle_spin(),
        };
        let cols = config.input().row_width();
        let labels = Labels::new(Arc::from(config.name.as_str()), version, replica);
        let stats = Arc::new(VersionStats::default());
        let models: Vec<_> = (0..instances)
            .map(|_| {
                let model = factory();
                let device = model.device_lock();
                (model, device)
            })
            .collect();
        let on_device = models.iter().any(|(_, device)| device.is_some());
        let meters = Arc::new(crate::stats::Meters::new(
            &config.name,
            version,
            replica,
            on_device,
        ));
        let queue = Arc::new(Queue::new(policy, instances, meters.clone()));
        let inline = b.inline_below().map(|limit| Inline {
            limit,
            instance: parking_lot::Mutex::new(Some(factory())),
        });
        let runners = models
            .into_iter()
            .enumerate()
            .map(|(slot, (model, device))| Runner {
                model,
                device,
                queue: queue.clone(),
                slot,
                cols,
                stats: stats.clone(),
                labels: labels.clone(),
                meters: meters.clone(),
            })
            .collect();
        system
            .spawn_group(&queue, runners)
            .map_err(|e| ModelError::Load {
                model: config.name.clone(),
                version,
                msg: format!("starting the runner threads: {e}"),
            })?;
        gauge!(names::QUEUE_CAPACITY, &labels.pairs()).set(capacity as f64);
        Ok(Self {
            config,
            version,
            replica,
            queue,
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            stats,
            ready: AtomicBool::new(false),
            labels,
            meters,
            inline,
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

    /// The expected time of a full batch now (what admission counts in).
    pub fn batch_time(&self) -> Duration {
        self.queue
            .batch_time(self.config.batching.max_batch_size.get())
    }

    /// Whether a request of `rows` rows with `deadline` would be admitted now by
    /// the deadline rule (`batching::admit`); nothing is queued. What a caller asks
    /// before it spends work on a request (a decision's feature lookup) that the
    /// model would refuse anyway.
    pub fn would_admit(&self, rows: usize, deadline: Instant) -> Result<(), ModelError> {
        self.queue
            .would_admit(rows, deadline)
            .map_err(|r| self.refused(r))
    }

    /// Runs `batch` through the actor group. Fails at once with `InvalidInput` when
    /// the batch does not fit the model, with `Overloaded` when the queue is full,
    /// with `CannotMeetDeadline` when its answer is expected after `deadline`
    /// (default: the model's timeout; see `batching::admit`), and with
    /// `DeadlineExceeded` at `deadline` whatever the state of the queue. An answer
    /// computed after the deadline is `DeadlineExceeded` too, never `Ok`.
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
        if let Some(answer) = self.try_inline(&batch, deadline) {
            drop(permit);
            self.meters.in_flight.set(self.in_flight() as f64);
            return answer;
        }
        let (tx, rx) = oneshot::channel();
        let span = tracing::debug_span!("model", model = %self.config.name, version = self.version);
        let pushed = self.queue.push(Pending {
            data: batch.data,
            rows: batch.rows,
            enqueued_at: Instant::now(),
            deadline,
            reply: tx,
            span: span.clone(),
            _permit: permit,
        });
        if let Err(refusal) = pushed {
            self.meters.in_flight.set(self.in_flight() as f64);
            return Err(self.refused(refusal));
        }
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

    /// Computes `batch` on the caller's thread when `[batching] inline_below_us`
    /// allows it now (see `Queue::inline_ok`) and the instance kept for it is free;
    /// `None` when the request is to be queued. The request is recorded as a batch
    /// of its own that waited 0 in the queue.
    fn try_inline(&self, batch: &Batch, deadline: Instant) -> Option<Result<Output, ModelError>> {
        let inline = self.inline.as_ref()?;
        if !self.queue.inline_ok(batch.rows, inline.limit, deadline) {
            return None;
        }
        let mut instance = inline.instance.try_lock()?;
        let model = instance.as_mut()?;
        self.meters.inline.increment(1);
        self.stats.queue.add(1, Duration::ZERO);
        self.meters.queue_wait.record(0.0);
        let rows = [batch.rows];
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            forward(&mut **model, batch, &rows, &self.stats, &self.meters)
        }));
        let Ok((compute, done, result)) = run else {
            // The instance may be left broken: no further call uses it.
            *instance = None;
            let e = ModelError::Compute("the forward pass panicked".into());
            self.labels.log_failure(&e);
            tracing::error!(model = %self.config.name, version = self.version,
                "computing on the callers' threads is off for this version from now on");
            return Some(Err(e));
        };
        drop(instance);
        self.queue.observe(batch.rows, compute);
        Some(match result {
            Ok((cols, mut parts)) => answer(done, deadline, &self.meters, || Output {
                data: parts.pop().unwrap_or_default(),
                rows: batch.rows,
                cols,
                version: self.version,
                queue: Duration::ZERO,
                compute,
                batch_rows: batch.rows,
            }),
            Err(e) => {
                self.labels.log_failure(&e);
                Err(e)
            }
        })
    }

    fn refused(&self, r: Refusal) -> ModelError {
        match r {
            Refusal::Closed => ModelError::Unavailable {
                model: self.config.name.clone(),
                version: self.version,
            },
            Refusal::Deadline {
                expected,
                remaining,
                load,
            } => ModelError::CannotMeetDeadline {
                model: self.config.name.clone(),
                version: self.version,
                expected,
                remaining,
                batches_ahead: load.batches_ahead(),
                batch_time: load.batch_time,
                runners: load.runners,
            },
        }
    }
}

impl Drop for VersionHandle {
    fn drop(&mut self) {
        self.queue.close();
    }
}
