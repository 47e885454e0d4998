//! Per-version statistics in Triton's shape (what ModelStatistics returns and
//! perf_analyzer turns into its server-side breakdown), and the Prometheus metrics
//! of the model actors.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Metric names of this crate.
pub mod names {
    /// Histogram: time a request waited in the batcher queue, and for its device when
    /// that runs one pass at a time (a GPU: `crate::device`).
    pub const QUEUE_WAIT: &str = "mesh_model_queue_wait_seconds";
    /// Histogram: time a batch, once assembled, waited for its device, for models whose
    /// device runs one pass at a time (a GPU: `crate::device`); part of `QUEUE_WAIT`.
    /// Recorded once a batch; a CPU model has none.
    pub const DEVICE_WAIT: &str = "mesh_model_device_wait_seconds";
    /// Histogram: forward-pass time of one batch (input + infer + output).
    pub const COMPUTE: &str = "mesh_model_compute_seconds";
    /// Histogram: rows per executed batch.
    pub const BATCH_SIZE: &str = "mesh_model_batch_size";
    /// Gauge: requests waiting in the batcher queue.
    pub const QUEUE_LENGTH: &str = "mesh_model_queue_length";
    /// Gauge: requests admitted (waiting or running) against the queue capacity.
    pub const IN_FLIGHT: &str = "mesh_model_in_flight_requests";
    /// Gauge: the queue capacity (so dashboards can show how full it is).
    pub const QUEUE_CAPACITY: &str = "mesh_model_queue_capacity";
    /// Counter: requests not answered by the model, by `reason`: `overloaded` (the
    /// queue was full), `cannot_meet_deadline` (refused at admission: the answer was
    /// expected after the deadline), `expired` (the deadline passed while it waited
    /// in the queue, or would have before its batch could finish), `cancelled` (the caller went away), `late` (computed, but the
    /// answer was ready after the deadline, so it was not given).
    pub const DROPPED: &str = "mesh_model_dropped_requests_total";
    /// Gauge: 1 for each version that is loaded and ready.
    pub const READY: &str = "mesh_model_ready";
    /// Counter: times a runner ran out of work, by `outcome`: `spin_caught` (a
    /// request came during its spin: no sleep, no wake-up), `spin_empty` (the spin
    /// ended with nothing, then it slept), `slept` (it slept at once: requests come
    /// further apart than `[batching] idle_spin_us`, or the spin is off). Whether
    /// the spin pays: `spin_caught` against `spin_empty`.
    pub const RUNNER_IDLE: &str = "mesh_model_runner_idle_total";
    /// Counter: requests computed on the caller's thread (`[batching]
    /// inline_below_us`: they found the queue empty and the model's kept instance
    /// free) instead of queued for a runner.
    pub const INLINE: &str = "mesh_model_inline_requests_total";
}

/// Histogram buckets of this crate, chosen in one place. Latencies run from 10 µs
/// (a single-row CPU forward pass is a few µs) to 1 s, roughly ×2.5 per step, so
/// sub-millisecond work still lands in distinct buckets. Batch sizes are powers of two.
pub fn buckets() -> Vec<(&'static str, Vec<f64>)> {
    let latency = vec![
        0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
        0.05, 0.1, 0.25, 0.5, 1.0,
    ];
    let sizes = vec![
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ];
    vec![
        (names::QUEUE_WAIT, latency.clone()),
        (names::DEVICE_WAIT, latency.clone()),
        (names::COMPUTE, latency),
        (names::BATCH_SIZE, sizes),
    ]
}

/// The metric handles of one actor group, registered once (the request path only
/// touches atomics).
pub struct Meters {
    pub queue_length: metrics::Gauge,
    pub in_flight: metrics::Gauge,
    pub queue_wait: metrics::Histogram,
    pub device_wait: metrics::Histogram,
    pub compute: metrics::Histogram,
    pub batch_size: metrics::Histogram,
    pub expired: metrics::Counter,
    pub cancelled: metrics::Counter,
    pub overloaded: metrics::Counter,
    pub cannot_meet_deadline: metrics::Counter,
    pub late: metrics::Counter,
    pub idle_spin_caught: metrics::Counter,
    pub idle_spin_empty: metrics::Counter,
    pub idle_slept: metrics::Counter,
    pub inline: metrics::Counter,
}

impl Meters {
    /// The meters of one group; `on_device`: its model computes on a device whose passes
    /// take turns (only then is [`names::DEVICE_WAIT`] registered, and shown).
    pub fn new(model: &str, version: u64, replica: usize, on_device: bool) -> Self {
        let l = [
            ("model", model.to_owned()),
            ("version", version.to_string()),
            ("replica", replica.to_string()),
        ];
        let idle = |outcome: &'static str| metrics::counter!(names::RUNNER_IDLE, "model" => model.to_owned(), "version" => version.to_string(), "replica" => replica.to_string(), "outcome" => outcome);
        let dropped = |reason: &'static str| metrics::counter!(names::DROPPED, "model" => model.to_owned(), "version" => version.to_string(), "reason" => reason);
        Self {
            queue_length: metrics::gauge!(names::QUEUE_LENGTH, &l),
            in_flight: metrics::gauge!(names::IN_FLIGHT, &l),
            queue_wait: metrics::histogram!(names::QUEUE_WAIT, &l),
            device_wait: if on_device {
                metrics::histogram!(names::DEVICE_WAIT, &l)
            } else {
                metrics::Histogram::noop()
            },
            compute: metrics::histogram!(names::COMPUTE, &l),
            batch_size: metrics::histogram!(names::BATCH_SIZE, &l),
            expired: dropped("expired"),
            cancelled: dropped("cancelled"),
            overloaded: dropped("overloaded"),
            cannot_meet_deadline: dropped("cannot_meet_deadline"),
            late: dropped("late"),
            idle_spin_caught: idle("spin_caught"),
            idle_spin_empty: idle("spin_empty"),
            idle_slept: idle("slept"),
            inline: metrics::counter!(names::INLINE, &l),
        }
    }
}

/// A count and a total duration, as Triton's `StatisticDuration`.
#[derive(Debug, Default)]
pub struct Duration2 {
    pub count: AtomicU64,
    pub ns: AtomicU64,
}

impl Duration2 {
    pub fn add(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Relaxed);
        self.ns.fetch_add(d.as_nanos() as u64 * n, Relaxed);
    }
    pub fn get(&self) -> (u64, u64) {
        (self.count.load(Relaxed), self.ns.load(Relaxed))
    }
}

/// Compute time split of the batches of one size.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchStat {
    pub count: u64,
    pub input_ns: u64,
    pub infer_ns: u64,
    pub output_ns: u64,
}

/// Cumulative statistics of one model version; every field only grows.
#[derive(Debug, Default)]
pub struct VersionStats {
    pub success: Duration2,
    pub fail: Duration2,
    pub queue: Duration2,
    pub compute_input: Duration2,
    pub compute_infer: Duration2,
    pub compute_output: Duration2,
    /// Rows inferred.
    pub inference_count: AtomicU64,
    /// Batches executed.
    pub execution_count: AtomicU64,
    /// Milliseconds since the epoch of the last finished request.
    pub last_inference_ms: AtomicU64,
    pub by_batch_size: Mutex<BTreeMap<u64, BatchStat>>,
}

impl VersionStats {
    /// Records one executed batch of `requests` requests and `rows` rows.
    pub fn record_batch(
        &self,
        requests: u64,
        rows: u64,
        input: Duration,
        infer: Duration,
        output: Duration,
    ) {
        self.execution_count.fetch_add(1, Relaxed);
        self.inference_count.fetch_add(rows, Relaxed);
        // Triton counts compute per request: each request of the batch spent it.
        self.compute_input.add(requests, input);
        self.compute_infer.add(requests, infer);
        self.compute_output.add(requests, output);
        let mut m = self.by_batch_size.lock();
        let s = m.entry(rows).or_default();
        s.count += 1;
        s.input_ns += input.as_nanos() as u64;
        s.infer_ns += infer.as_nanos() as u64;
        s.output_ns += output.as_nanos() as u64;
    }

    /// Records the end of one request, successful or not, with its time in the server.
    pub fn record_request(&self, ok: bool, total: Duration) {
        if ok {
            self.success.add(1, total);
        } else {
            self.fail.add(1, total);
        }
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.last_inference_ms.store(ms, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_compute_is_counted_per_request() {
        let s = VersionStats::default();
        let ms = Duration::from_millis(1);
        s.record_batch(3, 5, ms, 2 * ms, ms);
        assert_eq!(s.compute_infer.get(), (3, 6_000_000));
        assert_eq!(s.inference_count.load(Relaxed), 5);
        assert_eq!(s.execution_count.load(Relaxed), 1);
        assert_eq!(s.by_batch_size.lock()[&5].count, 1);
    }
}
