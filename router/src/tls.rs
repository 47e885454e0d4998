//! TLS (rustls, ring provider, TLS 1.2 and 1.3 only) on both ports, mTLS when a
//! client CA is set, certificates reloaded from disk without a restart, and the
//! client side used to reach remote roles.
//!
//! ```toml
//! # mesh.toml
//! [tls]
//! cert = "/etc/mesh/tls/server.pem"      # chain, leaf first (PEM)
//! key = "/etc/mesh/tls/server.key"       # PKCS#8, PKCS#1 or SEC1 (PEM)
//! client_ca = "/etc/mesh/tls/clients.pem" # optional: clients must present a certificate it signed
//! reload_interval = "5s"                 # files checked for changes this often (and on SIGHUP)
//!
//! [tls.client]                           # the router's side, to remote `https://` replicas
//! ca = "/etc/mesh/tls/ca.pem"            # trusts the remote role's certificate
//! cert = "/etc/mesh/tls/router.pem"      # optional client certificate (for mTLS)
//! key = "/etc/mesh/tls/router.key"
//! domain = "model.mesh.internal"         # optional: the name checked in the remote's certificate
//! ```
//!
//! Both servers accept from [`crate::listen::Limited`], which runs the handshake
//! (so the connection cap and the idle timeout hold for TLS too). A reload — on
//! SIGHUP, or when the files' size or modification time change — builds a new
//! server configuration and swaps it in for the next handshakes; connections
//! already open keep theirs. Files that do not load (a key that does not match
//! the certificate, a half-written file) leave the old configuration serving and
//! say why at warn.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// `[tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain (PEM). With `key`, both ports speak TLS.
    pub cert: Option<PathBuf>,
    /// The server's private key (PEM).
    pub key: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to (mTLS).
    pub client_ca: Option<PathBuf>,
    /// How often the files are checked for changes.
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub reload_interval: Duration,
    /// `[tls.client]`: how this process reaches remote roles.
    pub client: TlsClientConfig,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            reload_interval: Duration::from_secs(5),
            client: TlsClientConfig::default(),
        }
    }
}

/// `[tls.client]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsClientConfig {
    /// CA certificates (PEM) trusted for remote roles' certificates.
    pub ca: Option<PathBuf>,
    /// This process's client certificate chain (PEM), for remote roles with mTLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name expected in the remote's certificate (default: the URL's host).
    pub domain: Option<String>,
}

impl TlsConfig {
    /// Whether the servers speak TLS.
    pub fn serves(&self) -> bool {
        self.cert.is_some()
    }

    pub fn validate(&self) -> Result<(), String> {
        match (&self.cert, &self.key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err("[tls] cert and key go together: set both or neither".into())
            }
            _ => {}
        }
        if self.client_ca.is_some() && self.cert.is_none() {
            return Err("[tls] client_ca needs cert and key (mTLS is TLS first)".into());
        }
        if self.reload_interval.is_zero() {
            return Err("[tls] reload_interval must be more than 0".into());
        }
        let c = &self.client;
        match (&c.cert, &c.key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err("[tls.client] cert and key go together: set both or neither".into())
            }
            _ => {}
        }
        if c.cert.is_some() && c.ca.is_none() {
            return Err(
                "[tls.client] cert needs ca (the CA that signed the remote roles' certificates)"
                    .into(),
            );
        }
        Ok(())
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, what)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path, "[tls] key")?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| format!("[tls] key {}: {e}", path.display()))?
        .ok_or_else(|| format!("[tls] key {}: no PEM private key in it", path.display()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration from the files of `[tls]`: TLS 1.2+, ALPN h2 and
/// http/1.1, client certificates required when `client_ca` is set.
pub fn server_config(cfg: &TlsConfig) -> Result<ServerConfig, String> {
    let (Some(cert), Some(key_path)) = (&cfg.cert, &cfg.key) else {
        return Err("[tls] cert and key are not set".into());
    };
    let chain = certs(cert, "[tls] cert")?;
    let key = key(key_path)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca, "[tls] client_ca")? {
                roots
                    .add(c)
                    .map_err(|e| format!("[tls] client_ca {}: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("[tls] client_ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("[tls] cert/key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The identities of a client's certificate: whether it sent one, and its DNS,
/// URI and email SANs and subject CN.
pub fn client_identity(conn: &rustls::ServerConnection) -> (bool, Vec<String>) {
    let Some(first) = conn.peer_certificates().and_then(|c| c.first()) else {
        return (false, Vec::new());
    };
    let mut names = Vec::new();
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(first.as_ref()) {
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            use x509_parser::extensions::GeneralName;
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                        names.push((*s).to_owned())
                    }
                    _ => {}
                }
            }
        }
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_owned());
            }
        }
    }
    (true, names)
}

/// The server side: the configuration in force, swapped by reloads.
#[derive(Clone)]
pub struct Acceptor {
    current: Arc<RwLock<Arc<ServerConfig>>>,
    cfg: Arc<TlsConfig>,
}

/// What a file looked like when last read: size and modification time.
type Stamp = Vec<Option<(u64, SystemTime)>>;

impl Acceptor {
    /// Loads the files of `[tls]`; an error names the file and what is wrong.
    pub fn load(cfg: &TlsConfig) -> Result<Self, String> {
        let config = server_config(cfg)?;
        tracing::info!(
            cert = ?cfg.cert,
            mtls = cfg.client_ca.is_some(),
            "TLS on both ports (TLS 1.2+)"
        );
        Ok(Self {
            current: Arc::new(RwLock::new(Arc::new(config))),
            cfg: Arc::new(cfg.clone()),
        })
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().clone()
    }

    /// Reads the files again; on success the new configuration serves the next
    /// handshakes, on failure the old one stays (and the error says why).
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.cfg)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }

    fn stamp(&self) -> Stamp {
        [&self.cfg.cert, &self.cfg.key, &self.cfg.client_ca]
            .into_iter()
            .flatten()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.len(), m.modified().ok()?)))
            })
            .collect()
    }

    fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => tracing::info!(why, "TLS certificates reloaded"),
            Err(e) => {
                tracing::warn!(why, error = %e, "TLS certificates not reloaded; the previous ones keep serving")
            }
        }
    }

    /// Reloads on SIGHUP and when the files change, until `stopped` turns true.
    pub fn watch(self, mut stopped: watch::Receiver<bool>) -> JoinHandle<()> {
        // Registered before returning, so a SIGHUP from now on reloads (and never
        // takes the default action, which ends the process).
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        tokio::spawn(async move {
            let mut last = self.stamp();
            let mut tick = tokio::time::interval(self.cfg.reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<Option<()>>();
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = hangup => {
                        last = self.stamp();
                        self.reload_logged("SIGHUP");
                    }
                    _ = tick.tick() => {
                        let now = self.stamp();
                        if now != last {
                            last = now;
                            self.reload_logged("files changed");
                        }
                    }
                }
            }
        })
    }
}

/// The client side of `[tls.client]` for tonic channels; `None` when unset.
pub fn client_tls(
    c: &TlsClientConfig,
) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
    let Some(ca) = &c.ca else {
        return Ok(None);
    };
    let mut t = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(read(ca, "[tls.client] ca")?),
    );
    if let (Some(cert), Some(key)) = (&c.cert, &c.key) {
        t = t.identity(tonic::transport::Identity::from_pem(
            read(cert, "[tls.client] cert")?,
            read(key, "[tls.client] key")?,
        ));
    }
    if let Some(d) = &c.domain {
        t = t.domain_name(d.clone());
    }
    Ok(Some(t))
}
