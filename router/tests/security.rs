//! Secure by default (issue 12), against real servers on 127.0.0.1:0: the admin
//! and writer planes need their credential (none configured = off, wrong = 403 /
//! PERMISSION_DENIED), browser-unsafe admin calls are refused, fault injection
//! and model control are off unless turned on, the data plane stays open; TLS and
//! mTLS on both ports with a throwaway CA made here (rcgen); certificates reload
//! without a restart; the router reaches a model role over mTLS.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mesh_proto::inference as ipb;
use mesh_proto::mesh::v1 as pb;
use mesh_router::config::MeshConfig;
use mesh_router::server::{start_mesh, Running};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
const WRITER_TOKEN: &str = "writer-token-0123456789abcdef";

// ---- fixtures

/// A model repository with the example model and the reference weights, a
/// views file; returns (models dir, views file).
fn files(dir: &Path) -> (PathBuf, PathBuf) {
    let model_toml =
        std::fs::read_to_string(common::root().join("examples/models/fraud_mlp/model.toml"))
            .unwrap();
    let models = common::model_repo(&dir.join("models"), &[1], &model_toml);
    let views = common::root().join("examples/features/views.toml");
    (models, views)
}

/// A mesh (models, feature store) with `extra` appended to its mesh.toml.
async fn mesh(dir: &Path, extra: &str) -> Running {
    mesh_as(dir, "all", extra).await
}

async fn mesh_as(dir: &Path, role: &str, extra: &str) -> Running {
    let (models, views) = files(dir);
    let text = format!(
        r#"
        [server]
        role = "{role}"
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [features]
        path = "{db}"
        views = "{views}"
        {extra}
        "#,
        models = models.display(),
        db = dir.join("db").display(),
        views = views.display(),
    );
    let cfg = MeshConfig::from_toml(&text).unwrap();
    start_mesh(&cfg).await.unwrap()
}

/// `[admin]` with a token file (mode 0600) and `[writer]` with a token env var.
fn credentials(dir: &Path, admin_extra: &str) -> String {
    let token = dir.join("admin.token");
    std::fs::write(&token, format!("{ADMIN_TOKEN}\n")).unwrap();
    // Each test process sets the same value; no test unsets it.
    std::env::set_var("MESH_TEST_WRITER_TOKEN", WRITER_TOKEN);
    format!(
        "[admin]\ntoken_file = \"{}\"\n{admin_extra}\n[writer]\ntoken_env = \"MESH_TEST_WRITER_TOKEN\"\n",
        token.display()
    )
}

// ---- a small HTTP/1.1 client (plain or TLS)

struct Reply {
    status: u16,
    body: String,
}

async fn http_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<Reply> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok())?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Some(Reply { status, body })
}

async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    http_on(s, method, path, headers, body)
        .await
        .unwrap_or_else(|| panic!("no HTTP answer to {method} {path}"))
}

const BEARER: &str = "Bearer admin-token-0123456789abcdef";
const JSON: (&str, &str) = ("content-type", "application/json");

// ---- the planes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_http_routes_need_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let extra = credentials(
        dir.path(),
        "model_control = \"explicit\"\nfault_injection = true",
    );
    let m = mesh(dir.path(), &extra).await;
    let a = m.http_addr;
    let routes: [(&str, &str, &str); 4] = [
        ("GET", "/admin/replicas", ""),
        (
            "POST",
            "/admin/faults",
            r#"{"replica":"nope","delay_ms":1}"#,
        ),
        ("POST", "/v2/repository/models/fraud_mlp/unload", "{}"),
        ("POST", "/v2/repository/models/fraud_mlp/load", "{}"),
    ];
    for (method, path, body) in routes {
        let r = http(a, method, path, &[JSON], body).await;
        assert_eq!(
            r.status, 401,
            "{method} {path} without a credential: {}",
            r.body
        );
        let r = http(
            a,
            method,
            path,
            &[JSON, ("authorization", "Bearer wrong")],
            body,
        )
        .await;
        assert_eq!(
            r.status, 403,
            "{method} {path} with a wrong credential: {}",
            r.body
        );
        assert!(!r.body.contains(ADMIN_TOKEN));
        let r = http(a, method, path, &[JSON, ("authorization", BEARER)], body).await;
        match path {
            // The credential passed; the replica is unknown.
            "/admin/faults" => assert!(
                r.status == 404 && r.body.contains("no replica"),
                "{}",
                r.body
            ),
            _ => assert_eq!(r.status, 200, "{method} {path}: {}", r.body),
        }
    }
    // The data plane needs nothing.
    assert_eq!(
        http(a, "GET", "/v2/health/ready", &[], "").await.status,
        200
    );
    assert_eq!(http(a, "GET", "/metrics", &[], "").await.status, 200);
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_unsafe_admin_calls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let extra = credentials(
        dir.path(),
        "fault_injection = true\nallowed_origins = [\"https://ops.example\"]",
    );
    let m = mesh(dir.path(), &extra).await;
    let body = r#"{"replica":"nope","fail":true}"#;
    let auth = ("authorization", BEARER);
    // text/plain (what a cross-origin form or fetch may send without a preflight).
    let r = http(
        m.http_addr,
        "POST",
        "/admin/faults",
        &[auth, ("content-type", "text/plain")],
        body,
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.body);
    let r = http(m.http_addr, "POST", "/admin/faults", &[auth], body).await;
    assert_eq!(r.status, 415, "no content type: {}", r.body);
    // A foreign Origin, even with the token and JSON.
    let r = http(
        m.http_addr,
        "POST",
        "/admin/faults",
        &[auth, JSON, ("origin", "https://evil.example")],
        body,
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("Origin"), "{}", r.body);
    // An allowed one gets through to the route.
    let r = http(
        m.http_addr,
        "POST",
        "/admin/faults",
        &[auth, JSON, ("origin", "https://ops.example")],
        body,
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_admin_plane_is_off_and_dangerous_things_are_absent() {
    let dir = tempfile::tempdir().unwrap();
    let m = mesh(dir.path(), "").await;
    // No credential configured: refused, whatever is sent.
    for auth in [None, Some(BEARER)] {
        let mut h = vec![JSON];
        h.extend(auth.map(|b| ("authorization", b)));
        let r = http(m.http_addr, "GET", "/admin/replicas", &h, "").await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(r.body.contains("token_file"), "{}", r.body);
        let r = http(
            m.http_addr,
            "POST",
            "/v2/repository/models/fraud_mlp/unload",
            &h,
            "{}",
        )
        .await;
        assert_eq!(r.status, 401, "{}", r.body);
    }
    let mut c = inference(m.grpc_addr).await;
    let e = c.repository_model_unload(unload_req()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // The data plane is open.
    let ready = c
        .model_ready(ipb::ModelReadyRequest {
            name: "fraud_mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap();
    assert!(ready.into_inner().ready);
    m.shutdown().await;

    // A credential, but fault injection and model control left at their defaults.
    let dir = tempfile::tempdir().unwrap();
    let extra = credentials(dir.path(), "");
    let m = mesh(dir.path(), &extra).await;
    let auth = ("authorization", BEARER);
    let r = http(
        m.http_addr,
        "POST",
        "/admin/faults",
        &[auth, JSON],
        r#"{"replica":"x","fail":true}"#,
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("fault_injection = true"), "{}", r.body);
    let r = http(
        m.http_addr,
        "POST",
        "/v2/repository/models/fraud_mlp/unload",
        &[auth, JSON],
        "{}",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("model_control = \\\"explicit\\\""),
        "{}",
        r.body
    );
    let mut c = inference(m.grpc_addr).await;
    let e = c
        .repository_model_unload(authed(unload_req(), ADMIN_TOKEN))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("model_control"), "{e:?}");
    assert!(m
        .core
        .as_ref()
        .unwrap()
        .repo
        .models()
        .iter()
        .any(|x| x.config.name == "fraud_mlp"));
    m.shutdown().await;
}

async fn inference(
    addr: SocketAddr,
) -> ipb::grpc_inference_service_client::GrpcInferenceServiceClient<Channel> {
    ipb::grpc_inference_service_client::GrpcInferenceServiceClient::connect(format!(
        "http://{addr}"
    ))
    .await
    .unwrap()
}

fn unload_req() -> ipb::RepositoryModelUnloadRequest {
    ipb::RepositoryModelUnloadRequest {
        model_name: "fraud_mlp".into(),
        ..Default::default()
    }
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_repository_control_and_push_need_their_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let extra = credentials(dir.path(), "model_control = \"explicit\"");
    let m = mesh(dir.path(), &extra).await;
    let mut c = inference(m.grpc_addr).await;
    let load = || ipb::RepositoryModelLoadRequest {
        model_name: "fraud_mlp".into(),
        ..Default::default()
    };
    // Unload, then load.
    let e = c.repository_model_unload(unload_req()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c
        .repository_model_unload(authed(unload_req(), "wrong"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // The writer's token is not the admin's.
    let e = c
        .repository_model_unload(authed(unload_req(), WRITER_TOKEN))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    c.repository_model_unload(authed(unload_req(), ADMIN_TOKEN))
        .await
        .unwrap();
    let e = c.repository_model_load(load()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c
        .repository_model_load(authed(load(), "wrong"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    c.repository_model_load(authed(load(), ADMIN_TOKEN))
        .await
        .unwrap();

    // Push: the writer plane.
    let mut f =
        pb::feature_store_client::FeatureStoreClient::connect(format!("http://{}", m.grpc_addr))
            .await
            .unwrap();
    let push = || pb::PushRequest {
        view: "card".into(),
        rows: vec![pb::PushRow {
            key: Some(pb::EntityKey {
                key: Some(pb::entity_key::Key::Int64Key(7)),
            }),
            event_time_unix_micros: mesh_feature_store::now_micros(),
            values: vec![pb::NamedFeatureValue {
                name: "amount_sum_24h".into(),
                value: Some(pb::FeatureValue {
                    value: Some(pb::feature_value::Value::F32Value(1.5)),
                }),
            }],
        }],
        wait_for_sync: false,
        ..Default::default()
    };
    let e = f.push(push()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = f.push(authed(push(), "wrong")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = f.push(authed(push(), ADMIN_TOKEN)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let ok = f
        .push(authed(push(), WRITER_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.rows_written, 1);
    // Reads stay open.
    f.list_views(pb::ListViewsRequest {}).await.unwrap();
    m.shutdown().await;
}

// ---- TLS

/// A throwaway CA that signs server and client certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = p.self_signed(&key).unwrap();
        Self { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// (certificate PEM, key PEM) for `names`, a server's or a client's.
    fn issue(&self, names: &[&str], client: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        p.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes the server's certificate and key (and the client CA) under `dir`;
/// returns the `[tls]` table.
fn tls_files(dir: &Path, ca: &Ca, client_ca: Option<&Ca>, reload: &str) -> String {
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"], false);
    std::fs::write(dir.join("server.pem"), cert).unwrap();
    std::fs::write(dir.join("server.key"), key).unwrap();
    let mut t = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\nreload_interval = \"{reload}\"\n",
        dir.join("server.pem").display(),
        dir.join("server.key").display()
    );
    if let Some(c) = client_ca {
        std::fs::write(dir.join("clients.pem"), c.pem()).unwrap();
        t.push_str(&format!(
            "client_ca = \"{}\"\n",
            dir.join("clients.pem").display()
        ));
    }
    t
}

async fn grpc_tls(
    addr: SocketAddr,
    ca: &Ca,
    identity: Option<&(String, String)>,
) -> Result<ipb::grpc_inference_service_client::GrpcInferenceServiceClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some((c, k)) = identity {
        tls = tls.identity(Identity::from_pem(c, k));
    }
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let mut c = ipb::grpc_inference_service_client::GrpcInferenceServiceClient::new(ch);
    c.server_live(ipb::ServerLiveRequest {})
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(c)
}

fn client_config(ca: &Ca, identity: Option<&(String, String)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match identity {
        Some((c, k)) => b
            .with_client_auth_cert(
                rustls_pemfile::certs(&mut c.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                rustls_pemfile::private_key(&mut k.as_bytes())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

/// An HTTPS request; `Err` when the TLS handshake (or the connection) fails.
async fn https(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    // TLS 1.3: a refused client certificate shows on the first read.
    s.write_all(b"").await.map_err(|e| e.to_string())?;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        http_on(s, method, path, headers, ""),
    )
    .await
    .map_err(|_| "timed out".to_string())?;
    r.ok_or_else(|| "no HTTP answer (connection refused after the handshake)".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_both_ports_and_plain_text_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let extra = tls_files(dir.path(), &ca, None, "5s");
    let m = mesh(dir.path(), &extra).await;
    // gRPC over TLS answers.
    let mut c = grpc_tls(m.grpc_addr, &ca, None).await.unwrap();
    assert!(
        c.server_ready(ipb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    // HTTPS answers.
    let r = https(
        m.http_addr,
        client_config(&ca, None),
        "GET",
        "/v2/health/ready",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    // Plain text fails on both.
    let plain = Endpoint::from_shared(format!("http://{}", m.grpc_addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let e = ipb::grpc_inference_service_client::GrpcInferenceServiceClient::new(plain)
        .server_live(ipb::ServerLiveRequest {})
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    let mut s = tokio::net::TcpStream::connect(m.http_addr).await.unwrap();
    s.write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(!String::from_utf8_lossy(&out).contains("200 OK"));
    // A client that does not trust the CA fails.
    let other = Ca::new("other CA");
    assert!(grpc_tls(m.grpc_addr, &other, None).await.is_err());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_good_a_missing_and_a_wrong_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let mut extra = tls_files(dir.path(), &ca, Some(&clients), "5s");
    extra.push_str(
        "[admin]\nallowed_client_names = [\"ops.mesh.internal\"]\nfault_injection = true\n",
    );
    let m = mesh(dir.path(), &extra).await;
    let good = clients.issue(&["router.mesh.internal"], true);
    let ops = clients.issue(&["ops.mesh.internal"], true);
    let wrong = Ca::new("rogue CA").issue(&["router.mesh.internal"], true);

    assert!(grpc_tls(m.grpc_addr, &ca, Some(&good)).await.is_ok());
    assert!(
        grpc_tls(m.grpc_addr, &ca, None).await.is_err(),
        "no client certificate"
    );
    assert!(
        grpc_tls(m.grpc_addr, &ca, Some(&wrong)).await.is_err(),
        "a rogue CA's certificate"
    );

    let r = https(
        m.http_addr,
        client_config(&ca, Some(&good)),
        "GET",
        "/v2/health/ready",
        &[],
    )
    .await;
    assert_eq!(r.unwrap().status, 200);
    assert!(https(
        m.http_addr,
        client_config(&ca, None),
        "GET",
        "/v2/health/ready",
        &[]
    )
    .await
    .is_err());
    assert!(https(
        m.http_addr,
        client_config(&ca, Some(&wrong)),
        "GET",
        "/v2/health/ready",
        &[]
    )
    .await
    .is_err());

    // The admin plane by client-certificate identity: ops is in the allow-list,
    // router is not.
    let r = https(
        m.http_addr,
        client_config(&ca, Some(&ops)),
        "GET",
        "/admin/replicas",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = https(
        m.http_addr,
        client_config(&ca, Some(&good)),
        "GET",
        "/admin/replicas",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    m.shutdown().await;
}

/// Polls until a fresh TLS connection trusting `ca` succeeds.
async fn served_by(addr: SocketAddr, ca: &Ca) -> bool {
    for _ in 0..100 {
        if grpc_tls(addr, ca, None).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_when_the_files_change_and_bad_files_keep_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let first = Ca::new("first CA");
    let extra = tls_files(dir.path(), &first, None, "100ms");
    let m = mesh(dir.path(), &extra).await;
    let mut open = grpc_tls(m.grpc_addr, &first, None).await.unwrap();

    // New files from another CA: picked up without a restart.
    let second = Ca::new("second CA");
    tls_files(dir.path(), &second, None, "100ms");
    assert!(
        served_by(m.grpc_addr, &second).await,
        "the new certificate is not served"
    );
    assert!(grpc_tls(m.grpc_addr, &first, None).await.is_err());
    // The connection opened before the reload still works.
    open.server_live(ipb::ServerLiveRequest {}).await.unwrap();

    // A broken certificate file: the previous one keeps serving.
    std::fs::write(dir.path().join("server.pem"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(grpc_tls(m.grpc_addr, &second, None).await.is_ok());
    m.shutdown().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let first = Ca::new("first CA");
    // Files are checked hourly: only the signal can reload them within the test.
    let extra = tls_files(dir.path(), &first, None, "1h");
    let m = mesh(dir.path(), &extra).await;
    assert!(grpc_tls(m.grpc_addr, &first, None).await.is_ok());
    let second = Ca::new("second CA");
    tls_files(dir.path(), &second, None, "1h");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        served_by(m.grpc_addr, &second).await,
        "SIGHUP did not reload"
    );
    m.shutdown().await;
}

// ---- between roles

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_reaches_a_model_role_over_mtls() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh CA");
    let extra = tls_files(dir.path(), &ca, Some(&ca), "5s");
    let model = mesh_as(dir.path(), "model", &extra).await;

    // The router's side: [tls.client] with the CA and a client certificate.
    let (cert, key) = ca.issue(&["router.mesh.internal"], true);
    std::fs::write(dir.path().join("router.pem"), cert).unwrap();
    std::fs::write(dir.path().join("router.key"), key).unwrap();
    let client_cfg: MeshConfig = MeshConfig::from_toml(&format!(
        "[tls.client]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ndomain = \"localhost\"\n",
        dir.path().join("clients.pem").display(),
        dir.path().join("router.pem").display(),
        dir.path().join("router.key").display(),
    ))
    .unwrap();
    mesh_router::decide::replica::set_client_tls(
        mesh_router::tls::client_tls(&client_cfg.tls.client).unwrap(),
    );
    let url = format!("https://127.0.0.1:{}", model.grpc_addr.port());
    let replica =
        mesh_router::decide::replica::RemoteReplica::new(&url, "fraud_mlp", 1, "input").unwrap();
    let (x, p) = common::samples().remove(0);
    let answer = replica
        .oneshot(mesh_router::decide::replica::ModelCall {
            data: Arc::new(x),
            rows: 1,
            cols: 32,
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        })
        .await
        .unwrap();
    assert!(
        (answer.scores[0] - p).abs() < 1e-4,
        "{} vs {p}",
        answer.scores[0]
    );

    // Without the client certificate the model role refuses the router.
    let no_cert = MeshConfig::from_toml(&format!(
        "[tls.client]\nca = \"{}\"\ndomain = \"localhost\"\n",
        dir.path().join("clients.pem").display(),
    ))
    .unwrap();
    mesh_router::decide::replica::set_client_tls(
        mesh_router::tls::client_tls(&no_cert.tls.client).unwrap(),
    );
    let replica =
        mesh_router::decide::replica::RemoteReplica::new(&url, "fraud_mlp", 1, "input").unwrap();
    let (x, _) = common::samples().remove(0);
    let e = replica
        .oneshot(mesh_router::decide::replica::ModelCall {
            data: Arc::new(x),
            rows: 1,
            cols: 32,
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        })
        .await;
    assert!(e.is_err());
    mesh_router::decide::replica::set_client_tls(None);
    model.shutdown().await;
}
