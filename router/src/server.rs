//! Starts the servers of `mesh serve`: the gRPC server (OIP v2, reflection,
//! health) and the HTTP server (REST mirror, metrics, health), sharing one core.
//! Both accept from [`Limited`] (connection cap, idle timeout, TLS when `[tls]`
//! is set); the admin and writer planes are gated by [`crate::auth`].
use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;
use mesh_model_actor::{ActorSystem, ModelRepository};
use mesh_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use mesh_feature_store::service::FeatureStoreService;
use mesh_feature_store::{FeatureStore, Limits as FsLimits, ViewsConfig};
use mesh_proto::mesh::v1::decisions_server::DecisionsServer;

use crate::admin::Admin;
use crate::auth::{GrpcGuardLayer, ModelControl, Planes};
use crate::config::{FeaturesConfig, MeshConfig, Role, ServerConfig};
use crate::decide::discovery::{Resolve, SystemResolver};
use crate::decide::feature_source::FeatureSource;
use crate::decide::remote_features::RemoteFeatures;
use crate::decide::service::DecisionService;
use crate::decide::Engine;
use crate::error::RouterError;
use crate::listen::{ConnectionConfig, Limited, PeerInfo};
use crate::oip::grpc::OipGrpc;
use crate::oip::http::{router, HttpState};
use crate::oip::{Core, Limits};
use crate::tls::Acceptor;

/// A running mesh. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The model-serving core (absent for `--role features`).
    pub core: Option<Core>,
    pub engine: Option<Arc<Engine>>,
    pub store: Option<Arc<FeatureStore>>,
    /// The prediction log writer, drained at shutdown.
    pub log: Option<(
        mesh_prediction_log::PredictionLogHandle,
        mesh_prediction_log::WriterTask,
    )>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    system: ActorSystem,
    /// How long a shutdown waits for requests in flight.
    grace: std::time::Duration,
}

impl Running {
    /// Stops accepting, lets requests in flight finish for up to the shutdown grace
    /// period (then closes whatever connections remain, so an idle or half-sent
    /// connection cannot hold the process), closes the log, stops the actors.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        for mut t in self.tasks {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                tracing::warn!(grace = ?self.grace, "connections still open after the shutdown grace period; closing them");
                t.abort();
                let _ = t.await;
            }
        }
        if let Some(store) = &self.store {
            if let Err(e) = store.flush() {
                tracing::error!(error = %e, "flushing the feature store at shutdown");
            }
        }
        if let Some((handle, writer)) = self.log {
            match handle.shutdown().await {
                Ok(stats) => tracing::info!(?stats, "prediction log closed"),
                Err(e) => tracing::error!(error = %e, "closing the prediction log"),
            }
            let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        }
        self.system.stop();
    }

    /// Resolves when a stop was asked for (a signal's [`Running::stopper`]) or a
    /// server stopped on its own (a fatal error); [`Running::shutdown`] then drains.
    pub async fn wait(&mut self) {
        let mut stopped = self.stop.subscribe();
        let any_task = futures::future::select_all(self.tasks.iter_mut());
        let finished = tokio::select! {
            _ = stopped.wait_for(|s| *s) => None,
            (_, i, _) = any_task => Some(i),
        };
        // A task that finished here (a server stops at once when a stop is asked for,
        // so both branches can be ready) must not be awaited again by `shutdown`: a
        // JoinHandle polled after completion panics, and the process would die before
        // it closed the prediction log.
        if let Some(i) = finished {
            drop(self.tasks.remove(i));
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
/// rejection is a trailers-only response: the status is in the headers). (tonic's
/// own deadline timer sits outside this layer, so a deadline that expires there is
/// CANCELLED; a deadline already passed on arrival is answered DEADLINE_EXCEEDED by
/// the handler first, see `request::MIN_DEADLINE`.)
fn transport_statuses<B>(mut res: http::Response<B>) -> http::Response<B> {
    let h = res.headers_mut();
    let is_size = h.get("grpc-status").is_some_and(|v| v == "11")
        && h.get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.contains("too%20large") || m.contains("too large"));
    if is_size {
        h.insert("grpc-status", HeaderValue::from_static("8"));
    }
    res
}

/// Model serving only, with defaults for the rest (what most tests start).
pub async fn start(cfg: &ServerConfig) -> Result<Running, RouterError> {
    start_mesh(&MeshConfig {
        server: cfg.clone(),
        ..MeshConfig::default()
    })
    .await
}

/// Opens the feature store of `[features]`, if configured: sled at `path`, or
/// Redis (`backend = "redis"`). A database sled cannot open, or a Redis that
/// cannot be reached, fails the start with the store's own explanation.
pub async fn open_store(cfg: &FeaturesConfig) -> Result<Option<Arc<FeatureStore>>, RouterError> {
    if !cfg.configured() {
        return Ok(None);
    }
    let mut redis = cfg.redis_options().map_err(RouterError::InvalidArgument)?;
    if let Some(r) = &mut redis {
        r.password = cfg
            .read_redis_password()
            .map_err(RouterError::InvalidArgument)?;
        r.validate()
            .map_err(|e| RouterError::InvalidArgument(format!("[features] {e}")))?;
    }
    let views_path = cfg.views.clone().ok_or_else(|| {
        RouterError::InvalidArgument(
            "[features] has a store (path or backend = \"redis\") but views (the views file) is not set"
                .into(),
        )
    })?;
    let path = cfg.path.clone();
    let options = cfg.store_options();
    let store = tokio::task::spawn_blocking(move || {
        let views = ViewsConfig::from_path(&views_path)?;
        match (redis, path) {
            (Some(r), _) => FeatureStore::open_redis(&views, r, options),
            (None, Some(path)) => FeatureStore::open_with(&path, &views, options),
            (None, None) => Err(mesh_feature_store::FeatureStoreError::Config {
                what: "no store configured".into(),
            }),
        }
    })
    .await
    .map_err(|e| startup("opening the feature store", e))?
    .map_err(|e| RouterError::Unavailable(format!("feature store: {e}")))?;
    Ok(Some(Arc::new(store)))
}

/// What one process serves, before any port is bound.
struct Parts {
    system: ActorSystem,
    store: Option<Arc<FeatureStore>>,
    log: Option<(
        mesh_prediction_log::PredictionLogHandle,
        mesh_prediction_log::WriterTask,
    )>,
    core: Option<Core>,
    engine: Option<Arc<Engine>>,
    /// The credentials of the admin and writer planes.
    planes: Arc<Planes>,
    model_control: ModelControl,
    fault_injection: bool,
    /// Request bytes in flight, shared by both ports.
    budget: crate::budget::InFlightBytes,
}

/// Where this process's decisions read stored features: its own store, or the
/// features role of `[features] remote` (connected now: its views are read).
async fn feature_source(
    mesh: &MeshConfig,
    store: Option<&Arc<FeatureStore>>,
) -> Result<Option<Arc<FeatureSource>>, RouterError> {
    let f = &mesh.features;
    let Some(url) = &f.remote else {
        return Ok(store.map(|s| Arc::new(FeatureSource::Local(s.clone()))));
    };
    let remote = RemoteFeatures::connect(url, f.remote_wait, f.lookup_timeout)
        .await
        .map_err(RouterError::Unavailable)?;
    Ok(Some(Arc::new(FeatureSource::Remote(Box::new(remote)))))
}

impl Parts {
    /// The actor system, the store, the log, the models and the decision engine
    /// that `mesh.server.role` asks for.
    async fn build(mesh: &MeshConfig, resolver: Arc<dyn Resolve>) -> Result<Self, RouterError> {
        let cfg = &mesh.server;
        let planes = Arc::new(
            Planes::load(&mesh.admin, &mesh.writer).map_err(RouterError::InvalidArgument)?,
        );
        let system = ActorSystem::start().map_err(|e| startup("starting the actor system", e))?;
        let serves_models = cfg.role != Role::Features;
        if cfg.role == Role::Features && mesh.features.remote.is_some() {
            return Err(RouterError::InvalidArgument(
                "--role features serves its own store: set [features] path and views, not remote"
                    .into(),
            ));
        }
        let store = match cfg.role {
            Role::Model => None,
            _ => open_store(&mesh.features).await?,
        };
        let log = match (&mesh.prediction_log, serves_models) {
            (Some(c), true) => Some(crate::plog::start(c)?),
            _ => None,
        };
        let log_handle = log.as_ref().map(|(h, _)| h.clone());
        let core = if serves_models {
            let repo = Arc::new(ModelRepository::new(&cfg.models, system.clone())?);
            repo.load_all().await?;
            Some(Core {
                repo,
                limits: Limits {
                    max_message_bytes: cfg.max_message_bytes,
                    max_timeout: cfg.max_timeout(),
                },
                log: log_handle.clone(),
            })
        } else {
            None
        };
        let engine = match (&core, cfg.role) {
            (Some(core), Role::All | Role::Router) => {
                let sink = log_handle.map(|h| {
                    Arc::new(crate::plog::LogSink(h)) as Arc<dyn crate::decide::OutcomeSink>
                });
                let engine = Engine::new(
                    core.repo.clone(),
                    feature_source(mesh, store.as_ref()).await?,
                    mesh.decisions.clone(),
                    sink,
                    resolver,
                )?;
                engine.check_specs()?;
                engine.start_discovery().await;
                Some(engine)
            }
            _ => None,
        };
        Ok(Self {
            system,
            store,
            log,
            core,
            engine,
            planes,
            model_control: mesh.admin.model_control,
            fault_injection: mesh.admin.fault_injection,
            budget: crate::budget::InFlightBytes::new(cfg.max_inflight_bytes),
        })
    }

    fn admin(&self) -> Admin {
        Admin {
            repo: self.core.as_ref().map(|c| c.repo.clone()),
            engine: self.engine.clone(),
            model_control: self.model_control,
            fault_injection: self.fault_injection,
        }
    }

    /// Says at start what the non-data planes accept.
    fn log_planes(&self) {
        for plane in [&self.planes.admin, &self.planes.writer] {
            if plane.configured() {
                tracing::info!(
                    plane = plane.name,
                    "the {} plane needs its credential",
                    plane.name
                );
            } else {
                tracing::info!(
                    plane = plane.name,
                    "the {} plane is off (no credential configured in [{}])",
                    plane.name,
                    plane.name
                );
            }
        }
        tracing::info!(model_control = ?self.model_control, "model control");
        if self.fault_injection {
            tracing::warn!("fault injection is ON ([admin] fault_injection = true): POST /admin/faults can stall or fail replicas");
        }
    }
}

/// Binds `port` on `host`, naming the port in the error.
async fn bind(
    host: std::net::IpAddr,
    port: u16,
    what: &str,
) -> Result<(TcpListener, SocketAddr), RouterError> {
    let l = TcpListener::bind((host, port))
        .await
        .map_err(|e| startup(&format!("binding the {what} port"), e))?;
    let addr = l
        .local_addr()
        .map_err(|e| startup(&format!("{what} address"), e))?;
    Ok((l, addr))
}

/// Starts what `cfg.server.role` asks for on its ports (0 = any free port).
pub async fn start_mesh(mesh: &MeshConfig) -> Result<Running, RouterError> {
    start_mesh_with(mesh, Arc::new(SystemResolver)).await
}

/// [`start_mesh`], resolving the names of `remote` replicas with `resolver`.
pub async fn start_mesh_with(
    mesh: &MeshConfig,
    resolver: Arc<dyn Resolve>,
) -> Result<Running, RouterError> {
    let cfg = &mesh.server;
    let metrics = crate::telemetry::metrics();
    // TLS files and client settings first: a bad file fails the start before
    // models load.
    let tls = if mesh.tls.serves() {
        Some(Acceptor::load(&mesh.tls).map_err(RouterError::InvalidArgument)?)
    } else {
        None
    };
    crate::decide::replica::set_client_tls(
        crate::tls::client_tls(&mesh.tls.client).map_err(RouterError::InvalidArgument)?,
    );
    let parts = Parts::build(mesh, resolver).await?;
    parts.log_planes();
    let (grpc_listener, grpc_addr) = bind(cfg.host, cfg.grpc_port, "gRPC").await?;
    let (http_listener, http_addr) = bind(cfg.host, cfg.http_port, "HTTP").await?;
    let limited = |l| {
        Limited::with_tls(l, cfg.connections.limits(), tls.clone())
            .map_err(|e| startup("listening", e))
    };
    let (grpc_listener, http_listener) = (limited(grpc_listener)?, limited(http_listener)?);
    let (stop, stopped) = watch::channel(false);
    let grpc_task = grpc_server(mesh, &parts, grpc_listener, stopped.clone()).await?;
    let http_state = HttpState {
        core: parts.core.clone(),
        metrics: Arc::new(move || metrics.render()),
        deployments_ready: parts.engine.clone().map(|e| {
            Arc::new(move || e.ready()) as Arc<dyn Fn() -> Result<(), String> + Send + Sync>
        }),
    };
    let app = router(http_state).merge(crate::admin::routes(parts.admin(), parts.planes.clone()));
    let http_task = http_server(
        app,
        parts.budget.clone(),
        http_listener,
        &cfg.connections,
        stopped.clone(),
    );
    let mut tasks = vec![grpc_task, http_task];
    if let Some(tls) = tls {
        tasks.push(tls.watch(stopped));
    }
    let models: Vec<String> = parts
        .core
        .iter()
        .flat_map(|c| c.repo.models())
        .map(|m| m.config.name.clone())
        .collect();
    tracing::info!(%grpc_addr, %http_addr, role = ?cfg.role, ?models, feature_store = parts.store.is_some(), remote_features = mesh.features.remote.as_deref(), tls = mesh.tls.serves(), "mesh serving");
    Ok(Running {
        grpc_addr,
        http_addr,
        core: parts.core,
        engine: parts.engine,
        store: parts.store,
        log: parts.log,
        stop,
        tasks,
        system: parts.system,
        grace: cfg.connections.shutdown_grace,
    })
}

/// The gRPC server: OIP, Decisions, FeatureStore (each when this role has it),
/// reflection and health, until `stopped` turns true.
async fn grpc_server(
    mesh: &MeshConfig,
    parts: &Parts,
    listener: Limited,
    mut stopped: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, RouterError> {
    let cfg = &mesh.server;
    // Reflection in both versions: grpcurl speaks v1, older tools v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(mesh_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| startup("gRPC reflection", e))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| startup("gRPC reflection", e))?;
    let (health, health_service) = tonic_health::server::health_reporter();
    let oip = parts.core.as_ref().map(|core| {
        GrpcInferenceServiceServer::new(OipGrpc::new(core.clone(), parts.admin()))
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(usize::MAX)
    });
    if oip.is_some() {
        health
            .set_serving::<GrpcInferenceServiceServer<OipGrpc>>()
            .await;
    }
    let decisions = parts
        .engine
        .as_ref()
        .map(|e| DecisionsServer::new(DecisionService::new(e.clone())));
    if decisions.is_some() {
        health
            .set_serving::<DecisionsServer<DecisionService>>()
            .await;
    }
    let features = parts.store.as_ref().map(|s| {
        let mut limits = FsLimits::default();
        if let Some(n) = mesh.features.max_keys_per_lookup {
            limits.max_keys_per_lookup = n;
        }
        FeatureStoreService::new(s.clone(), limits).into_server()
    });
    if features.is_some() {
        health.set_serving::<mesh_proto::mesh::v1::feature_store_server::FeatureStoreServer<FeatureStoreService>>().await;
    }
    let conns = &cfg.connections;
    for w in conns.warnings() {
        tracing::warn!("{w}");
    }
    let grpc = tonic::transport::Server::builder()
        .timeout(conns.request_timeout)
        .http2_keepalive_interval(Some(conns.keepalive_interval))
        .http2_keepalive_timeout(Some(conns.keepalive_timeout))
        .max_connection_age(conns.max_connection_age)
        .http2_max_pending_accept_reset_streams(Some(conns.max_pending_accept_reset_streams))
        // Outermost: the arrival time, where every deadline starts (crate::arrival).
        .layer(crate::arrival::ArrivalLayer)
        .layer(tower::util::MapResponseLayer::new(transport_statuses))
        // Admin- and writer-plane RPCs need their credential (see crate::auth).
        .layer(GrpcGuardLayer(parts.planes.clone()))
        // Request bytes in flight come from one pool (see crate::budget).
        .layer(crate::budget::BudgetLayer::new(parts.budget.clone()))
        .add_optional_service(oip)
        .add_optional_service(decisions)
        .add_optional_service(features)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(health_service)
        .serve_with_incoming_shutdown(listener.into_stream(), async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
    Ok(tokio::spawn(async move {
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    }))
}

/// The HTTP server for `app`, until `stopped` turns true. A request (body
/// included) that takes longer than `request_timeout` is answered 408; request
/// bodies draw on `budget`.
fn http_server(
    app: axum::Router,
    budget: crate::budget::InFlightBytes,
    listener: Limited,
    conns: &ConnectionConfig,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // Around the router, not inside it: each `Router::layer` wraps every route in one
    // more boxed service, cloned for every request.
    let app = tower::ServiceBuilder::new()
        // Outermost: the arrival time, where deadlines start.
        .layer(crate::arrival::ArrivalLayer)
        .layer(crate::timeout::RequestTimeoutLayer(conns.request_timeout))
        .layer(crate::budget::BudgetLayer::new(budget))
        .service(app);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                PeerInfo,
            >(app),
        )
        .with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .await
        {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    })
}
