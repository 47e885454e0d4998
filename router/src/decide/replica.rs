//! Replicas of a model version as tower services: a local actor group, or a
//! remote `mesh serve --role model` reached over OIP gRPC. Both carry a fault
//! switch (added delay, forced failure) for drills, the demo and tests.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use mesh_model_actor::{Batch, ModelError, VersionHandle};
use mesh_proto::inference as pb;
use mesh_stack::{HasDeadline, StackError};
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tokio::time::Instant;
use tonic::transport::Channel;

/// One model call: rows of the model's input, and the overall deadline.
#[derive(Debug, Clone)]
pub struct ModelCall {
    pub data: Arc<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub deadline: Instant,
}

impl HasDeadline for ModelCall {
    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// What a replica answered.
#[derive(Debug, Clone)]
pub struct ModelAnswer {
    /// The first output of each row (the score).
    pub scores: Vec<f32>,
    pub version: u64,
    pub queue: Duration,
    pub compute: Duration,
}

/// Injected trouble: every call waits `delay` first, and fails if `fail` is set.
#[derive(Debug, Default)]
pub struct Fault {
    delay_us: AtomicU64,
    fail: AtomicBool,
}

impl Fault {
    pub fn set(&self, delay: Duration, fail: bool) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        self.fail.store(fail, Ordering::Relaxed);
    }
    pub fn get(&self) -> (Duration, bool) {
        (
            Duration::from_micros(self.delay_us.load(Ordering::Relaxed)),
            self.fail.load(Ordering::Relaxed),
        )
    }
    async fn apply(&self) -> Result<(), StackError> {
        let (delay, fail) = self.get();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if fail {
            return Err(StackError::ModelFault("injected fault".into()));
        }
        Ok(())
    }
}

/// The stack's view of a model-actor error: which failures may be retried elsewhere.
pub fn classify(e: ModelError) -> StackError {
    match e {
        // Refused at admission (queue full, or the answer expected after the
        // deadline): back-pressure, retried on another replica while time allows.
        ModelError::Overloaded { .. } | ModelError::CannotMeetDeadline { .. } => {
            StackError::ReplicaOverloaded(Box::new(e))
        }
        ModelError::Unavailable { .. } | ModelError::NotReady(_) => {
            StackError::ReplicaUnavailable(Box::new(e))
        }
        ModelError::DeadlineExceeded(_) => StackError::DeadlineExceeded,
        ModelError::Compute(_) => StackError::ModelFault(Box::new(e)),
        other => StackError::Internal(other.to_string()),
    }
}

/// An actor group of this process.
#[derive(Clone)]
pub struct LocalReplica {
    pub handle: Arc<VersionHandle>,
    pub fault: Arc<Fault>,
    /// The stack's per-try timeout: the call is abandoned then, so admission asks
    /// for an answer by then (or by the call's deadline, if sooner). Work that would
    /// finish after the try gave up is refused, not done.
    pub try_timeout: Duration,
}

impl tower::Service<ModelCall> for LocalReplica {
    type Response = ModelAnswer;
    type Error = StackError;
    type Future = BoxFuture<'static, Result<ModelAnswer, StackError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let (h, fault) = (self.handle.clone(), self.fault.clone());
        let try_ends = Instant::now() + self.try_timeout;
        Box::pin(async move {
            fault.apply().await?;
            let batch = Batch {
                rows: call.rows,
                cols: call.cols,
                data: call.data.as_ref().clone(),
            };
            let deadline = call.deadline.min(try_ends);
            let out = h
                .infer(batch, Some(deadline.into_std()))
                .await
                .map_err(classify)?;
            Ok(ModelAnswer {
                scores: out.data.chunks(out.cols.max(1)).map(|r| r[0]).collect(),
                version: out.version,
                queue: out.queue,
                compute: out.compute,
            })
        })
    }
}

/// The TLS client settings (`[tls.client]`) for `https://` remote replicas, set
/// by the server at start ([`set_client_tls`]).
static CLIENT_TLS: parking_lot::RwLock<Option<tonic::transport::ClientTlsConfig>> =
    parking_lot::RwLock::new(None);

/// Sets the TLS client settings that `https://` remote replicas made from now on
/// use (CA, client certificate for mTLS, expected name).
pub fn set_client_tls(tls: Option<tonic::transport::ClientTlsConfig>) {
    *CLIENT_TLS.write() = tls;
}

/// A model server elsewhere (`mesh serve --role model`), over OIP gRPC (TLS for
/// `https://` URLs, with `[tls.client]`'s CA and client certificate).
#[derive(Clone)]
pub struct RemoteReplica {
    pub client: GrpcInferenceServiceClient<Channel>,
    pub model: String,
    pub version: u64,
    pub input: String,
    pub fault: Arc<Fault>,
}

impl RemoteReplica {
    /// A lazily connected client of `url`: an unreachable endpoint fails calls
    /// (and trips its breaker), not the start of the router.
    pub fn new(url: &str, model: &str, version: u64, input: &str) -> Result<Self, String> {
        Self::with_channel(remote_channel(url, None)?, model, version, input)
    }

    /// Like [`RemoteReplica::new`], but always connecting to `addr` (one address
    /// of the name in `url`, which stays the HTTP authority and the TLS name).
    pub fn at(
        url: &str,
        addr: SocketAddr,
        model: &str,
        version: u64,
        input: &str,
    ) -> Result<Self, String> {
        Self::with_channel(remote_channel(url, Some(addr))?, model, version, input)
    }

    fn with_channel(
        channel: Channel,
        model: &str,
        version: u64,
        input: &str,
    ) -> Result<Self, String> {
        Ok(Self {
            client: GrpcInferenceServiceClient::new(channel),
            model: model.to_owned(),
            version,
            input: input.to_owned(),
            fault: Arc::default(),
        })
    }
}

/// How long connecting to a remote role may take.
pub const REMOTE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A lazily connected channel to a remote role (`http://` or `https://` with
/// `[tls.client]`), to `url`'s host, or to `addr` when given (the URL's host then
/// still names the server: HTTP authority, TLS name).
pub fn remote_channel(url: &str, addr: Option<SocketAddr>) -> Result<Channel, String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("remote '{url}': {e}"))?;
    if url.starts_with("https://") {
        let tls = CLIENT_TLS
            .read()
            .clone()
            .ok_or_else(|| format!("remote '{url}' is https but [tls.client] ca is not set"))?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("remote '{url}': TLS: {e}"))?;
    }
    let endpoint = endpoint
        .connect_timeout(REMOTE_CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    Ok(match addr {
        None => endpoint.connect_lazy(),
        Some(addr) => endpoint.connect_with_connector_lazy(FixedAddr(addr)),
    })
}

/// Connects to one address whatever the URI's host says.
#[derive(Debug, Clone, Copy)]
struct FixedAddr(SocketAddr);

impl tower::Service<http::Uri> for FixedAddr {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, std::io::Result<Self::Response>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let addr = self.0;
        Box::pin(async move {
            let s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(s))
        })
    }
}

fn classify_status(s: tonic::Status) -> StackError {
    use tonic::Code;
    match s.code() {
        Code::ResourceExhausted => StackError::ReplicaOverloaded(Box::new(s)),
        Code::Unavailable | Code::NotFound | Code::Cancelled | Code::Unknown => {
            StackError::ReplicaUnavailable(Box::new(s))
        }
        Code::DeadlineExceeded => StackError::DeadlineExceeded,
        Code::Internal => StackError::ModelFault(Box::new(s)),
        _ => StackError::Internal(s.to_string()),
    }
}

impl tower::Service<ModelCall> for RemoteReplica {
    type Response = ModelAnswer;
    type Error = StackError;
    type Future = BoxFuture<'static, Result<ModelAnswer, StackError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), StackError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let mut client = self.client.clone();
        let (model, version, input, fault) = (
            self.model.clone(),
            self.version,
            self.input.clone(),
            self.fault.clone(),
        );
        Box::pin(async move {
            fault.apply().await?;
            let raw: Vec<u8> = call.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut req = tonic::Request::new(pb::ModelInferRequest {
                model_name: model,
                model_version: version.to_string(),
                inputs: vec![pb::model_infer_request::InferInputTensor {
                    name: input,
                    datatype: "FP32".into(),
                    shape: vec![call.rows as i64, call.cols as i64],
                    ..Default::default()
                }],
                raw_input_contents: vec![raw],
                ..Default::default()
            });
            req.set_timeout(call.deadline.saturating_duration_since(Instant::now()));
            let t = std::time::Instant::now();
            let resp = client
                .model_infer(req)
                .await
                .map_err(classify_status)?
                .into_inner();
            let took = t.elapsed();
            let bytes = resp
                .raw_output_contents
                .first()
                .ok_or_else(|| StackError::Internal("remote answer has no output".into()))?;
            let cols = resp
                .outputs
                .first()
                .and_then(|o| o.shape.get(1..))
                .map(|d| d.iter().product::<i64>().max(1) as usize)
                .unwrap_or(1);
            let values: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok(ModelAnswer {
                scores: values.chunks(cols).map(|r| r[0]).collect(),
                version: resp.model_version.parse().unwrap_or(version),
                queue: Duration::ZERO,
                compute: took,
            })
        })
    }
}
