//! The admin plane: repository control (load, unload) and fault injection into
//! decision replicas, over HTTP (`/admin/...`, `/v2/repository/models/{m}/load|unload`)
//! and, for repository control, over gRPC (the OIP service's Repository* calls go
//! through [`Admin`] too). Everything here changes what is serving, so it lives apart
//! from the data plane: every route needs the admin credential ([`crate::auth`]),
//! and the dangerous parts are off unless mesh.toml turns them on — fault
//! injection with `[admin] fault_injection = true`, load/unload with
//! `[admin] model_control = "explicit"`.
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mesh_model_actor::ModelRepository;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{ModelControl, Planes};
use crate::decide::Engine;
use crate::error::RouterError;
use crate::oip::http::Body;

/// What the admin plane acts on; either part may be absent in a process whose role
/// does not serve it.
#[derive(Clone, Default)]
pub struct Admin {
    pub repo: Option<Arc<ModelRepository>>,
    pub engine: Option<Arc<Engine>>,
    /// Whether load/unload may be asked for (default: no, models load at start).
    pub model_control: ModelControl,
    /// Whether faults may be injected (default: no).
    pub fault_injection: bool,
}

/// One replica's injected fault, as `GET /admin/replicas` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct FaultState {
    pub replica: String,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub fail: bool,
}

impl Admin {
    fn repo(&self) -> Result<&Arc<ModelRepository>, RouterError> {
        self.repo
            .as_ref()
            .ok_or_else(|| RouterError::NotFound("this process does not serve models".into()))
    }

    fn engine(&self) -> Result<&Arc<Engine>, RouterError> {
        self.engine
            .as_ref()
            .ok_or_else(|| RouterError::NotFound("no decision engine in this process".into()))
    }

    fn model_control(&self, what: &str) -> Result<(), RouterError> {
        match self.model_control {
            ModelControl::Explicit => Ok(()),
            ModelControl::None => Err(RouterError::invalid(format!(
                "model {what} is off: models load at start only ([admin] model_control = \"none\"); \
                 set [admin] model_control = \"explicit\" in mesh.toml to allow load and unload"
            ))),
        }
    }

    /// Loads (or reloads) every version the model's policy names.
    pub async fn load(&self, model: &str) -> Result<(), RouterError> {
        self.model_control("load")?;
        self.repo()?.load(model).await?;
        tracing::info!(model, "model loaded by the admin plane");
        Ok(())
    }

    /// Unloads every version of the model.
    pub async fn unload(&self, model: &str) -> Result<(), RouterError> {
        self.model_control("unload")?;
        self.repo()?.unload(model).await?;
        tracing::warn!(model, "model unloaded by the admin plane");
        Ok(())
    }

    /// Every decision replica with its injected fault.
    pub fn replicas(&self) -> Result<Vec<FaultState>, RouterError> {
        let engine = self.engine()?;
        Ok(engine
            .replicas()
            .into_iter()
            .map(|id| {
                let (delay, fail) = engine.fault(&id).map(|f| f.get()).unwrap_or_default();
                FaultState {
                    replica: id,
                    delay_ms: delay.as_millis() as u64,
                    fail,
                }
            })
            .collect())
    }

    /// Injects (or clears, with zeros) trouble into one replica: for drills and demos.
    /// A delay is at most [`MAX_FAULT_DELAY_MS`].
    pub fn set_fault(&self, f: &FaultState) -> Result<(), RouterError> {
        if !self.fault_injection {
            return Err(RouterError::NotFound(
                "fault injection is off; set [admin] fault_injection = true in mesh.toml to turn it on"
                    .into(),
            ));
        }
        if f.delay_ms > MAX_FAULT_DELAY_MS {
            return Err(RouterError::invalid(format!(
                "delay_ms = {} is over the limit of {MAX_FAULT_DELAY_MS}",
                f.delay_ms
            )));
        }
        let fault = self.engine()?.fault(&f.replica).ok_or_else(|| {
            RouterError::NotFound(format!(
                "no replica '{}' (see GET /admin/replicas)",
                f.replica
            ))
        })?;
        fault.set(Duration::from_millis(f.delay_ms), f.fail);
        tracing::warn!(replica = %f.replica, delay_ms = f.delay_ms, fail = f.fail, "fault injected");
        Ok(())
    }
}

/// Longest delay a fault may inject, ms: a drill stalls a replica for longer than
/// any deadline, not for ever.
pub const MAX_FAULT_DELAY_MS: u64 = 60_000;

type HttpResult = Result<Response, RouterError>;

/// The admin plane's HTTP routes, each behind [`crate::auth::http_admin_guard`]
/// (credential, `Origin` allow-list, `application/json`, audit line).
pub fn routes(admin: Admin, planes: Arc<Planes>) -> Router {
    Router::new()
        .route("/admin/replicas", get(replicas))
        .route("/admin/faults", post(set_fault))
        .route("/v2/repository/models/{model}/load", post(load))
        .route("/v2/repository/models/{model}/unload", post(unload))
        .route_layer(axum::middleware::from_fn_with_state(
            planes,
            crate::auth::http_admin_guard,
        ))
        .with_state(admin)
}

async fn replicas(State(a): State<Admin>) -> HttpResult {
    Ok(Json(json!({ "replicas": a.replicas()? })).into_response())
}

async fn set_fault(State(a): State<Admin>, body: Body) -> HttpResult {
    let body = body.map_err(|e| RouterError::invalid(format!("request body: {e}")))?;
    let f: FaultState =
        serde_json::from_slice(&body).map_err(|e| RouterError::invalid(format!("fault: {e}")))?;
    a.set_fault(&f)?;
    Ok(StatusCode::OK.into_response())
}

async fn load(State(a): State<Admin>, Path(model): Path<String>) -> HttpResult {
    a.load(&model).await?;
    Ok(StatusCode::OK.into_response())
}

async fn unload(State(a): State<Admin>, Path(model): Path<String>) -> HttpResult {
    a.unload(&model).await?;
    Ok(StatusCode::OK.into_response())
}
