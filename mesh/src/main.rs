//! The `mesh` binary: parse the command line, set up logs and the compute threads,
//! build the one tokio runtime, run the command.
use clap::Parser;
use mesh::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    // Logs and the compute-thread setting come before any other thread exists.
    let prepared = args.command.prepare(args.log_format)?;
    match args.command {
        // Offline commands that do no async work run on this thread.
        Command::Logs(c) => mesh::logs::run(c),
        Command::Features(c) => mesh::cli::features(c),
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(mesh::cli::run(command, prepared)),
    }
}
