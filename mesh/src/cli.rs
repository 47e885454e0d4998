//! The `mesh` command line: argument types and the commands they run.
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use mesh_router::config::{MeshConfig, Role};
use mesh_router::telemetry::{self, LogFormat};

use crate::logs::LogsCommand;
use crate::signals::StopSignals;

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
    /// Let the kernel back this process's memory with transparent huge pages (true,
    /// false, 1, 0, yes, no, on, off); off by default (README "Allocator").
    #[arg(
        long,
        global = true,
        env = "MESH_TRANSPARENT_HUGE_PAGES",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub transparent_huge_pages: bool,
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
    /// Materialize a view from a Parquet or CSV file (batches, newest event time wins).
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
    crate::outln!("demo features written to {}: {r:?}", args.store.display())?;
    Ok(())
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  # a store no process holds open: written directly
  mesh features ingest --view merchant --store data/features --views examples/features/views.toml merchants.csv
  # the store of a running mesh: pushed through it (writer token of its [writer] section)
  MESH_WRITER_TOKEN=... mesh features ingest --addr http://127.0.0.1:8001 --view merchant merchants.csv
  # millisecond epoch numbers in the timestamp column
  mesh features ingest --view card --timestamp-unit ms cards.parquet

File formats (columns, timestamps, booleans, nulls, vectors): feature-store/README.md, \"File formats\".")]
pub struct IngestArgs {
    /// The view to write.
    #[arg(long)]
    pub view: String,
    /// gRPC address of a running mesh (or `mesh serve --role features`): send the
    /// rows through its Push API in batches instead of opening the store directory.
    /// Use it whenever a mesh serves the store (sled lets one process open it).
    #[arg(long, value_name = "URL")]
    pub addr: Option<String>,
    /// With --addr: a file holding the writer-plane token (the mesh's `[writer]`
    /// token), sent as `authorization: Bearer`. Without it, the token is read from
    /// the environment variable MESH_WRITER_TOKEN, if set.
    #[arg(long, value_name = "FILE", requires = "addr")]
    pub token_file: Option<PathBuf>,
    /// Feature store directory (sled), written directly when --addr is absent
    /// [default: data/features].
    #[arg(long, env = "MESH_FEATURES")]
    pub store: Option<PathBuf>,
    /// Views file [default without --addr: examples/features/views.toml]. With
    /// --addr the running store's views are used, and this file, if given, only
    /// supplies the view's `timestamp_unit`.
    #[arg(long, env = "MESH_VIEWS")]
    pub views: Option<PathBuf>,
    /// Rows per batch, validated as a whole (one Push each with --addr)
    /// [default: 10000; with --addr 1000].
    #[arg(long)]
    pub batch_rows: Option<usize>,
    /// With --addr: pushes sent before the first is answered, 1 to 16 (1: one at a
    /// time). A batch holding a key of a push in flight waits for it, so rows are
    /// written in the file's order.
    #[arg(long, value_name = "N", requires = "addr", default_value_t = crate::features::DEFAULT_PUSHES_IN_FLIGHT,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(crate::features::MAX_PUSHES_IN_FLIGHT)))]
    pub pushes_in_flight: u16,
    /// With --addr: send at most this many rows a second (each batch waits for its
    /// turn), so that a load into a mesh that serves traffic leaves it CPU [default:
    /// as fast as the mesh takes them].
    #[arg(long, value_name = "ROWS", requires = "addr",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rows_per_second: Option<u32>,
    /// fsync after every batch instead of once at the end (with --addr: each Push
    /// waits for the store's fsync).
    #[arg(long)]
    pub sync_each_batch: bool,
    /// Accept a file that lacks some of the view's features (written as null).
    #[arg(long)]
    pub allow_missing_columns: bool,
    /// Unit of numeric timestamps in the file: s, ms or us [default: the view's
    /// `timestamp_unit` in the views file, else s]. RFC 3339 text and Parquet
    /// Timestamp columns carry their own unit.
    #[arg(long, value_name = "s|ms|us")]
    pub timestamp_unit: Option<mesh_feature_store::TimestampUnit>,
    /// Parquet (.parquet) or CSV (.csv) file.
    pub file: PathBuf,
}

/// A progress bar on stderr, sized by the first committed batch.
fn progress(
    view: &str,
) -> (
    indicatif::ProgressBar,
    impl Fn(&mesh_feature_store::BatchCommitted),
) {
    let bar = indicatif::ProgressBar::new(0);
    let b2 = bar.clone();
    let view = view.to_owned();
    let on_batch = move |b: &mesh_feature_store::BatchCommitted| {
        if b2.length() == Some(0) {
            let template = match b.unit {
                mesh_feature_store::ProgressUnit::Bytes => {
                    "{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})"
                }
                mesh_feature_store::ProgressUnit::Rows => {
                    "{msg} [{bar:40}] {pos}/{len} rows ({eta})"
                }
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
                b2.set_style(style.progress_chars("=> "));
            }
            b2.set_message(format!("ingest {view}"));
            b2.set_length(b.total);
        }
        b2.set_position(b.position);
    };
    (bar, on_batch)
}

/// `mesh features ingest`, with a progress bar on stderr: directly into a store
/// directory, or with `--addr` through a running store's Push.
fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let views_path = match (&args.views, &args.addr) {
        (Some(p), _) => Some(p.clone()),
        (None, None) => Some(PathBuf::from("examples/features/views.toml")),
        (None, Some(_)) => None,
    };
    let views = views_path
        .as_ref()
        .map(mesh_feature_store::ViewsConfig::from_path)
        .transpose()?;
    let timestamp_unit = args
        .timestamp_unit
        .or_else(|| {
            views
                .as_ref()
                .and_then(|v| v.view(&args.view))
                .map(|v| v.timestamp_unit)
        })
        .unwrap_or_default();
    let default_batch = if args.addr.is_some() { 1_000 } else { 10_000 };
    let opts = mesh_feature_store::IngestOptions {
        batch_rows: args.batch_rows.unwrap_or(default_batch),
        sync_each_batch: args.sync_each_batch,
        allow_missing_columns: args.allow_missing_columns,
        timestamp_unit,
    };
    let (bar, on_batch) = progress(&args.view);
    let r = if let Some(addr) = &args.addr {
        let token = match &args.token_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading the writer token from {}", f.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => std::env::var("MESH_WRITER_TOKEN")
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty()),
        };
        // One worker: pushes in flight progress while this thread reads the file.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let job = crate::features::PushIngest {
            addr: addr.clone(),
            view: args.view.clone(),
            file: args.file.clone(),
            token,
            opts,
            in_flight: usize::from(args.pushes_in_flight),
            rows_per_second: args.rows_per_second,
        };
        crate::features::push_ingest(&rt, job, on_batch)
            .with_context(|| format!("ingesting {} through {addr}", args.file.display()))?
    } else {
        let store_path = args
            .store
            .clone()
            .unwrap_or_else(|| PathBuf::from("data/features"));
        let views = views.context("a views file")?;
        let store = match mesh_feature_store::FeatureStore::open(&store_path, &views) {
            Ok(s) => s,
            Err(mesh_feature_store::FeatureStoreError::Open {
                kind: mesh_feature_store::OpenFailure::LockHeld,
                detail,
                ..
            }) => anyhow::bail!(
                "feature store at {} is locked by another process, most likely the mesh that \
                 serves it ({detail}). Do not move a live store aside: load it through that \
                 mesh instead, with `mesh features ingest --addr http://HOST:GRPC_PORT --view {} \
                 {}` (the writer token from --token-file or MESH_WRITER_TOKEN)",
                store_path.display(),
                args.view,
                args.file.display()
            ),
            Err(e) => return Err(e.into()),
        };
        mesh_feature_store::ingest_file_observed(&store, &args.view, &args.file, &opts, on_batch)
            .with_context(|| format!("ingesting {}", args.file.display()))?
    };
    bar.finish_and_clear();
    let into = match &args.addr {
        Some(a) => format!(" through {a}"),
        None => String::new(),
    };
    crate::outln!(
        "ingested {} rows into '{}'{into} ({} written, {} skipped as older, {} batches) in {:.1} s = {:.0} rows/s",
        r.rows_read,
        r.view,
        r.rows_written,
        r.rows_skipped_older,
        r.batches,
        r.elapsed.as_secs_f64(),
        r.rows_per_sec
    )?;
    Ok(())
}

/// Whether the kernel may back this process's memory with transparent huge pages
/// (`prctl(PR_SET_THP_DISABLE)`: every thread, from now on; Redis turns them off for
/// itself the same way). mimalloc asks for huge pages for its arenas (`madvise`), and
/// a fault in one zeroes 2 MiB at once, again each time memory it handed back is used
/// anew. sled copies a node on every change and the prediction log's encoder fills and
/// drops row groups, so both fault often. On this project's 2-core machine, without
/// them: a 200k-row ingest spent 0.26-0.34 s in the kernel instead of 0.73-2.02 s,
/// pushes through `mesh serve` went 1.2-1.4x faster on 18-27% less server CPU, the
/// server held a third less memory, and lookups from a row cache of 1M entities were
/// as fast (README "Allocator").
pub fn set_transparent_huge_pages(allow: bool) -> std::io::Result<()> {
    rustix::thread::disable_transparent_huge_pages(!allow)?;
    Ok(())
}

#[derive(Debug, Args)]
#[command(after_help = "\
Precedence, lowest first: built-in defaults (shown above), the --config file, MESH_* variables, flags.
Relative paths written in the config file resolve against the file's directory; paths from flags,
MESH_* variables and the built-in defaults resolve against the working directory.")]
pub struct ServeArgs {
    /// Configuration file (mesh.toml); MESH_* variables and flags override it
    /// [default: none, built-in defaults only].
    #[arg(long, env = "MESH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Model repository directory [default: examples/models].
    #[arg(long, env = "MESH_MODELS")]
    pub models: Option<PathBuf>,
    /// Address to bind [default: 127.0.0.1].
    #[arg(long, env = "MESH_HOST")]
    pub host: Option<IpAddr>,
    /// gRPC port, 0 = any free port [default: 8001].
    #[arg(long, env = "MESH_GRPC_PORT")]
    pub grpc_port: Option<u16>,
    /// HTTP port, 0 = any free port [default: 8000].
    #[arg(long, env = "MESH_HTTP_PORT")]
    pub http_port: Option<u16>,
    /// Largest request message in bytes [default: 16777216].
    #[arg(long, env = "MESH_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Threads one forward pass may use [default: 1].
    #[arg(long, env = "MESH_COMPUTE_THREADS")]
    pub compute_threads: Option<usize>,
    /// Threads serving requests, 0 = one per CPU core, at most 1024 [default: 0].
    #[arg(long, env = "MESH_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// What this process serves: all, router, model or features [default: all].
    #[arg(long, env = "MESH_ROLE")]
    pub role: Option<Role>,
    /// Feature store directory (sled) [default: none, no feature store].
    #[arg(long, env = "MESH_FEATURES")]
    pub features: Option<PathBuf>,
    /// Feature views file [default: none; needed with --features].
    #[arg(long, env = "MESH_VIEWS")]
    pub views: Option<PathBuf>,
    /// Read decisions' features from this `mesh serve --role features`
    /// (http://host:port) instead of a store of this process [default: none].
    #[arg(long, env = "MESH_FEATURES_REMOTE", conflicts_with = "features")]
    pub features_remote: Option<String>,
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
        if let Some(v) = self.worker_threads {
            s.worker_threads = mesh_router::config::check_worker_threads("--worker-threads", v)
                .map_err(anyhow::Error::msg)?;
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
        if let Some(v) = &self.features_remote {
            c.features.remote = Some(v.clone());
        }
        // Flags may have set both a store and a remote: checked again here.
        c.features.validate().map_err(anyhow::Error::msg)?;
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
                let mut c = serve.resolve()?;
                // `[prediction_log] reserved_cpus`: this thread, the only one so far,
                // is confined to the CPUs left to serving, and every thread started
                // from here on (the logs' flusher, the runtime, the model runners,
                // the stores) inherits that; the log's threads go to the others. A
                // features-only server runs no log, and sets nothing aside.
                let split = match c.prediction_log.as_mut() {
                    Some(log) if c.server.role != Role::Features => {
                        log.reserve_cpus().map_err(anyhow::Error::msg)?
                    }
                    _ => None,
                };
                let threads = c.server.compute_threads;
                telemetry::init_logs(log_format.unwrap_or(c.log.format));
                if let Some(split) = split {
                    use mesh_prediction_log::priority::cpu_list;
                    tracing::info!(
                        log_cpus = %cpu_list(&split.log),
                        serving_cpus = %cpu_list(&split.serving),
                        "[prediction_log] reserved_cpus: the log's threads run on their own CPUs, every other thread on the rest"
                    );
                    if !split.shared_cores.is_empty() {
                        tracing::warn!(
                            log_cpus = %cpu_list(&split.log),
                            serving_cpus_on_the_same_cores = %cpu_list(&split.shared_cores),
                            "[prediction_log] reserved_cpus: some of the log's CPUs share a core with serving CPUs (hyperthreads); a multiple of the threads per core gives the log whole cores"
                        );
                    }
                }
                let file = serve.config.clone().unwrap_or_default();
                for notice in &c.deprecations {
                    tracing::warn!(config = %file.display(), "{notice}");
                }
                config = Some(c);
                Some(threads)
            }
            Command::Demo(_) | Command::BatchScore(_) => Some(1),
            // Logs commands print to stdout; their warnings (a segment `logs convert`
            // could not convert, SCHED_IDLE refused) are logged on stderr, in JSON
            // with `--log-format json` (the chart's converter sidecar).
            Command::Logs(_) | Command::Features(_) | Command::Bench(_) | Command::Decide(_) => {
                None
            }
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
                crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                crate::out!("{report}")?;
            }
            Ok(())
        }
        Command::Logs(c) => crate::logs::run(c),
        Command::Features(c) => features(c),
        Command::Decide(a) => crate::decide::run(a).await,
    }
}

/// `mesh serve`: runs until Ctrl-C or SIGTERM, then drains and stops. A stop signal
/// that comes while it starts ends the start: nothing was served yet.
async fn serve(config: MeshConfig) -> anyhow::Result<()> {
    // Before the "mesh serving" line, which a caller may answer with SIGTERM at once
    // (see `signals`).
    let mut signals = StopSignals::listen().context("listening for stop signals")?;
    tracing::info!(
        built_for = crate::cpu::built_for(),
        cpu = crate::cpu::cpu_level(),
        "CPU target"
    );
    let mut running = tokio::select! {
        running = mesh_router::server::start_mesh(&config) => running?,
        signal = signals.recv() => {
            tracing::warn!(signal, "stop signal while starting; not serving");
            return Ok(());
        }
    };
    // The line that supervisors and tests read. A stdout whose reader is gone fails
    // the write (EPIPE); `println!` would panic and end a server that is serving.
    // The same addresses are in the log (stderr) line before it.
    if let Err(e) = writeln!(
        std::io::stdout(),
        "mesh serving: grpc={} http={}",
        running.grpc_addr,
        running.http_addr
    ) {
        tracing::warn!(error = %e, "the serving line could not be written to stdout; serving anyway");
    }
    let stop = running.stopper();
    tokio::spawn(async move {
        let signal = signals.recv().await;
        tracing::info!(signal, "shutdown signal received; draining");
        let _ = stop.send(true);
    });
    running.wait().await;
    running.shutdown().await;
    Ok(())
}
