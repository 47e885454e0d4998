//! The `mesh` binary: parse the command line, set up logs and the compute threads,
//! build the one tokio runtime, run the command.
//!
//! A command that fails prints its error and the chain of causes on one line and
//! exits 1, without a backtrace (even with `RUST_BACKTRACE` set: a user error is not
//! a bug). A command whose standard output was closed by its reader stops and exits 0
//! ([`mod@mesh::out`]). Panics keep Rust's own report and backtrace.
use std::process::ExitCode;

use clap::Parser;
use mesh::cli::{Cli, Command};

/// mimalloc instead of glibc's malloc: the serving path and sled allocate many small,
/// short-lived blocks from several threads, where glibc's arenas cost the most
/// (`feature-store/benches/lookup.rs`: ingest 140k -> 200k rows/s, 1-key lookups
/// 1.6x the lookups/s; see README "Allocator").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The most the exit waits for blocking work that nothing awaits any more.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn run() -> anyhow::Result<()> {
    let args = Cli::parse();
    // Logs and the compute-thread setting come before any other thread exists.
    let prepared = args.command.prepare(args.log_format)?;
    // Before the runtime's threads and the stores allocate.
    let huge_pages = args.transparent_huge_pages;
    if let Err(e) = mesh::cli::set_transparent_huge_pages(huge_pages) {
        tracing::warn!(
            error = %e,
            "could not set transparent huge pages for this process; the kernel's setting applies"
        );
    }
    match args.command {
        // Offline commands that do no async work run on this thread.
        Command::Logs(c) => mesh::logs::run(c),
        Command::Features(c) => mesh::cli::features(c),
        command => {
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if let Command::Bench(b) = &command {
                // The load generator's threads (`--threads`), checked first: a
                // runtime of 0 workers cannot be built.
                b.check()?;
                if b.threads == 1 {
                    // One thread (the default): the runtime of that thread alone. A
                    // task woken there runs after those already queued instead of
                    // next (a multi-thread runtime's LIFO slot), so the answers of
                    // one read are handled before the connection writes again: a
                    // closed loop of 8 callers on one connection (feature lookups) went
                    // from 1.0 writes a call to 0.4-0.5.
                    runtime = tokio::runtime::Builder::new_current_thread();
                } else {
                    runtime.worker_threads(b.threads);
                }
            }
            // `mesh serve`: `[server] worker_threads` (0: tokio's one per core).
            if let Some(n) = prepared.config.as_ref().map(|c| c.server.worker_threads) {
                if n > 0 {
                    runtime.worker_threads(n);
                }
            }
            // A worker with nothing to do takes a short turn at the prediction log's
            // Parquet work first (`[prediction_log] worker_turns`; nothing without it).
            runtime.on_thread_park(mesh_prediction_log::worker_turn);
            let runtime = runtime.enable_all().build()?;
            if prepared.config.is_some() {
                tracing::info!(
                    worker_threads = runtime.metrics().num_workers(),
                    transparent_huge_pages = huge_pages,
                    "serving runtime"
                );
            }
            let result = runtime.block_on(mesh::cli::run(command, prepared));
            // Every command awaits its own work, so blocking work still running here
            // is a start that a stop signal ended (a Redis connect, a sled open, a model
            // read): the exit waits for it this long, not for as long as it takes.
            runtime.shutdown_timeout(EXIT_WAIT);
            result
        }
    }
}

fn main() -> ExitCode {
    // Before any code that the build may have compiled with AVX2 and friends runs.
    if let Err(msg) = mesh::cpu::check() {
        eprintln!("error: {msg}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of what the command printed went away (`| head`): nothing failed.
        Err(e) if mesh::out::closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause once (many errors already
/// repeat their source's text in their own message).
fn chain(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line = format!("{line}: {c}");
        }
    }
    line
}
