//! `mesh.v1.Decisions` over gRPC.
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use mesh_proto::mesh::v1 as pb;
use pb::decisions_server::Decisions;
use tonic::{Request, Response, Status};

use super::{AnswerSource, Engine, Outcome};
use crate::error::RouterError;
use crate::telemetry::names;
use metrics::{counter, histogram};

/// The request metrics of one Decide or DecideBatch call (`protocol="decide"`, the
/// same series as OIP's): the model when the engine knows it, else `unknown`
/// (names are client input); the version that scored a single decision.
fn count(engine: &Engine, model: &str, out: &Result<Vec<Outcome>, RouterError>, started: Instant) {
    let model = if engine.knows(model) {
        model.to_owned()
    } else {
        "unknown".to_owned()
    };
    match out {
        Ok(o) => {
            let version = match o.as_slice() {
                [one]
                    if matches!(
                        one.source,
                        AnswerSource::Model | AnswerSource::PreviousVersion
                    ) =>
                {
                    one.version
                }
                _ => None,
            };
            crate::telemetry::record_ok(&model, version, "decide", started.elapsed());
        }
        Err(e) => {
            counter!(names::REQUESTS, "model" => model.clone(), "version" => "", "protocol" => "decide", "code" => e.code_label())
                .increment(1);
            histogram!(names::REQUEST_DURATION, "model" => model, "protocol" => "decide")
                .record(started.elapsed().as_secs_f64());
        }
    }
}

pub struct DecisionService {
    engine: Arc<Engine>,
}

impl DecisionService {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

#[tonic::async_trait]
impl Decisions for DecisionService {
    async fn decide(
        &self,
        req: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let timeout = crate::request::timeout_of(&req);
        let started = crate::arrival::Arrival::of_grpc(&req);
        let r = req.into_inner();
        let span = tracing::debug_span!("decide", request_id = %r.request_id, model = %r.model);
        let out = self
            .engine
            .decide_batch(std::slice::from_ref(&r), (started, timeout))
            .instrument(span.clone())
            .await;
        span.in_scope(|| crate::request::log_result(&out, started, &r.request_id));
        count(&self.engine, &r.model, &out, started);
        let o = out?.pop().ok_or_else(|| Status::internal("no outcome"))?;
        Ok(Response::new(o.to_proto()))
    }

    async fn decide_batch(
        &self,
        req: Request<pb::DecideBatchRequest>,
    ) -> Result<Response<pb::DecideBatchResponse>, Status> {
        let timeout = crate::request::timeout_of(&req);
        let started = crate::arrival::Arrival::of_grpc(&req);
        let r = req.into_inner();
        // Each item's request_id is on its own log lines; the batch carries the first.
        let first = r
            .requests
            .first()
            .map(|q| q.request_id.as_str())
            .unwrap_or("");
        let span =
            tracing::debug_span!("decide_batch", request_id = %first, items = r.requests.len());
        let out = self
            .engine
            .decide_batch(&r.requests, (started, timeout))
            .instrument(span.clone())
            .await;
        span.in_scope(|| crate::request::log_result(&out, started, first));
        let model = r.requests.first().map_or("", |q| q.model.as_str());
        count(&self.engine, model, &out, started);
        let out = out?;
        Ok(Response::new(pb::DecideBatchResponse {
            responses: out.iter().map(|o| o.to_proto()).collect(),
        }))
    }
}
