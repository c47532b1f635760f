//! The `critio` command: the demo, the experiments, and the server.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod demo;

/// critio: request-centric I/O prioritization.
#[derive(Parser)]
#[command(name = "critio", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show request latency with and without request-centric prioritization.
    Demo,
    /// Run an experiment and print its table and targets.
    Bench {
        /// The experiment to run (see --list).
        experiment: Option<String>,
        /// Also write the figures as JSON to this file.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// A shorter, noisier run.
        #[arg(long)]
        quick: bool,
        /// The device: sim, sim:hdd, sim:ssd, file:PATH (io_uring, O_DIRECT).
        #[arg(long, value_name = "SPEC")]
        device: Option<String>,
        /// List the experiments.
        #[arg(long)]
        list: bool,
    },
    /// Serve the Redis-protocol key-value store.
    Serve,
}

fn bench(experiment: Option<String>, args: bench::BenchArgs, list: bool) -> Result<(), String> {
    let Some(name) = experiment.filter(|_| !list) else {
        for e in bench::EXPERIMENTS {
            println!("{:<24} {}", e.name, e.about);
        }
        return Ok(());
    };
    let experiment = bench::find(&name)?;
    let report = (experiment.run)(&args)?;
    print!("{}", report.render());
    if let Some(path) = &args.json {
        report
            .write_json(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("json: {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => demo::run(),
        Command::Bench {
            experiment,
            json,
            quick,
            device,
            list,
        } => bench(
            experiment,
            bench::BenchArgs {
                quick,
                json,
                device,
            },
            list,
        ),
        Command::Serve => Err(format!(
            "the key-value server (critio-kv {}) arrives with issue 5",
            critio_kv::VERSION
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("critio: {msg}");
            ExitCode::FAILURE
        }
    }
}
