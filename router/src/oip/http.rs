//! The REST mirror of the Open Inference Protocol (`/v2/...`), plus `/metrics`,
//! `/healthz` and `/readyz`. Errors are `{"error": "..."}` with a 4xx/5xx status.
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mesh_model_actor::DataType;
use serde::Deserialize;
use serde_json::{json, Value};

use super::codec::{check_outputs, parse_datatype, to_batch, Elements, InputTensor};
use super::grpc::{statistics, EXTENSIONS};
use super::Core;
use crate::error::RouterError;
use crate::request::parse_version;

/// State of the HTTP server.
#[derive(Clone)]
pub struct HttpState {
    /// Model serving (absent for `--role features`).
    pub core: Option<Core>,
    /// Renders the Prometheus text of the process.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// Whether every configured deployment can answer (`Err` names what cannot);
    /// the server wires it to the decision engine, when this process has one.
    pub deployments_ready: Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>,
}

impl IntoResponse for RouterError {
    fn into_response(self) -> Response {
        (self.http_status(), Json(json!({ "error": self.message() }))).into_response()
    }
}

type HttpResult = Result<Response, RouterError>;

/// The HTTP data plane: the OIP REST mirror (when this process serves models),
/// `/metrics`, `/healthz`, `/readyz`. The admin routes are [`crate::admin::routes`].
pub fn router(state: HttpState) -> Router {
    let ops = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .fallback(|| async { RouterError::NotFound("no such path".into()) });
    // Shared behind one Arc: axum clones the state for every request (the route's
    // handler and its `State` extractor), one reference count instead of one per
    // field.
    let Some(limit) = state.core.as_ref().map(|c| c.limits.max_message_bytes) else {
        return ops.with_state(Arc::new(state));
    };
    ops.merge(oip_routes(limit)).with_state(Arc::new(state))
}

fn oip_routes(limit: usize) -> Router<Arc<HttpState>> {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(model_metadata_v),
        )
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready_v),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer_v))
        .route("/v2/models/{model}/config", get(config))
        .route("/v2/models/{model}/stats", get(stats))
        .route("/v2/models/stats", get(stats_all))
        .route("/v2/repository/index", post(index))
        .layer(DefaultBodyLimit::max(limit))
}

/// The core of a state that serves models (routes that need one exist only then).
fn core(s: &HttpState) -> Result<&Core, RouterError> {
    s.core
        .as_ref()
        .ok_or_else(|| RouterError::NotFound("this process does not serve models".into()))
}

async fn server_metadata() -> Json<Value> {
    Json(
        json!({ "name": "inference-mesh", "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS }),
    )
}

/// Ready when every loaded model has a ready version and, where this process takes
/// decisions, every `[[decisions.deployments]]` entry can answer from a model
/// (its model served, a ready version, a usable input spec); 503 naming what cannot.
async fn ready(State(s): State<Arc<HttpState>>) -> Response {
    let Some(core) = s.core.as_ref() else {
        return (StatusCode::OK, "ready").into_response();
    };
    if !core.ready() {
        return RouterError::Unavailable("no model has a ready version".into()).into_response();
    }
    match s.deployments_ready.as_ref().map_or(Ok(()), |check| check()) {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(why) => RouterError::Unavailable(why).into_response(),
    }
}

async fn metrics(State(s): State<Arc<HttpState>>) -> Response {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        (s.metrics)(),
    )
        .into_response()
}

fn tensor_json(name: &str, dt: &str, dims: &[usize]) -> Value {
    let shape: Vec<i64> = std::iter::once(-1)
        .chain(dims.iter().map(|&d| d as i64))
        .collect();
    json!({ "name": name, "datatype": dt, "shape": shape })
}

async fn model_metadata(s: State<Arc<HttpState>>, Path(model): Path<String>) -> HttpResult {
    metadata(s, model, String::new()).await
}
async fn model_metadata_v(
    s: State<Arc<HttpState>>,
    Path((model, version)): Path<(String, String)>,
) -> HttpResult {
    metadata(s, model, version).await
}
async fn metadata(State(s): State<Arc<HttpState>>, model: String, version: String) -> HttpResult {
    let h = core(&s)?
        .repo
        .get(&model, parse_version(&model, &version)?)?;
    let m = core(&s)?.repo.model(&model)?;
    let c = &h.config;
    Ok(Json(json!({
        "name": c.name,
        "versions": m.versions.keys().map(|v| v.to_string()).collect::<Vec<_>>(),
        "platform": c.platform,
        "inputs": c.inputs.iter().map(|t| tensor_json(&t.name, t.datatype.as_str(), &t.dims)).collect::<Vec<_>>(),
        "outputs": c.outputs.iter().map(|t| tensor_json(&t.name, t.datatype.as_str(), &t.dims)).collect::<Vec<_>>(),
    }))
    .into_response())
}

async fn model_ready(s: State<Arc<HttpState>>, Path(model): Path<String>) -> HttpResult {
    readiness(s, model, String::new()).await
}
async fn model_ready_v(
    s: State<Arc<HttpState>>,
    Path((model, version)): Path<(String, String)>,
) -> HttpResult {
    readiness(s, model, version).await
}
async fn readiness(State(s): State<Arc<HttpState>>, model: String, version: String) -> HttpResult {
    core(&s)?
        .repo
        .get(&model, parse_version(&model, &version)?)?;
    Ok(StatusCode::OK.into_response())
}

/// The body of an OIP REST inference request, as the mesh parses it.
#[derive(Deserialize)]
pub struct InferRequestJson {
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    data: FlatNumbers,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
}

/// A tensor's `data`: (possibly nested) JSON arrays of numbers, flattened row-major
/// while parsing, 8 bytes a number. (Parsed as a `serde_json::Value` first, a body of
/// zeros took about 35 bytes of memory per byte of body.)
#[derive(Default)]
struct FlatNumbers(Vec<f64>);

impl<'de> Deserialize<'de> for FlatNumbers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = FlatNumbers::default();
        d.deserialize_any(Flatten(&mut out.0))?;
        Ok(out)
    }
}

struct Flatten<'a>(&'a mut Vec<f64>);

impl<'de> serde::de::DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number or an array of numbers")
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.0.push(v);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.push(v as f64);
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.push(v as f64);
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

fn json_elements(name: &str, dt: DataType, data: &FlatNumbers) -> Result<Elements, RouterError> {
    let flat = &data.0;
    let bad = |i: usize| {
        RouterError::invalid(format!(
            "input '{name}' element {i} is not a {} number",
            dt.as_str()
        ))
    };
    // An integer type takes whole numbers within its range (2^53 bounds what JSON
    // numbers carry exactly as f64).
    let int = |i: usize, x: f64, min: f64, max: f64| {
        if x.fract() == 0.0 && x >= min && x <= max {
            Ok(x)
        } else {
            Err(bad(i))
        }
    };
    const EXACT: f64 = 9_007_199_254_740_992.0;
    Ok(match dt {
        DataType::Fp32 => Elements::Fp32(flat.iter().map(|x| *x as f32).collect()),
        DataType::Fp64 => Elements::Fp64(flat.clone()),
        DataType::Int32 => Elements::Int32(
            flat.iter()
                .enumerate()
                .map(|(i, x)| {
                    int(i, *x, f64::from(i32::MIN), f64::from(i32::MAX)).map(|x| x as i32)
                })
                .collect::<Result<_, _>>()?,
        ),
        DataType::Int64 => Elements::Int64(
            flat.iter()
                .enumerate()
                .map(|(i, x)| int(i, *x, -EXACT, EXACT).map(|x| x as i64))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// Parses an OIP REST inference request body (tensor data flattened while parsing).
/// Public so that the do-nothing REST server of the benchmarks parses exactly as the
/// mesh does.
pub fn parse_infer_body(body: &[u8]) -> Result<InferRequestJson, RouterError> {
    serde_json::from_slice(body).map_err(|e| {
        RouterError::invalid(format!(
            "request body is not a valid inference request: {e}"
        ))
    })
}

impl InferRequestJson {
    /// The request's id, its inputs' names and element counts (for servers that only
    /// look at the request).
    pub fn summary(&self) -> (Option<&str>, Vec<(&str, usize)>) {
        let inputs = self
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), t.data.0.len()))
            .collect();
        (self.id.as_deref(), inputs)
    }
}

pub(crate) type Body = Result<Bytes, BytesRejection>;

/// What an inference request's head says about its time: when it arrived (stamped
/// by the server's outermost layer; now, when the router is called without it) and
/// its `x-mesh-timeout-ms`, the REST analogue of `grpc-timeout` (ignored unless a
/// whole number of milliseconds). Read from the request's parts in place: axum's
/// `HeaderMap` extractor copies every header of every request.
struct Timing {
    arrival: std::time::Instant,
    timeout: Option<Duration>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Timing {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            arrival: crate::arrival::Arrival::of(&parts.extensions),
            timeout: parts
                .headers
                .get("x-mesh-timeout-ms")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis),
        })
    }
}

async fn infer(
    s: State<Arc<HttpState>>,
    Path(model): Path<String>,
    timing: Timing,
    body: Body,
) -> HttpResult {
    do_infer(s, model, String::new(), timing, body).await
}
async fn infer_v(
    s: State<Arc<HttpState>>,
    Path((model, version)): Path<(String, String)>,
    timing: Timing,
    body: Body,
) -> HttpResult {
    do_infer(s, model, version, timing, body).await
}

async fn do_infer(
    State(s): State<Arc<HttpState>>,
    model: String,
    version: String,
    Timing { arrival, timeout }: Timing,
    body: Body,
) -> HttpResult {
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => RouterError::TooLarge(format!(
            "request body is larger than the limit of {} bytes (max_message_bytes)",
            s.core.as_ref().map_or(0, |c| c.limits.max_message_bytes)
        )),
        _ => match crate::budget::refusal_in(&e) {
            Some(msg) => RouterError::ResourceExhausted(msg),
            None => RouterError::invalid(format!("request body: {e}")),
        },
    })?;
    let req = parse_infer_body(&body)?;
    let v = parse_version(&model, &version)?;
    let (h, out) = core(&s)?
        .infer(
            "http",
            &model,
            v,
            req.id.as_deref().unwrap_or(""),
            |h| {
                check_outputs(&h.config, req.outputs.iter().map(|o| o.name.as_str()))?;
                let want = h.config.input().datatype;
                let inputs = req
                    .inputs
                    .iter()
                    .map(|t| {
                        let dt = parse_datatype(&t.name, &t.datatype, want)?;
                        Ok(InputTensor {
                            name: t.name.clone(),
                            datatype: t.datatype.clone(),
                            shape: t.shape.clone(),
                            data: json_elements(&t.name, dt, &t.data)?,
                        })
                    })
                    .collect::<Result<Vec<_>, RouterError>>()?;
                to_batch(&h.config, inputs)
            },
            (arrival, timeout),
        )
        .await?;
    let spec = h.config.output();
    let shape: Vec<i64> = std::iter::once(out.rows as i64)
        .chain(spec.dims.iter().map(|&d| d as i64))
        .collect();
    let mut body = json!({
        "model_name": h.config.name,
        "model_version": out.version.to_string(),
        "outputs": [{ "name": spec.name, "datatype": "FP32", "shape": shape, "data": out.data }],
    });
    if let Some(id) = req.id {
        body["id"] = Value::String(id);
    }
    Ok(Json(body).into_response())
}

async fn config(State(s): State<Arc<HttpState>>, Path(model): Path<String>) -> HttpResult {
    let h = core(&s)?.repo.get(&model, None)?;
    let c = &h.config;
    Ok(Json(json!({
        "name": c.name,
        "platform": c.platform,
        "backend": c.kind.backend(),
        "max_batch_size": c.batching.max_batch_size.get(),
        "input": c.inputs.iter().map(|t| json!({"name": t.name, "data_type": format!("TYPE_{}", t.datatype.as_str()), "dims": t.dims})).collect::<Vec<_>>(),
        "output": c.outputs.iter().map(|t| json!({"name": t.name, "data_type": format!("TYPE_{}", t.datatype.as_str()), "dims": t.dims})).collect::<Vec<_>>(),
        "dynamic_batching": { "max_queue_delay_microseconds": c.batching.max_queue_delay_us },
        "instance_group": [{ "count": c.batching.runner_instances.get(), "kind": if c.device == "cpu" { "KIND_CPU" } else { "KIND_GPU" } }],
    }))
    .into_response())
}

fn stats_json(s: &HttpState, model: &str) -> HttpResult {
    let stats = statistics(core(s)?, model, "")?;
    let d = |x: &Option<mesh_proto::inference::StatisticDuration>| {
        let x = x.unwrap_or_default();
        json!({ "count": x.count, "ns": x.ns })
    };
    let list: Vec<Value> = stats
        .iter()
        .map(|m| {
            let i = m.inference_stats.unwrap_or_default();
            json!({
                "name": m.name, "version": m.version, "last_inference": m.last_inference,
                "inference_count": m.inference_count, "execution_count": m.execution_count,
                "inference_stats": {
                    "success": d(&i.success), "fail": d(&i.fail), "queue": d(&i.queue),
                    "compute_input": d(&i.compute_input), "compute_infer": d(&i.compute_infer),
                    "compute_output": d(&i.compute_output),
                },
                "batch_stats": m.batch_stats.iter().map(|b| json!({
                    "batch_size": b.batch_size, "compute_input": d(&b.compute_input),
                    "compute_infer": d(&b.compute_infer), "compute_output": d(&b.compute_output),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({ "model_stats": list })).into_response())
}

async fn stats(State(s): State<Arc<HttpState>>, Path(model): Path<String>) -> HttpResult {
    stats_json(&s, &model)
}
async fn stats_all(State(s): State<Arc<HttpState>>) -> HttpResult {
    stats_json(&s, "")
}

async fn index(State(s): State<Arc<HttpState>>) -> HttpResult {
    Ok(Json(Value::Array(
        core(&s)?
            .repo
            .index()
            .into_iter()
            .map(|e| json!({ "name": e.model, "version": e.version.to_string(), "state": e.state, "reason": e.reason }))
            .collect(),
    ))
    .into_response())
}
