//! Metrics of the feature store, through the `metrics` facade. Names follow
//! `mesh_features_<thing>_<unit>`; labels are low-cardinality (view names come from
//! the views file, statuses and paths are fixed sets).
//!
//! The facade has no buckets; the exporter (in the `mesh` binary) sets them. The
//! buckets for this crate's histograms are chosen here, in one place:
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram};

use crate::types::{Durability, FeatureStatus};

pub const LOOKUP_SECONDS: &str = "mesh_features_lookup_seconds";
pub const KEYS_PER_LOOKUP: &str = "mesh_features_keys_per_lookup";
pub const VALUES_TOTAL: &str = "mesh_features_values_total";
pub const PUSH_SECONDS: &str = "mesh_features_push_seconds";
pub const ROWS_WRITTEN_TOTAL: &str = "mesh_features_rows_written_total";
pub const ROWS_SKIPPED_TOTAL: &str = "mesh_features_rows_skipped_older_total";
pub const STORE_SIZE_BYTES: &str = "mesh_features_store_size_bytes";
/// Counter: rows refused before anything was written, by `view`, `path`, `reason`.
pub const ROWS_REFUSED_TOTAL: &str = "mesh_features_rows_refused_total";
/// Counter: entity reads answered by the in-process cache (`result="hit"`) or
/// sent to the store, sled or Redis (`result="miss"`).
pub const CACHE_LOOKUPS_TOTAL: &str = "mesh_features_cache_lookups_total";
/// Gauge: bytes the in-process cache holds (estimated).
pub const CACHE_BYTES: &str = "mesh_features_cache_bytes";
/// Counter (Redis): failed backend round trips, by `op` (`lookup`, `write`) and
/// `reason` (`timeout`: past the lookup budget or write timeout; `error`).
pub const BACKEND_FAILURES_TOTAL: &str = "mesh_features_backend_failures_total";
/// Counter (Redis): entity rows of a lookup the backend did not answer in time,
/// by `view` and `served` (`cache`: the cached row, as OUTSIDE_MAX_AGE;
/// `unavailable`: nothing cached, UNAVAILABLE).
pub const FALLBACK_ROWS_TOTAL: &str = "mesh_features_fallback_rows_total";

/// Lookup latency: a cached sled read is a few µs and the aim for 100 keys is
/// under 1 ms at p99, so the buckets are dense from 10 µs to 5 ms, with a tail to
/// 100 ms to see stalls (sled flushes, cold pages).
pub const LOOKUP_SECONDS_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.002, 0.005, 0.01,
    0.025, 0.1,
];
/// Keys per lookup: the router sends one to a few per decision, batch callers up
/// to the limit (4096 by default).
pub const KEYS_PER_LOOKUP_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 4096.0,
];
/// Push latency: buffered pushes cost like a lookup; synced ones add an fsync
/// (milliseconds).
pub const PUSH_SECONDS_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

/// `(metric name, buckets)` for every histogram of this crate, for the exporter.
pub fn histogram_buckets() -> [(&'static str, &'static [f64]); 3] {
    [
        (LOOKUP_SECONDS, LOOKUP_SECONDS_BUCKETS),
        (KEYS_PER_LOOKUP, KEYS_PER_LOOKUP_BUCKETS),
        (PUSH_SECONDS, PUSH_SECONDS_BUCKETS),
    ]
}

/// The handles every lookup records into, registered on first use and kept: a
/// `counter!`/`histogram!` call builds, hashes and looks up its key in the registry
/// each time (and copies the view's name into it), where a kept handle is one atomic
/// add. Each handle is registered when first needed, so a status a view never
/// answered still has no series. Handles belong to the recorder that was current when
/// they were registered: the process's global one when serving.
pub(crate) struct LookupMeters {
    seconds: OnceLock<Histogram>,
    keys: OnceLock<Histogram>,
    /// By view index, then [`FeatureStatus::index`].
    values: Vec<[OnceLock<Counter>; 5]>,
}

impl LookupMeters {
    /// Handles for the store's views (none registered yet).
    pub(crate) fn new(views: usize) -> Self {
        Self {
            seconds: OnceLock::new(),
            keys: OnceLock::new(),
            values: (0..views).map(|_| Default::default()).collect(),
        }
    }

    pub(crate) fn record_lookup(&self, elapsed: Duration, keys: usize) {
        self.seconds
            .get_or_init(|| metrics::histogram!(LOOKUP_SECONDS))
            .record(elapsed.as_secs_f64());
        self.keys
            .get_or_init(|| metrics::histogram!(KEYS_PER_LOOKUP))
            .record(keys as f64);
    }

    /// Adds one lookup's values of view `index` (named `view`) by status.
    pub(crate) fn record_values(&self, index: usize, view: &str, counts: &[u64; 5]) {
        let Some(counters) = self.values.get(index) else {
            return;
        };
        for status in FeatureStatus::ALL {
            let n = counts[status.index()];
            if n > 0 {
                counters[status.index()]
                    .get_or_init(|| {
                        metrics::counter!(VALUES_TOTAL, "view" => view.to_owned(), "status" => status.as_str())
                    })
                    .increment(n);
            }
        }
    }
}

pub(crate) fn record_push_latency(durability: Durability, elapsed: Duration) {
    let d = match durability {
        Durability::Buffered => "buffered",
        Durability::Sync => "sync",
    };
    metrics::histogram!(PUSH_SECONDS, "durability" => d).record(elapsed.as_secs_f64());
}

pub(crate) fn record_rows_written(view: &str, path: &'static str, written: u64, skipped: u64) {
    metrics::counter!(ROWS_WRITTEN_TOTAL, "view" => view.to_owned(), "path" => path)
        .increment(written);
    if skipped > 0 {
        metrics::counter!(ROWS_SKIPPED_TOTAL, "view" => view.to_owned(), "path" => path)
            .increment(skipped);
    }
}

pub(crate) fn record_rows_refused(view: &str, path: &'static str, reason: &'static str, n: u64) {
    metrics::counter!(ROWS_REFUSED_TOTAL, "view" => view.to_owned(), "path" => path, "reason" => reason)
        .increment(n);
}

pub(crate) fn record_store_size(bytes: u64) {
    metrics::gauge!(STORE_SIZE_BYTES).set(bytes as f64);
}

pub(crate) fn record_cache(hits: u64, misses: u64) {
    if hits > 0 {
        metrics::counter!(CACHE_LOOKUPS_TOTAL, "result" => "hit").increment(hits);
    }
    if misses > 0 {
        metrics::counter!(CACHE_LOOKUPS_TOTAL, "result" => "miss").increment(misses);
    }
}

pub(crate) fn record_cache_bytes(bytes: usize) {
    metrics::gauge!(CACHE_BYTES).set(bytes as f64);
}

pub(crate) fn record_backend_failure(op: &'static str, reason: &'static str) {
    metrics::counter!(BACKEND_FAILURES_TOTAL, "op" => op, "reason" => reason).increment(1);
}

pub(crate) fn record_fallback_rows(view: &str, served: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(FALLBACK_ROWS_TOTAL, "view" => view.to_owned(), "served" => served)
            .increment(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Handles registered, and each counter's total by its label values.
    type Seen = (usize, Vec<(String, u64)>);

    #[derive(Default, Clone)]
    struct Recorder(Arc<Mutex<Seen>>);

    struct Handle(Recorder, String);

    impl metrics::CounterFn for Handle {
        fn increment(&self, value: u64) {
            let mut g = (self.0).0.lock().unwrap();
            match g.1.iter_mut().find(|(k, _)| *k == self.1) {
                Some((_, v)) => *v += value,
                None => g.1.push((self.1.clone(), value)),
            }
        }
        fn absolute(&self, _: u64) {}
    }

    impl metrics::HistogramFn for Handle {
        fn record(&self, _: f64) {}
    }

    impl Recorder {
        fn handle(&self, key: &metrics::Key) -> Arc<Handle> {
            self.0.lock().unwrap().0 += 1;
            let labels: Vec<String> = key.labels().map(|l| l.value().to_owned()).collect();
            Arc::new(Handle(self.clone(), labels.join(",")))
        }
    }

    impl metrics::Recorder for Recorder {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> Counter {
            Counter::from_arc(self.handle(key))
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.handle(key))
        }
    }

    /// Every handle is registered at its first use only, a status never seen has no
    /// series, and each lookup's counts add up in the kept handles.
    #[test]
    fn lookup_handles_are_registered_once_and_add_up() {
        let rec = Recorder::default();
        let meters = LookupMeters::new(2);
        let registered = || rec.0.lock().unwrap().0;
        metrics::with_local_recorder(&rec, || {
            meters.record_lookup(Duration::from_micros(40), 3);
            meters.record_values(0, "card", &[2, 1, 0, 0, 0]);
            assert_eq!(registered(), 4, "two histograms, two statuses of card");
            meters.record_lookup(Duration::from_micros(40), 3);
            meters.record_values(0, "card", &[3, 0, 0, 0, 0]);
            assert_eq!(registered(), 4, "nothing new");
            meters.record_values(1, "merchant", &[0, 0, 0, 5, 0]);
            meters.record_values(7, "no such view", &[1, 0, 0, 0, 0]);
            assert_eq!(registered(), 5);
        });
        let mut totals = rec.0.lock().unwrap().1.clone();
        totals.sort();
        let want = [
            ("card,not_found", 1),
            ("card,present", 5),
            ("merchant,outside_max_age", 5),
        ]
        .map(|(k, v)| (k.to_string(), v));
        assert_eq!(totals, want);
    }
}
