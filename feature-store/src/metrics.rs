//! Metrics of the feature store, through the `metrics` facade. Names follow
//! `mesh_features_<thing>_<unit>`; labels are low-cardinality (view names come from
//! the views file, statuses and paths are fixed sets).
//!
//! The facade has no buckets; the exporter (in the `mesh` binary) sets them. The
//! buckets for this crate's histograms are chosen here, in one place:
use std::time::Duration;

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

pub(crate) fn record_lookup(elapsed: Duration, keys: usize) {
    metrics::histogram!(LOOKUP_SECONDS).record(elapsed.as_secs_f64());
    metrics::histogram!(KEYS_PER_LOOKUP).record(keys as f64);
}

pub(crate) fn record_values(view: &str, counts: &[u64; 5]) {
    for status in FeatureStatus::ALL {
        let n = counts[status.index()];
        if n > 0 {
            metrics::counter!(VALUES_TOTAL, "view" => view.to_owned(), "status" => status.as_str())
                .increment(n);
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
