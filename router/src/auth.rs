//! Planes and credentials. Inference, health, metadata, `/metrics`, Decide and
//! feature lookups are the data plane and stay open. Two planes change state and
//! need a credential:
//! - the **admin** plane: repository load/unload (gRPC `RepositoryModelLoad` /
//!   `RepositoryModelUnload`, HTTP `/v2/repository/models/{m}/load|unload`) and
//!   every `/admin/*` route (fault injection, replica listing);
//! - the **writer** plane: feature writes (`mesh.v1.FeatureStore/Push`).
//!
//! A credential is a bearer token (`authorization: Bearer <token>`, compared in
//! constant time) read from a file or an environment variable named in mesh.toml,
//! never from the command line, and/or, under mTLS, a client certificate whose
//! identity (a DNS/URI/email SAN or the subject CN) is in `allowed_client_names`.
//! With no credential configured a plane is off: every call is UNAUTHENTICATED /
//! 401. A wrong credential is PERMISSION_DENIED / 403 and logged at warn with the
//! caller's address (never the secret). Every admin-plane call, allowed or not,
//! leaves one audit line (target `audit`: who, what, when, outcome).
//!
//! ```toml
//! # mesh.toml
//! [admin]
//! token_file = "/etc/mesh/admin.token"  # or token_env = "MESH_ADMIN_TOKEN"
//! allowed_client_names = []             # client-certificate identities (mTLS) also admitted
//! model_control = "none"                # none (models load at start only) | explicit
//! fault_injection = false               # POST /admin/faults exists only when true
//! allowed_origins = []                  # browser Origins admitted (none by default)
//!
//! [writer]
//! token_env = "MESH_WRITER_TOKEN"       # or token_file
//! allowed_client_names = []
//! ```
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::listen::PeerInfo;

/// Whether repository load/unload may be asked for at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelControl {
    /// Models load at start only; load/unload are refused.
    #[default]
    None,
    /// Load and unload on request (with the admin credential).
    Explicit,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A file holding the admin token (surrounding whitespace ignored).
    pub token_file: Option<PathBuf>,
    /// An environment variable holding the admin token.
    pub token_env: Option<String>,
    /// Client-certificate identities admitted to the admin plane (mTLS only).
    pub allowed_client_names: Vec<String>,
    pub model_control: ModelControl,
    /// Fault injection (`POST /admin/faults`) exists only when true.
    pub fault_injection: bool,
    /// Browser origins whose requests the admin routes accept; a request with an
    /// `Origin` header not listed here is refused.
    pub allowed_origins: Vec<String>,
}

/// `[writer]`: the credential of feature writes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WriterConfig {
    pub token_file: Option<PathBuf>,
    pub token_env: Option<String>,
    pub allowed_client_names: Vec<String>,
}

/// A token, never printed.
#[derive(Clone)]
struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The credential of one plane, loaded at start.
#[derive(Debug, Clone)]
pub struct Plane {
    /// `admin` or `writer`, the section of mesh.toml.
    pub name: &'static str,
    token: Option<Secret>,
    names: Vec<String>,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No credential (or the plane has none configured): UNAUTHENTICATED / 401.
    Unauthenticated(String),
    /// A credential that is not the right one: PERMISSION_DENIED / 403.
    Forbidden(String),
}

impl Denied {
    pub fn status(&self) -> tonic::Status {
        match self {
            Self::Unauthenticated(m) => tonic::Status::unauthenticated(m.clone()),
            Self::Forbidden(m) => tonic::Status::permission_denied(m.clone()),
        }
    }

    pub fn http(&self) -> Response {
        let (code, m) = match self {
            Self::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, m),
            Self::Forbidden(m) => (StatusCode::FORBIDDEN, m),
        };
        let mut res = (code, axum::Json(serde_json::json!({ "error": m }))).into_response();
        if code == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        res
    }
}

/// Reads a token from `file` or the variable `env` (one of them).
fn read_token(
    section: &str,
    file: Option<&PathBuf>,
    env: Option<&String>,
) -> Result<Option<Secret>, String> {
    let text = match (file, env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "[{section}] sets both token_file and token_env: keep one"
            ))
        }
        (None, None) => return Ok(None),
        (Some(path), None) => read_secret_file(section, path, MAX_TOKEN_FILE_BYTES)
            .map_err(|e| format!("[{section}] token_file {}: {e}", path.display()))?,
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            format!("[{section}] token_env names {var}, which is not set (or not UTF-8)")
        })?,
    };
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("[{section}] token is empty"));
    }
    if token.len() < 16 {
        tracing::warn!(
            section,
            "the [{section}] token is shorter than 16 characters; use a long random one"
        );
    }
    Ok(Some(Secret(token.as_bytes().to_vec())))
}

/// The most a `token_file` may hold, bytes (a token and a newline).
pub const MAX_TOKEN_FILE_BYTES: usize = 4096;

/// Reads a secret file of at most `max` bytes, warning when group or others may
/// read it. Reads at most `max + 1` bytes whatever the file's size (a file that
/// grows, or a device, costs no more); the error names the limit, never the
/// contents.
pub(crate) fn read_secret_file(
    section: &str,
    path: &std::path::Path,
    max: usize,
) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    warn_if_readable_by_others(section, path);
    let mut bytes = Vec::with_capacity(max.min(4096) + 1);
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() > max {
        return Err(format!("is more than {max} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "is not UTF-8".into())
}

#[cfg(unix)]
pub(crate) fn warn_if_readable_by_others(section: &str, path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!(section, file = %path.display(), "the secret file can be read by group or others; chmod 600 it");
        }
    }
}

#[cfg(not(unix))]
pub(crate) fn warn_if_readable_by_others(_: &str, _: &std::path::Path) {}

/// Equal in time that depends only on the length of `expected`.
fn ct_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut buf = vec![0u8; expected.len()];
    let n = given.len().min(expected.len());
    buf[..n].copy_from_slice(&given[..n]);
    let same_len = (given.len() as u64).ct_eq(&(expected.len() as u64));
    (buf.as_slice().ct_eq(expected) & same_len).into()
}

impl Plane {
    /// A plane with no credential: every call refused.
    pub fn off(name: &'static str) -> Self {
        Self {
            name,
            token: None,
            names: Vec::new(),
        }
    }

    fn load(
        name: &'static str,
        file: Option<&PathBuf>,
        env: Option<&String>,
        names: &[String],
    ) -> Result<Self, String> {
        Ok(Self {
            name,
            token: read_token(name, file, env)?,
            names: names.to_vec(),
        })
    }

    pub fn admin(cfg: &AdminConfig) -> Result<Self, String> {
        Self::load(
            "admin",
            cfg.token_file.as_ref(),
            cfg.token_env.as_ref(),
            &cfg.allowed_client_names,
        )
    }

    pub fn writer(cfg: &WriterConfig) -> Result<Self, String> {
        Self::load(
            "writer",
            cfg.token_file.as_ref(),
            cfg.token_env.as_ref(),
            &cfg.allowed_client_names,
        )
    }

    /// Whether any credential is configured (otherwise the plane is off).
    pub fn configured(&self) -> bool {
        self.token.is_some() || !self.names.is_empty()
    }

    /// Checks the `authorization` header and the peer's certificate identities.
    /// Returns how the caller proved itself (`token` or `client certificate`).
    pub fn check(
        &self,
        authorization: Option<&[u8]>,
        peer: &PeerInfo,
    ) -> Result<&'static str, Denied> {
        let plane = self.name;
        if !self.configured() {
            return Err(Denied::Unauthenticated(format!(
                "the {plane} plane is off: no credential is configured (set [{plane}] token_file \
                 or token_env, or allowed_client_names under mTLS)"
            )));
        }
        let who = peer.who();
        if let Some(value) = authorization {
            let token = value
                .strip_prefix(b"Bearer ")
                .or_else(|| value.strip_prefix(b"bearer "))
                .map(<[u8]>::trim_ascii);
            let ok = match (token, &self.token) {
                (Some(t), Some(expected)) => ct_matches(t, &expected.0),
                _ => false,
            };
            if ok {
                return Ok("token");
            }
            tracing::warn!(plane, peer = %who, "wrong credential for the {plane} plane");
            return Err(Denied::Forbidden(format!(
                "wrong credential for the {plane} plane"
            )));
        }
        if peer
            .client_names
            .iter()
            .any(|n| self.names.iter().any(|a| a == n))
        {
            return Ok("client certificate");
        }
        if peer.client_cert && !self.names.is_empty() {
            tracing::warn!(plane, peer = %who, names = ?peer.client_names, "client certificate not allowed on the {plane} plane");
            return Err(Denied::Forbidden(format!(
                "this client certificate is not allowed on the {plane} plane"
            )));
        }
        Err(Denied::Unauthenticated(format!(
            "the {plane} plane needs a credential: authorization: Bearer <token>"
        )))
    }
}

/// One audit line: who (peer address, certificate names), what, when, outcome.
pub fn audit(plane: &str, peer: &PeerInfo, via: &str, what: &str, outcome: &str) {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    tracing::info!(target: "audit", plane, who = %peer.who(), names = ?peer.client_names, via, what, outcome, at_unix_ms = at as u64, "{plane} call");
}

/// The credentials of both planes, loaded once at start.
#[derive(Debug, Clone)]
pub struct Planes {
    pub admin: Plane,
    pub writer: Plane,
    /// Origins the admin routes accept (besides requests with no `Origin`).
    pub allowed_origins: Vec<String>,
}

impl Planes {
    pub fn load(admin: &AdminConfig, writer: &WriterConfig) -> Result<Self, String> {
        Ok(Self {
            admin: Plane::admin(admin)?,
            writer: Plane::writer(writer)?,
            allowed_origins: admin.allowed_origins.clone(),
        })
    }

    /// Both planes off.
    pub fn off() -> Self {
        Self {
            admin: Plane::off("admin"),
            writer: Plane::off("writer"),
            allowed_origins: Vec::new(),
        }
    }

    /// The plane of a gRPC method path, `None` for the data plane.
    pub fn grpc_plane(&self, path: &str) -> Option<&Plane> {
        match path {
            "/inference.GRPCInferenceService/RepositoryModelLoad"
            | "/inference.GRPCInferenceService/RepositoryModelUnload" => Some(&self.admin),
            "/mesh.v1.FeatureStore/Push" => Some(&self.writer),
            _ => None,
        }
    }
}

// ---- gRPC: a tower layer in front of every service

/// Checks the credential of admin- and writer-plane RPCs before they run.
#[derive(Clone)]
pub struct GrpcGuardLayer(pub Arc<Planes>);

impl<S> tower::Layer<S> for GrpcGuardLayer {
    type Service = GrpcGuard<S>;
    fn layer(&self, inner: S) -> GrpcGuard<S> {
        GrpcGuard {
            inner,
            planes: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcGuard<S> {
    inner: S,
    planes: Arc<Planes>,
}

type BoxFut<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for GrpcGuard<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFut<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let Some(plane) = self.planes.grpc_plane(&path).cloned() else {
            return Box::pin(self.inner.call(req));
        };
        let peer = req
            .extensions()
            .get::<PeerInfo>()
            .cloned()
            .unwrap_or_default();
        let checked = plane.check(
            req.headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            &peer,
        );
        let what = path.rsplit('/').next().unwrap_or_default().to_owned();
        match checked {
            Err(denied) => {
                audit(plane.name, &peer, "-", &what, refusal(&denied));
                let status = denied.status();
                Box::pin(async move { Ok(status.into_http()) })
            }
            Ok(via) => {
                // Swap in a ready clone (tower's rule for services called later).
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(async move {
                    let res = inner.call(req).await?;
                    let outcome = res
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .map(|c| format!("grpc-status {c}"))
                        .unwrap_or_else(|| "ok".into());
                    audit(plane.name, &peer, via, &what, &outcome);
                    Ok(res)
                })
            }
        }
    }
}

fn refusal(d: &Denied) -> &'static str {
    match d {
        Denied::Unauthenticated(_) => "refused: unauthenticated",
        Denied::Forbidden(_) => "refused: permission denied",
    }
}

// ---- HTTP: a middleware on the admin routes

/// The admin plane's HTTP gate, in order: the credential (401/403), the
/// `Origin` allow-list (403), `application/json` for state-changing methods
/// (415); then the route, and an audit line with its status.
pub async fn http_admin_guard(
    State(planes): State<Arc<Planes>>,
    req: Request,
    next: Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<PeerInfo>>()
        .map(|c| c.0.clone())
        .unwrap_or_default();
    let what = format!("{} {}", req.method(), req.uri().path());
    let plane = &planes.admin;
    let via = match plane.check(
        req.headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        &peer,
    ) {
        Ok(via) => via,
        Err(denied) => {
            audit(plane.name, &peer, "-", &what, refusal(&denied));
            return denied.http();
        }
    };
    if let Some(origin) = req.headers().get(http::header::ORIGIN) {
        let allowed = origin
            .to_str()
            .map(|o| planes.allowed_origins.iter().any(|a| a == o))
            .unwrap_or(false);
        if !allowed {
            tracing::warn!(peer = %peer.who(), origin = ?origin, "admin call from an Origin not in [admin] allowed_origins");
            audit(plane.name, &peer, via, &what, "refused: origin not allowed");
            return (
                StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({
                    "error": "this Origin is not allowed on the admin plane ([admin] allowed_origins)"
                })),
            )
                .into_response();
        }
    }
    let changes_state = !matches!(
        *req.method(),
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    );
    if changes_state && !is_json(req.headers()) {
        audit(
            plane.name,
            &peer,
            via,
            &what,
            "refused: not application/json",
        );
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            axum::Json(serde_json::json!({
                "error": "admin calls that change state take Content-Type: application/json"
            })),
        )
            .into_response();
    }
    let res = next.run(req).await;
    audit(plane.name, &peer, via, &what, res.status().as_str());
    res
}

fn is_json(h: &http::HeaderMap) -> bool {
    h.get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_read_within_their_bound() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("admin.token");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        let token = read_token("admin", Some(&file), None).unwrap().unwrap();
        assert_eq!(token.0, b"0123456789abcdef0123");
        // One byte over the bound: refused, naming the limit, not the contents.
        let big = format!("{}x", "s".repeat(MAX_TOKEN_FILE_BYTES));
        std::fs::write(&file, &big).unwrap();
        let e = read_token("admin", Some(&file), None).unwrap_err();
        assert!(
            e.contains("[admin] token_file")
                && e.contains("more than 4096 bytes")
                && !e.contains("sss"),
            "{e}"
        );
        std::fs::write(&file, &big[..MAX_TOKEN_FILE_BYTES]).unwrap();
        assert!(read_token("admin", Some(&file), None).is_ok());
        std::fs::write(&file, [0xff, 0xfe, b'a']).unwrap();
        assert!(read_token("admin", Some(&file), None)
            .unwrap_err()
            .contains("not UTF-8"));
        let e = read_token("admin", Some(&dir.path().join("nope")), None).unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(ct_matches(b"abcdef", b"abcdef"));
        assert!(!ct_matches(b"abcde", b"abcdef"));
        assert!(!ct_matches(b"abcdefg", b"abcdef"));
        assert!(!ct_matches(b"", b"abcdef"));
        assert!(!ct_matches(b"abcdeF", b"abcdef"));
    }

    #[test]
    fn no_credential_means_off_and_wrong_means_forbidden() {
        let peer = PeerInfo::default();
        let off = Plane::off("admin");
        assert!(matches!(
            off.check(Some(b"Bearer x"), &peer),
            Err(Denied::Unauthenticated(_))
        ));
        let p = Plane {
            name: "admin",
            token: Some(Secret(b"s3cret-token-value".to_vec())),
            names: vec![],
        };
        assert!(matches!(
            p.check(None, &peer),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            p.check(Some(b"Bearer nope"), &peer),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            p.check(Some(b"Basic s3cret-token-value"), &peer),
            Err(Denied::Forbidden(_))
        ));
        assert_eq!(
            p.check(Some(b"Bearer s3cret-token-value"), &peer),
            Ok("token")
        );
        assert!(!format!("{p:?}").contains("s3cret"));
    }

    #[test]
    fn client_names_admit_under_mtls() {
        let p = Plane {
            name: "admin",
            token: None,
            names: vec!["ops.example".into()],
        };
        let mut peer = PeerInfo {
            client_cert: true,
            client_names: Arc::new(vec!["ops.example".into()]),
            ..PeerInfo::default()
        };
        assert_eq!(p.check(None, &peer), Ok("client certificate"));
        peer.client_names = Arc::new(vec!["other".into()]);
        assert!(matches!(p.check(None, &peer), Err(Denied::Forbidden(_))));
    }
}
