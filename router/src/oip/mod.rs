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
use crate::request::{check_request_id, log_result, next_request_id};
use crate::telemetry::names;

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

impl Core {
    /// Resolves the version and runs the batch through its actors, recording the
    /// request metrics. The deadline counts from `arrival` (see [`crate::arrival`]):
    /// the caller's `timeout`, else the model's default, capped by `max_timeout`. A
    /// request already past it is refused before its inputs are decoded; an answer
    /// ready after it is `DEADLINE_EXCEEDED`, never `ok`.
    pub async fn infer(
        &self,
        protocol: &'static str,
        model: &str,
        version: Option<u64>,
        request_id: &str,
        make_batch: impl FnOnce(&VersionHandle) -> Result<Batch, RouterError>,
        (arrival, timeout): (Instant, Option<Duration>),
    ) -> Result<(Arc<VersionHandle>, Output), RouterError> {
        // Durations and the log's total count from arrival; `validate` from here.
        let started = arrival;
        let handler = Instant::now();
        let mut validate = Duration::ZERO;
        // The id that logs and the prediction log share. Generated only when the caller
        // sent none and something will record it: the hot path stays allocation-free.
        let id: std::borrow::Cow<'_, str> = if request_id.is_empty()
            && (self.log.is_some() || tracing::enabled!(tracing::Level::DEBUG))
        {
            next_request_id().into()
        } else if request_id.len() > crate::request::MAX_REQUEST_ID_BYTES {
            // Refused below; logged cut.
            crate::error::clip(request_id, 64).into()
        } else {
            request_id.into()
        };
        // Debug level: spans and per-request lines cost about 12% of OIP throughput
        // (`mesh bench --target infer`, see README), so the default `info` skips them.
        let span = tracing::debug_span!("infer", request_id = %id, model, protocol);
        let result = async {
            // Before any await: a deadline that has passed on arrival is answered
            // here, as DEADLINE_EXCEEDED, before the transport's own timer can turn
            // it into CANCELLED.
            if timeout.is_some_and(|t| t < crate::request::MIN_DEADLINE) {
                return Err(RouterError::Model(
                    mesh_model_actor::ModelError::DeadlineExceeded(
                        "the request's deadline is too short to meet (grpc-timeout)",
                    ),
                ));
            }
            check_request_id(request_id)?;
            let handle = self.repo.get(model, version)?;
            let deadline = crate::request::deadline(
                arrival,
                timeout,
                handle.config.batching.default_timeout(),
                self.limits.max_timeout,
            );
            crate::request::check_not_expired(arrival, deadline, handler)?;
            let batch = make_batch(&handle)?;
            validate = handler.elapsed();
            let out = handle.infer(batch, Some(deadline)).await?;
            let done = Instant::now();
            crate::request::check_in_time(arrival, deadline, done)?;
            Ok::<_, RouterError>((handle, out, done))
        }
        .instrument(span.clone())
        .await;
        span.in_scope(|| log_result(&result, started, &id));
        match result {
            Ok((h, out, done)) => {
                // The common case touches only this thread's cached handles.
                crate::telemetry::record_ok(h.name(), Some(h.version), protocol, done - started);
                if let Some(log) = &self.log {
                    let us = |d: Duration| d.as_micros() as u64;
                    let stages = mesh_prediction_log::StageMicros {
                        validate: us(validate),
                        queue: us(out.queue),
                        compute: us(out.compute),
                        total: us(done - started),
                        ..Default::default()
                    };
                    crate::plog::record_oip(
                        log,
                        protocol,
                        &id,
                        h.name(),
                        out.version,
                        &out.data,
                        out.cols,
                        stages,
                    );
                }
                Ok((h, out))
            }
            Err(e) => {
                // Unknown model names are client input: keep them out of label values.
                let model_label = if self.repo.model(model).is_ok() {
                    model.to_owned()
                } else {
                    "unknown".to_owned()
                };
                // Likewise versions: only a version the model serves becomes a label.
                let version_label = match version {
                    None => String::new(),
                    Some(v) if self.repo.get(model, Some(v)).is_ok() => v.to_string(),
                    Some(_) => "unknown".to_owned(),
                };
                counter!(names::REQUESTS, "model" => model_label.clone(), "version" => version_label, "protocol" => protocol, "code" => e.code_label())
                    .increment(1);
                histogram!(names::REQUEST_DURATION, "model" => model_label, "protocol" => protocol)
                    .record(started.elapsed().as_secs_f64());
                Err(e)
            }
        }
    }

    /// Whether every loaded model has a ready version (and there is at least one).
    pub fn ready(&self) -> bool {
        let models = self.repo.models();
        !models.is_empty() && models.iter().all(|m| m.newest().is_some())
    }
}
