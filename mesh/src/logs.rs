//! `mesh logs join`, `mesh logs tail` and `mesh logs convert`: the command line of the prediction log's
//! [`mesh_prediction_log::commands`].
use std::path::PathBuf;

use clap::{Args, Subcommand};
use mesh_prediction_log::{commands, Protocol};

#[derive(Debug, Subcommand)]
pub enum LogsCommand {
    /// Per model version, role and protocol: AUC, precision/recall, Brier, fallbacks, stage latencies.
    Join(JoinArgs),
    /// Show the newest records as they are written.
    Tail(TailArgs),
    /// Build the Parquet files of closed segments a `parquet = "deferred"` log left as wal files.
    Convert(ConvertArgs),
}

/// `mesh logs convert`: converts the closed segments waiting in `<logs>/_wal/closed/`
/// into Parquet files (oldest first), beside the serving writer and other converters.
#[derive(Debug, Clone, Args)]
pub struct ConvertArgs {
    /// Prediction log directory (the writer's `dir`; a copy or a shared mount of it works).
    #[arg(long)]
    pub logs: PathBuf,
    /// Keep converting closed segments as they appear, until Ctrl-C or SIGTERM (which
    /// let the segment in progress finish).
    #[arg(long)]
    pub watch: bool,
    /// How often to look for new closed segments with --watch, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Run under SCHED_IDLE (Linux): only CPU time no other thread wants, in spells of
    /// at most 50 µs with a 50 µs nap between them, for a converter on the serving
    /// machine.
    #[arg(long)]
    pub idle: bool,
    /// One JSON object per converted segment.
    #[arg(long)]
    pub json: bool,
}

/// `mesh logs join`: per model version, role and protocol, how the predictions did against
/// labels.
#[derive(Debug, Clone, Args)]
pub struct JoinArgs {
    /// Prediction log directory (the writer's `dir`).
    #[arg(long)]
    pub logs: PathBuf,
    /// Labels file: CSV with a header row, or Parquet (by the `.parquet` extension).
    #[arg(long)]
    pub labels: PathBuf,
    /// Join key: `request_id`, or an entity key name; the labels file has a column of that name.
    #[arg(long, default_value = "request_id")]
    pub key: String,
    /// Label column: 1/0, true/false, yes/no.
    #[arg(long, default_value = "label")]
    pub label: String,
    /// Also report precision/recall when flagging `score >= T` (repeatable).
    #[arg(long = "threshold", value_name = "T")]
    pub thresholds: Vec<f64>,
    /// Include records of the open segment (wal files), not only closed Parquet segments.
    #[arg(long)]
    pub include_wal: bool,
    /// Keep only one protocol: decide (Decide/DecideBatch), oip_grpc, oip_http, or unknown
    /// (records written before the log recorded the protocol). Default: all, each
    /// protocol its own group.
    #[arg(long, value_name = "PROTOCOL", value_parser = parse_protocol)]
    pub protocol: Option<Protocol>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn parse_protocol(s: &str) -> Result<Protocol, String> {
    s.parse()
}

/// `mesh logs tail`: the newest records, then new ones as they are written.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// Prediction log directory (the writer's `dir`).
    #[arg(long)]
    pub logs: PathBuf,
    /// How many existing records to show first.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub lines: usize,
    /// Print the existing records and exit instead of following.
    #[arg(long)]
    pub no_follow: bool,
    /// Poll interval in milliseconds while following.
    #[arg(long, default_value_t = 250)]
    pub interval_ms: u64,
    /// One JSON object per line instead of a summary line.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `mesh logs` command, writing to stdout (a reader that went away ends it:
/// [`mod@crate::out`]).
pub fn run(command: LogsCommand) -> anyhow::Result<()> {
    let mut out = crate::out::Tracked::new(std::io::stdout().lock());
    let result = run_on(command, &mut out);
    out.finish(result)
}

fn run_on(command: LogsCommand, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match command {
        LogsCommand::Join(a) => commands::run_join(
            &commands::JoinArgs {
                logs: a.logs,
                labels: a.labels,
                key: a.key,
                label: a.label,
                thresholds: a.thresholds,
                include_wal: a.include_wal,
                protocol: a.protocol,
                json: a.json,
            },
            out,
        )?,
        // Ctrl-C ends the process while following.
        LogsCommand::Tail(a) => commands::run_tail(
            &commands::TailArgs {
                logs: a.logs,
                lines: a.lines,
                no_follow: a.no_follow,
                interval_ms: a.interval_ms,
                json: a.json,
            },
            out,
            &|| false,
        )?,
        LogsCommand::Convert(a) => {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            if a.watch {
                stop_on_signal(stop.clone())?;
            }
            commands::run_convert(
                &commands::ConvertArgs {
                    logs: a.logs,
                    watch: a.watch,
                    interval_ms: a.interval_ms,
                    idle: a.idle,
                    json: a.json,
                },
                out,
                &|| stop.load(std::sync::atomic::Ordering::Relaxed),
            )?
        }
    }
    Ok(())
}

/// Sets `stop` on Ctrl-C or SIGTERM, from a thread of its own; both are listened
/// for before this returns (see `signals`).
fn stop_on_signal(stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let mut signals = rt.block_on(async { crate::signals::StopSignals::listen() })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(signals.recv());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })?;
    Ok(())
}
