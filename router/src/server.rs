//! Starts the servers of `mesh serve`: the gRPC server (OIP v2, reflection,
//! health) and the HTTP server (REST mirror, metrics, health), sharing one core.
use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;
use mesh_model_actor::{ActorSystem, ModelRepository};
use mesh_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::config::ServerConfig;
use crate::error::RouterError;
use crate::oip::grpc::OipGrpc;
use crate::oip::http::{router, HttpState};
use crate::oip::{Core, Limits};

/// A running mesh. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub core: Core,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    system: ActorSystem,
}

impl Running {
    /// Stops accepting, lets requests in flight finish, stops the actors.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        self.system.stop();
    }

    /// Resolves when the servers have stopped (after a shutdown or a fatal error).
    pub async fn wait(&mut self) {
        for t in &mut self.tasks {
            let _ = t.await;
        }
    }

    /// A sender that stops the servers (for signal handlers).
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }
}

fn startup(what: &str, e: impl std::fmt::Display) -> RouterError {
    RouterError::Internal(format!("{what}: {e}"))
}

/// tonic rejects an over-limit message with OUT_OF_RANGE before any handler runs;
/// the mesh's contract is RESOURCE_EXHAUSTED, so the status is rewritten here (the
/// rejection is a trailers-only response: the status is in the headers).
fn too_large_is_resource_exhausted<B>(mut res: http::Response<B>) -> http::Response<B> {
    let h = res.headers_mut();
    let is_size = h.get("grpc-status").is_some_and(|v| v == "11")
        && h.get("grpc-message").and_then(|m| m.to_str().ok()).is_some_and(|m| m.contains("too%20large") || m.contains("too large"));
    if is_size {
        h.insert("grpc-status", HeaderValue::from_static("8"));
    }
    res
}

/// Loads the repository and starts both servers on `cfg`'s ports (0 = any free port).
pub async fn start(cfg: &ServerConfig) -> Result<Running, RouterError> {
    let metrics = crate::telemetry::metrics();
    let system = ActorSystem::start().map_err(|e| startup("starting the actor system", e))?;
    let repo = Arc::new(ModelRepository::new(&cfg.models, system.clone())?);
    repo.load_all().await?;
    let core = Core {
        repo,
        limits: Limits { max_message_bytes: cfg.max_message_bytes, max_timeout: cfg.max_timeout() },
    };

    let grpc_listener = TcpListener::bind((cfg.host, cfg.grpc_port)).await.map_err(|e| startup("binding the gRPC port", e))?;
    let http_listener = TcpListener::bind((cfg.host, cfg.http_port)).await.map_err(|e| startup("binding the HTTP port", e))?;
    let grpc_addr = grpc_listener.local_addr().map_err(|e| startup("gRPC address", e))?;
    let http_addr = http_listener.local_addr().map_err(|e| startup("HTTP address", e))?;
    let (stop, stopped) = watch::channel(false);

    // Reflection in both versions: grpcurl speaks v1, older tools v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(mesh_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().map_err(|e| startup("gRPC reflection", e))?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(|e| startup("gRPC reflection", e))?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<GrpcInferenceServiceServer<OipGrpc>>().await;
    let oip = GrpcInferenceServiceServer::new(OipGrpc::new(core.clone()))
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(usize::MAX);
    let mut rx = stopped.clone();
    let grpc = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(too_large_is_resource_exhausted))
        .add_service(oip)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(health_service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), async move {
            let _ = rx.wait_for(|s| *s).await;
        });
    let grpc_task = tokio::spawn(async move {
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });

    let http_state = HttpState { core: core.clone(), metrics: Arc::new(move || metrics.render()) };
    let mut rx = stopped;
    let http_task = tokio::spawn(async move {
        let app = router(http_state);
        if let Err(e) = axum::serve(http_listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
        {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    tracing::info!(%grpc_addr, %http_addr, models = ?core.repo.models().iter().map(|m| m.config.name.clone()).collect::<Vec<_>>(), "mesh serving");
    Ok(Running { grpc_addr, http_addr, core, stop, tasks: vec![grpc_task, http_task], system })
}
