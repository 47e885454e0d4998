//! The Open Inference Protocol v2 front end: the gRPC service (with Triton's
//! extensions), its REST mirror, and the inference core both share.
pub mod codec;
pub mod grpc;
pub mod http;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_model_actor::{Batch, ModelRepository, Output, VersionHandle};
use metrics::{counter, histogram};
use tracing::Instrument;

use crate::error::RouterError;

/// Metric names of the serving front end.
pub mod names {
    /// Counter: finished requests by `model`, `version`, `protocol`, `code`.
    pub const REQUESTS: &str = "mesh_router_requests_total";
    /// Histogram: time from request decoded to answer ready, by `model`, `protocol`.
    pub const REQUEST_DURATION: &str = "mesh_router_request_duration_seconds";
}

/// Limits on what one request may carry.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request message, bytes (gRPC message or HTTP body).
    pub max_message_bytes: usize,
    /// Upper bound on any request's deadline.
    pub max_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 << 20,
            max_timeout: Duration::from_secs(30),
        }
    }
}

/// What both protocols serve from.
#[derive(Clone)]
pub struct Core {
    pub repo: Arc<ModelRepository>,
    pub limits: Limits,
    /// Where OIP predictions are logged (one record per row).
    pub log: Option<mesh_prediction_log::PredictionLogHandle>,
}

type OkMeters = (metrics::Counter, metrics::Histogram);

/// The success counter and duration histogram of (model, version, protocol),
/// registered on first use.
fn ok_meters(model: &str, version: u64, protocol: &'static str) -> OkMeters {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static CACHE: OnceLock<parking_lot::RwLock<HashMap<(String, u64, &'static str), OkMeters>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (model.to_owned(), version, protocol);
    if let Some(m) = cache.read().get(&key) {
        return m.clone();
    }
    let m = (
        counter!(names::REQUESTS, "model" => model.to_owned(), "version" => version.to_string(), "protocol" => protocol, "code" => "ok"),
        histogram!(names::REQUEST_DURATION, "model" => model.to_owned(), "protocol" => protocol),
    );
    cache.write().insert(key, m.clone());
    m
}

/// One line per request at debug; failures the server caused at warn, the
/// caller's own mistakes at debug (they are the caller's to log). The request id
/// is a field of the line itself, so a warn line carries it even when the
/// per-request span (debug level: free when debug is off) is not recorded.
pub(crate) fn log_result<T>(result: &Result<T, RouterError>, started: Instant, request_id: &str) {
    let us = started.elapsed().as_micros() as u64;
    match result {
        Ok(_) => tracing::debug!(request_id, latency_us = us, "answered"),
        Err(e) if e.is_server_side() => {
            tracing::warn!(request_id, latency_us = us, code = e.code_label(), error = %e, "request failed")
        }
        Err(e) => {
            tracing::debug!(request_id, latency_us = us, code = e.code_label(), error = %e, "request rejected")
        }
    }
}

/// An id for requests that bring none: process start time and a counter.
fn next_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u128> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0)
    });
    format!("oip-{start:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// `""` means "newest ready"; anything else must be a version number.
pub fn parse_version(model: &str, v: &str) -> Result<Option<u64>, RouterError> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<u64>().map(Some).map_err(|_| {
        RouterError::NotFound(format!(
            "model '{model}' has no version '{v}' (versions are numbers)"
        ))
    })
}

impl Core {
    /// Resolves the version and runs the batch through its actors, recording the
    /// request metrics. `timeout` is the caller's (already capped by `max_timeout`).
    pub async fn infer(
        &self,
        protocol: &'static str,
        model: &str,
        version: Option<u64>,
        request_id: &str,
        make_batch: impl FnOnce(&VersionHandle) -> Result<Batch, RouterError>,
        timeout: Option<Duration>,
    ) -> Result<(Arc<VersionHandle>, Output), RouterError> {
        let started = Instant::now();
        let mut validate = Duration::ZERO;
        // The id that logs and the prediction log share. Generated only when the caller
        // sent none and something will record it: the hot path stays allocation-free.
        let id: std::borrow::Cow<'_, str> = if request_id.is_empty()
            && (self.log.is_some() || tracing::enabled!(tracing::Level::DEBUG))
        {
            next_request_id().into()
        } else {
            request_id.into()
        };
        // Debug level: spans and per-request lines cost about 12% of OIP throughput
        // (`mesh bench --target infer`, see README), so the default `info` skips them.
        let span = tracing::debug_span!("infer", request_id = %id, model, protocol);
        let result = async {
            let handle = self.repo.get(model, version)?;
            let batch = make_batch(&handle)?;
            validate = started.elapsed();
            let timeout = timeout
                .unwrap_or_else(|| handle.config.batching.default_timeout())
                .min(self.limits.max_timeout);
            let out = handle.infer(batch, Some(started + timeout)).await?;
            Ok::<_, RouterError>((handle, out))
        }
        .instrument(span.clone())
        .await;
        span.in_scope(|| log_result(&result, started, &id));
        match &result {
            Ok((h, _)) => {
                // The common case touches only cached handles.
                let (ok, duration) = ok_meters(h.name(), h.version, protocol);
                ok.increment(1);
                duration.record(started.elapsed().as_secs_f64());
            }
            Err(e) => {
                // Unknown model names are client input: keep them out of label values.
                let model_label = if self.repo.model(model).is_ok() {
                    model.to_owned()
                } else {
                    "unknown".to_owned()
                };
                let version_label = version.map(|v| v.to_string()).unwrap_or_default();
                counter!(names::REQUESTS, "model" => model_label.clone(), "version" => version_label, "protocol" => protocol, "code" => e.code_label())
                    .increment(1);
                histogram!(names::REQUEST_DURATION, "model" => model_label, "protocol" => protocol)
                    .record(started.elapsed().as_secs_f64());
            }
        }
        if let (Some(log), Ok((h, out))) = (&self.log, &result) {
            let us = |d: Duration| d.as_micros() as u64;
            let stages = mesh_prediction_log::StageMicros {
                validate: us(validate),
                queue: us(out.queue),
                compute: us(out.compute),
                total: us(started.elapsed()),
                ..Default::default()
            };
            crate::plog::record_oip(log, &id, h.name(), out.version, &out.data, out.cols, stages);
        }
        result
    }

    /// Whether every loaded model has a ready version (and there is at least one).
    pub fn ready(&self) -> bool {
        let models = self.repo.models();
        !models.is_empty() && models.iter().all(|m| m.newest().is_some())
    }
}

/// The caller's deadline budget from a gRPC request's `grpc-timeout` header.
pub fn timeout_of<T>(req: &tonic::Request<T>) -> Option<Duration> {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// Parses a `grpc-timeout` header value (`<digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn versions_are_numbers() {
        assert_eq!(parse_version("m", "").unwrap(), None);
        assert_eq!(parse_version("m", "3").unwrap(), Some(3));
        assert!(matches!(
            parse_version("m", "latest"),
            Err(RouterError::NotFound(_))
        ));
    }
}
