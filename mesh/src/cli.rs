//! The `mesh` command line: argument types and the commands they run.
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use mesh_router::config::{MeshConfig, Role};
use mesh_router::telemetry::{self, LogFormat};

use crate::logs::LogsCommand;

#[derive(Debug, Parser)]
#[command(
    name = "mesh",
    version,
    about = "inference-mesh: low-latency model serving for fraud and risk decisions"
)]
pub struct Cli {
    /// Log format: human or json.
    #[arg(long, global = true, env = "MESH_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of a repository over gRPC (OIP v2) and HTTP.
    Serve(ServeArgs),
    /// Start the mesh on loopback, drive traffic at it and print what happened.
    Demo(crate::demo::DemoArgs),
    /// Feature store operations.
    #[command(subcommand)]
    Features(FeaturesCommand),
    /// Score every entity of a Parquet file offline and write the scores into a feature view.
    BatchScore(crate::batch_score::BatchScoreArgs),
    /// Drive load at a running mesh and report latency percentiles and throughput.
    Bench(crate::bench::BenchArgs),
    /// The prediction log: label joins and a live tail.
    #[command(subcommand)]
    Logs(LogsCommand),
    /// Send one transaction to a running mesh (mesh.v1.Decisions/Decide) and print the answer.
    Decide(crate::decide::DecideArgs),
}

#[derive(Debug, Subcommand)]
pub enum FeaturesCommand {
    /// Materialize a view from a Parquet or CSV file (atomic batches, newest event time wins).
    Ingest(IngestArgs),
    /// Fill the `card` and `merchant` views of the example views file with synthetic rows.
    Demo(FeaturesDemoArgs),
    /// Read one view's features for some entities from a running mesh (GetOnlineFeatures).
    Get(crate::features::GetArgs),
    /// List the views a running mesh serves, with their keys and features (ListViews).
    List(crate::features::ListArgs),
}

#[derive(Debug, Args)]
pub struct FeaturesDemoArgs {
    #[arg(long, env = "MESH_FEATURES", default_value = "data/features")]
    pub store: PathBuf,
    #[arg(
        long,
        env = "MESH_VIEWS",
        default_value = "examples/features/views.toml"
    )]
    pub views: PathBuf,
    #[arg(long, default_value_t = 10_000)]
    pub cards: u64,
    #[arg(long, default_value_t = 1_000)]
    pub merchants: u64,
}

/// `mesh features demo`.
fn features_demo(args: FeaturesDemoArgs) -> anyhow::Result<()> {
    let views = mesh_feature_store::ViewsConfig::from_path(&args.views)?;
    let store = mesh_feature_store::FeatureStore::open(&args.store, &views)?;
    let r = mesh_feature_store::generate_demo_features(&store, args.cards, args.merchants, 7)?;
    store.flush()?;
    println!("demo features written to {}: {r:?}", args.store.display());
    Ok(())
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The view to write.
    #[arg(long)]
    pub view: String,
    /// Feature store directory (sled).
    #[arg(long, env = "MESH_FEATURES")]
    pub store: PathBuf,
    /// Views file.
    #[arg(long, env = "MESH_VIEWS")]
    pub views: PathBuf,
    /// Rows per atomic batch.
    #[arg(long, default_value_t = 10_000)]
    pub batch_rows: usize,
    /// fsync after every batch instead of once at the end.
    #[arg(long)]
    pub sync_each_batch: bool,
    /// Accept a file that lacks some of the view's features (written as null).
    #[arg(long)]
    pub allow_missing_columns: bool,
    /// Parquet (.parquet) or CSV (.csv) file.
    pub file: PathBuf,
}

/// `mesh features ingest`, with a progress bar on stderr.
fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let views = mesh_feature_store::ViewsConfig::from_path(&args.views)?;
    let store = mesh_feature_store::FeatureStore::open(&args.store, &views)?;
    let opts = mesh_feature_store::IngestOptions {
        batch_rows: args.batch_rows,
        sync_each_batch: args.sync_each_batch,
        allow_missing_columns: args.allow_missing_columns,
    };
    let bar = indicatif::ProgressBar::new(0);
    let on_batch = |b: &mesh_feature_store::BatchCommitted| {
        if bar.length() == Some(0) {
            let template = match b.unit {
                mesh_feature_store::ProgressUnit::Bytes => {
                    "{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})"
                }
                mesh_feature_store::ProgressUnit::Rows => {
                    "{msg} [{bar:40}] {pos}/{len} rows ({eta})"
                }
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(format!("ingest {}", args.view));
            bar.set_length(b.total);
        }
        bar.set_position(b.position);
    };
    let r =
        mesh_feature_store::ingest_file_observed(&store, &args.view, &args.file, &opts, on_batch)
            .with_context(|| format!("ingesting {}", args.file.display()))?;
    bar.finish_and_clear();
    println!(
        "ingested {} rows into '{}' ({} written, {} skipped as older, {} batches) in {:.1} s = {:.0} rows/s",
        r.rows_read,
        r.view,
        r.rows_written,
        r.rows_skipped_older,
        r.batches,
        r.elapsed.as_secs_f64(),
        r.rows_per_sec
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (mesh.toml); flags and MESH_* variables override it.
    #[arg(long, env = "MESH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Model repository directory.
    #[arg(long, env = "MESH_MODELS")]
    pub models: Option<PathBuf>,
    /// Address to bind.
    #[arg(long, env = "MESH_HOST")]
    pub host: Option<IpAddr>,
    /// gRPC port (0 = any free port).
    #[arg(long, env = "MESH_GRPC_PORT")]
    pub grpc_port: Option<u16>,
    /// HTTP port (0 = any free port).
    #[arg(long, env = "MESH_HTTP_PORT")]
    pub http_port: Option<u16>,
    /// Largest request message in bytes.
    #[arg(long, env = "MESH_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Threads one forward pass may use.
    #[arg(long, env = "MESH_COMPUTE_THREADS")]
    pub compute_threads: Option<usize>,
    /// What this process serves: all, router, model or features.
    #[arg(long, env = "MESH_ROLE")]
    pub role: Option<Role>,
    /// Feature store directory (sled).
    #[arg(long, env = "MESH_FEATURES")]
    pub features: Option<PathBuf>,
    /// Feature views file.
    #[arg(long, env = "MESH_VIEWS")]
    pub views: Option<PathBuf>,
}

impl ServeArgs {
    /// Defaults, then the file, then flags/environment.
    pub fn resolve(&self) -> anyhow::Result<MeshConfig> {
        let mut c = match &self.config {
            Some(p) => MeshConfig::from_file(p).map_err(anyhow::Error::msg)?,
            None => MeshConfig::default(),
        };
        let s = &mut c.server;
        if let Some(v) = &self.models {
            s.models = v.clone();
        }
        if let Some(v) = self.host {
            s.host = v;
        }
        if let Some(v) = self.grpc_port {
            s.grpc_port = v;
        }
        if let Some(v) = self.http_port {
            s.http_port = v;
        }
        if let Some(v) = self.max_message_bytes {
            s.max_message_bytes = v;
        }
        if let Some(v) = self.compute_threads {
            s.compute_threads = v.max(1);
        }
        if let Some(v) = self.role {
            s.role = v;
        }
        if let Some(v) = &self.features {
            c.features.path = Some(v.clone());
        }
        if let Some(v) = &self.views {
            c.features.views = Some(v.clone());
        }
        Ok(c)
    }
}

/// Sets the thread count of candle's CPU matmul pool. candle reads
/// `RAYON_NUM_THREADS` from the environment on every call and has no other
/// setting, so the binary sets it once, from [`Command::prepare`], before any other
/// thread exists (setting the environment is race-free only then).
fn set_compute_threads(n: usize) {
    std::env::set_var("RAYON_NUM_THREADS", n.max(1).to_string());
}

/// What a command resolved before the runtime started.
pub struct Prepared {
    /// `mesh serve`'s configuration.
    pub config: Option<MeshConfig>,
}

impl Command {
    /// Resolves the configuration, installs logging and sets the compute threads:
    /// everything that must happen before the runtime's threads exist.
    pub fn prepare(&self, log_format: Option<LogFormat>) -> anyhow::Result<Prepared> {
        let mut config = None;
        let threads = match self {
            Command::Serve(serve) => {
                let c = serve.resolve()?;
                let threads = c.server.compute_threads;
                telemetry::init_logs(log_format.unwrap_or(c.log.format));
                let file = serve.config.clone().unwrap_or_default();
                for notice in &c.deprecations {
                    tracing::warn!(config = %file.display(), "{notice}");
                }
                config = Some(c);
                Some(threads)
            }
            // Logs commands print to stdout and log nothing.
            Command::Logs(_) => return Ok(Prepared { config }),
            Command::Demo(_) | Command::BatchScore(_) => Some(1),
            Command::Features(_) | Command::Bench(_) | Command::Decide(_) => None,
        };
        if !matches!(self, Command::Serve(_)) {
            // One-shot commands print their own summary: only warnings and errors
            // are logged unless RUST_LOG asks for more. The demo runs a mesh and
            // reports on it, so it keeps info.
            let level = if matches!(self, Command::Demo(_)) {
                "info"
            } else {
                "warn"
            };
            telemetry::init_logs_at(log_format.unwrap_or_default(), level);
        }
        if let Some(n) = threads {
            set_compute_threads(n);
        }
        Ok(Prepared { config })
    }
}

/// Runs a `mesh features` command: the offline ones on this thread, the ones that
/// call a running mesh on a small runtime of their own.
pub fn features(command: FeaturesCommand) -> anyhow::Result<()> {
    let client = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    match command {
        FeaturesCommand::Demo(a) => features_demo(a),
        FeaturesCommand::Ingest(a) => ingest(a),
        FeaturesCommand::Get(a) => client()?.block_on(crate::features::get(a)),
        FeaturesCommand::List(a) => client()?.block_on(crate::features::list(a)),
    }
}

/// Runs a command that needs the runtime.
pub async fn run(command: Command, prepared: Prepared) -> anyhow::Result<()> {
    match command {
        Command::Serve(_) => serve(prepared.config.context("serve without a configuration")?).await,
        Command::Demo(a) => crate::demo::run(a).await,
        Command::BatchScore(a) => crate::batch_score::run(a).await,
        Command::Bench(a) => {
            let json = a.json;
            let report = crate::bench::run(a).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
        Command::Logs(c) => crate::logs::run(c),
        Command::Features(c) => features(c),
        Command::Decide(a) => crate::decide::run(a).await,
    }
}

/// `mesh serve`: runs until Ctrl-C or SIGTERM, then drains and stops.
async fn serve(config: MeshConfig) -> anyhow::Result<()> {
    let mut running = mesh_router::server::start_mesh(&config).await?;
    println!(
        "mesh serving: grpc={} http={}",
        running.grpc_addr, running.http_addr
    );
    let stop = running.stopper();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown signal received; draining");
        let _ = stop.send(true);
    });
    running.wait().await;
    running.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
