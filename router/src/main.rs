//! The `mesh` binary: parses the command line and runs the command.
use clap::Parser;
use mesh_router::cli::{self, Cli, Command, FeaturesCommand, LogsCommand};

fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    match args.command {
        Command::Serve(serve) => {
            let config = serve.resolve()?;
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or(config.log.format));
            // Before any runtime thread exists, so setting the variable is race-free.
            cli::set_compute_threads(config.server.compute_threads);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(cli::serve(config))?;
        }
        Command::Demo(demo) => {
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or_default());
            cli::set_compute_threads(1);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(mesh_router::demo::run(demo))?;
        }
        Command::Features(FeaturesCommand::Demo(a)) => {
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or_default());
            cli::features_demo(a)?;
        }
        Command::Features(FeaturesCommand::Ingest(a)) => {
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or_default());
            cli::ingest(a)?;
        }
        Command::Bench(a) => {
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or_default());
            let json = a.json;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(mesh_router::bench::run(a))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
        }
        Command::Logs(LogsCommand::Join(a)) => {
            mesh_prediction_log::cli::run_join(&a, &mut std::io::stdout().lock())?;
        }
        Command::Logs(LogsCommand::Tail(a)) => {
            mesh_prediction_log::cli::run_tail(&a, &mut std::io::stdout().lock(), &|| false)?;
        }
        Command::BatchScore(a) => {
            mesh_router::telemetry::init_logs(args.log_format.unwrap_or_default());
            cli::set_compute_threads(1);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(mesh_router::batch_score::run(a))?;
        }
    }
    Ok(())
}
