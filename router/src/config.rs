//! `mesh.toml`: the typed configuration of `mesh serve`. Precedence, lowest first:
//! built-in defaults, the file (`--config`), `MESH_*` environment variables, flags.
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::telemetry::LogFormat;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeshConfig {
    pub server: ServerConfig,
    pub log: LogConfig,
    pub features: FeaturesConfig,
    pub decisions: crate::decide::config::DecisionsConfig,
    /// Where every prediction is logged; off when absent.
    pub prediction_log: Option<crate::plog::PredictionLogConfig>,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            log: LogConfig::default(),
            features: FeaturesConfig::default(),
            decisions: Default::default(),
            prediction_log: None,
        }
    }
}

/// What `mesh serve` runs in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything: decisions, OIP model serving, the feature store.
    #[default]
    All,
    /// Decisions and OIP, with the models of this process (plus remote replicas).
    Router,
    /// OIP model serving only (a remote replica for routers elsewhere).
    Model,
    /// The feature store service only.
    Features,
}

/// `[features]`: the online feature store of this process.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FeaturesConfig {
    /// The sled database directory; no store when unset.
    pub path: Option<PathBuf>,
    /// The views file (TOML) the store validates and records.
    pub views: Option<PathBuf>,
    /// Most entity rows in one lookup.
    pub max_keys_per_lookup: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address both servers bind.
    pub host: IpAddr,
    /// gRPC port (0 = any free port).
    pub grpc_port: u16,
    /// HTTP port (0 = any free port).
    pub http_port: u16,
    /// The model repository directory.
    pub models: PathBuf,
    /// Largest request message (gRPC message or HTTP body), bytes.
    pub max_message_bytes: usize,
    /// Cap on any request's deadline, milliseconds.
    pub max_timeout_ms: u64,
    /// Threads each forward pass may use (candle's matmul pool). 1 keeps a
    /// small-batch pass in a few µs; more helps only large batches.
    pub compute_threads: usize,
    pub role: Role,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            grpc_port: 8001,
            http_port: 8000,
            models: PathBuf::from("examples/models"),
            max_message_bytes: 16 << 20,
            max_timeout_ms: 30_000,
            compute_threads: 1,
            role: Role::All,
        }
    }
}

impl ServerConfig {
    pub fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.max_timeout_ms)
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
}

impl MeshConfig {
    /// Reads a `mesh.toml`; errors name the file and the field.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_typos_are_named() {
        let c: MeshConfig = toml::from_str("[server]\ngrpc_port = 9\n").unwrap();
        assert_eq!(c.server.grpc_port, 9);
        assert_eq!(c.server.http_port, 8000);
        let err = toml::from_str::<MeshConfig>("[server]\ngrpc_prot = 9\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("grpc_prot"), "{err}");
    }
}
