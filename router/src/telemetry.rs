//! Logs (tracing-subscriber, human or JSON) and the Prometheus recorder behind the
//! `metrics` facade. Both are process-wide and installed once.
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The router's metric names, in one place (the other crates name theirs:
/// `mesh_model_*` in model-actor's `stats`, `mesh_features_*` in feature-store's
/// `metrics`, `mesh_log_*` in prediction-log, the stack's in mesh-stack's `metrics`).
pub mod names {
    /// Counter: finished requests by `model`, `version`, `protocol`, `code`:
    /// OIP (`protocol` = grpc | http) and decisions (`protocol` = decide: one per
    /// Decide or DecideBatch call; `version` is the answering version of a Decide
    /// scored by a model, else empty). Unknown models are `model="unknown"`.
    pub const REQUESTS: &str = "mesh_router_requests_total";
    /// Histogram: time from the request's arrival (`crate::arrival`) to its answer
    /// ready, by `model`, `protocol` (the same protocols).
    pub const REQUEST_DURATION: &str = "mesh_router_request_duration_seconds";
    /// Counter: decisions by `model`, `source`, `decision`, `role`.
    pub const DECISIONS: &str = "mesh_router_decisions_total";
    /// Counter: answers that came from a fallback, by `model`, `source`.
    pub const FALLBACKS: &str = "mesh_router_fallbacks_total";
    /// Histogram: time per decision stage (`stage` = validate, features, preprocess,
    /// queue, compute, postprocess, total).
    pub const STAGE: &str = "mesh_router_stage_seconds";
    /// Counter: features a decision filled with its spec's default (unknown entity,
    /// NULL, OUTSIDE_MAX_AGE, a failed lookup, a request feature not sent), by
    /// `model` and `view` (`request` for request features).
    pub const DEFAULTED_FEATURES: &str = "mesh_router_defaulted_features_total";
    /// Counter: feature lookups of decisions that failed (the store could not be
    /// read, a remote features role did not answer in time or answered an error),
    /// by `store` (`local` or `remote`); each such decision took its spec's defaults.
    pub const FEATURE_LOOKUP_FAILURES: &str = "mesh_router_feature_lookup_failures_total";
    /// Counter: resolutions of a `remote` replica name that failed or found no
    /// address (the last good addresses stayed), by `name`.
    pub const RESOLVE_FAILURES: &str = "mesh_router_resolve_failures_total";
    /// Gauge: addresses (replicas) a `remote` name stands for now, by `name`.
    pub const RESOLVED_ADDRESSES: &str = "mesh_router_resolved_addresses";
    /// Gauge: connections open on the gRPC and HTTP ports together.
    pub const OPEN_CONNECTIONS: &str = "mesh_router_open_connections";
    /// Counter: connections closed because nothing arrived for `idle_timeout`.
    pub const IDLE_CLOSED: &str = "mesh_router_idle_connections_closed_total";
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" => Ok(Self::Human),
            "json" => Ok(Self::Json),
            _ => Err(format!("unknown log format '{s}' (human or json)")),
        }
    }
}

/// Installs the tracing subscriber (filter from `RUST_LOG`, default `info`): what
/// `mesh serve` uses.
pub fn init_logs(format: LogFormat) {
    init_logs_at(format, "info");
}

/// Installs the tracing subscriber, filtered by `RUST_LOG` or else `default` (the
/// CLI's one-shot commands use `warn`: their own output is the summary). Human
/// lines are coloured only when stderr is a terminal, so a log written to a file
/// holds no escape codes.
pub fn init_logs_at(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

/// Latency buckets of the router's own histograms: 25 µs to 2.5 s, about ×2.5 a
/// step, fine enough below a millisecond where most requests finish.
const ROUTER_LATENCY: &[f64] = &[
    0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5,
];

/// Buckets of every crate: exact names first (they win over the suffix rule).
fn builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in mesh_model_actor::stats::buckets() {
        b = b.set_buckets_for_metric(Matcher::Full(name.to_owned()), &buckets)?;
    }
    for (name, buckets) in mesh_feature_store::metrics::histogram_buckets() {
        b = b.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)?;
    }
    b.set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), ROUTER_LATENCY)
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often the `metrics-upkeep` thread drains the histograms' samples.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The process's Prometheus recorder (installed on first call).
pub fn metrics() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let b = builder().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "histogram buckets rejected; using summaries");
                PrometheusBuilder::new()
            });
            let recorder = b.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics shows only this handle's view");
            }
            // Histogram upkeep (drains the samples every request records into the
            // histograms) off the request path, under SCHED_IDLE: at normal priority, its
            // burst every 5 s (3-4 ms at 14,500 Decide/s) held a woken serving thread off
            // its core for the rest of the scheduler slice (`perf sched`, the server on a
            // core of its own). Every second, so that the burst and the samples waiting
            // in memory stay small; a scrape drains what waits itself.
            let h = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    if let Err(e) = mesh_prediction_log::priority::set_current_thread_idle() {
                        tracing::debug!(error = %e, "metrics upkeep runs at the serving threads' priority");
                    }
                    loop {
                        std::thread::sleep(UPKEEP_INTERVAL);
                        h.run_upkeep();
                    }
                })
                .ok();
            handle
        })
        .clone()
}

type OkMeters = (metrics::Counter, metrics::Histogram);

/// Counts one answer of (model, version, protocol) in the success counter and its
/// duration in the histogram. The handles are registered on first use and kept per
/// thread: the common case of every front door (OIP and Decide) takes no lock and
/// no reference count shared with the other serving threads. `None` is an answer no
/// version gave (a decision from a fallback), labelled `version=""`. The callers
/// pass only models and versions the mesh serves, so each thread keeps a handful.
pub fn record_ok(model: &str, version: Option<u64>, protocol: &'static str, took: Duration) {
    use std::cell::RefCell;
    use std::collections::HashMap;
    // By model first, so that a lookup borrows the model's name (no copy per request).
    type ByModel = HashMap<String, HashMap<(Option<u64>, &'static str), OkMeters>>;
    thread_local! {
        static CACHE: RefCell<ByModel> = RefCell::new(HashMap::new());
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let meters = match cache.get(model).and_then(|m| m.get(&(version, protocol))) {
            Some(m) => m,
            None => cache
                .entry(model.to_owned())
                .or_default()
                .entry((version, protocol))
                .or_insert_with(|| {
                    (
                        metrics::counter!(names::REQUESTS, "model" => model.to_owned(), "version" => version.map(|v| v.to_string()).unwrap_or_default(), "protocol" => protocol, "code" => "ok"),
                        metrics::histogram!(names::REQUEST_DURATION, "model" => model.to_owned(), "protocol" => protocol),
                    )
                }),
        };
        meters.0.increment(1);
        meters.1.record(took.as_secs_f64());
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The value of the series whose line starts with `prefix` in the rendered text.
    fn series(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    }

    /// The histograms' upkeep runs on a thread of its own under SCHED_IDLE, so that its
    /// bursts never hold a serving thread off the CPU.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_metrics_upkeep_thread_runs_under_sched_idle() {
        const SCHED_IDLE: i64 = 5;
        let _ = metrics();
        // The policy (field 41 of a stat line) of the threads named metrics-upkeep.
        let upkeep = || -> Vec<i64> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| {
                    let t = t.ok()?.path();
                    let comm = std::fs::read_to_string(t.join("comm")).ok()?;
                    (comm.trim_end() == "metrics-upkeep").then_some(())?;
                    let stat = std::fs::read_to_string(t.join("stat")).ok()?;
                    stat.rsplit_once(") ")?
                        .1
                        .split_whitespace()
                        .nth(41 - 3)?
                        .parse()
                        .ok()
                })
                .collect()
        };
        // The thread sets its policy as it starts: give it a moment on a busy machine.
        let mut found = upkeep();
        for _ in 0..100 {
            if found == [SCHED_IDLE] {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            found = upkeep();
        }
        assert_eq!(
            found,
            [SCHED_IDLE],
            "policies of the metrics-upkeep threads"
        );
    }

    /// Each thread keeps its own handles; what they count is one series.
    #[test]
    fn answers_counted_on_many_threads_add_up_in_one_series() {
        let handle = metrics();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..100 {
                        record_ok("record-ok-test", Some(7), "http", Duration::from_micros(40));
                    }
                    record_ok("record-ok-test", None, "decide", Duration::from_micros(40));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = handle.render();
        let ok = |version: &str, protocol: &str| {
            series(
                &text,
                &format!(
                    "mesh_router_requests_total{{model=\"record-ok-test\",version=\"{version}\",protocol=\"{protocol}\",code=\"ok\"}}"
                ),
            )
        };
        assert_eq!(ok("7", "http"), 300.0, "{text}");
        assert_eq!(ok("", "decide"), 3.0, "{text}");
        let count = series(
            &text,
            "mesh_router_request_duration_seconds_count{model=\"record-ok-test\",protocol=\"http\"}",
        );
        assert_eq!(count, 300.0, "{text}");
    }
}
