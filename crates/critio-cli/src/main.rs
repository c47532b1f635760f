//! The `critio` command: the demo, the experiments, and the server.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: a heap per thread, freed into from other threads without a
/// lock. Under glibc's malloc a server's GET waited (perf: futex waits in
/// `__libc_calloc` and `_int_free`) for an arena lock that a background
/// thread at a lower CPU priority (BGSAVE, the cleaner) held while
/// preempted: an inversion no critio mechanism sees, since the allocator's
/// locks are not critio's.
///
/// Built with its `no_thp` feature: mimalloc otherwise asks for
/// transparent huge pages (`MADV_HUGEPAGE`) on all its memory, and a
/// buffer's first touch then faults in and zeroes 2 MiB at once. On a
/// virtual machine whose host backs guest memory lazily that took 4-8 ms
/// of system time in one fault (critio-kv under BGSAVE and BGREWRITEAOF,
/// vda: a snapshot's 1 MiB scan chunk, freshly allocated, faulting while
/// its thread held a cache part, and GETs waiting for that part up to
/// 27 ms). With 4 KiB pages a fresh page costs one small fault. The
/// cache's frames, which live as long as the cache and are backed ahead
/// of use, still ask for huge pages themselves (`cache::prefault`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod demo;
mod dump;
mod kvbench;
mod plot;
mod results;
mod run;
mod serve;
mod workload;

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
    Demo {
        /// The 15-second version.
        #[arg(long)]
        quick: bool,
        /// A workload file instead of workloads/demo.toml.
        #[arg(long, value_name = "FILE")]
        workload: Option<PathBuf>,
        /// Where to write the JSON and the CCDF plot.
        #[arg(long, value_name = "DIR", default_value = "critio-demo")]
        out: PathBuf,
        /// The device: by default a file in DIR through io_uring with
        /// O_DIRECT (falling back to pool:, then to the simulated SSD, with
        /// the reason printed); `sim` for the reproducible simulation, or
        /// file:PATH, pool:PATH, sim:hdd.
        #[arg(long, value_name = "SPEC")]
        device: Option<String>,
    },
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
        /// A workload file instead of the experiment's built-in one.
        #[arg(long, value_name = "FILE")]
        workload: Option<PathBuf>,
        /// kv-vs-redis, run-redis: run the servers (and fio) on these CPUs
        /// (a list: 1, 0-3, 0,2); default: where the kernel puts them.
        #[arg(long, value_name = "CPUS")]
        server_cpus: Option<String>,
        /// kv-vs-redis, run-redis: run redis-benchmark on these CPUs.
        #[arg(long, value_name = "CPUS")]
        client_cpus: Option<String>,
        /// With `all`: write every experiment's results to this Markdown file.
        #[arg(long, value_name = "PATH")]
        results: Option<PathBuf>,
        /// List the experiments.
        #[arg(long)]
        list: bool,
    },
    /// Serve the Redis-protocol key-value store (stop with SIGINT, SIGTERM
    /// or a client's SHUTDOWN).
    Serve(serve::ServeArgs),
    /// Write the last BGSAVE of a store as Redis commands, its server
    /// running or stopped (`critio dump --data DIR --device file |
    /// redis-cli --pipe`).
    Dump(dump::DumpArgs),
    /// Run an unmodified program with request-centric I/O priority:
    /// foreground threads by rule, background writes paced.
    Run(run::RunArgs),
}

/// The experiments that run servers and a load generator as processes.
const PLACED: [&str; 2] = ["kv-vs-redis", "run-redis"];

fn bench(
    experiment: Option<String>,
    args: bench::BenchArgs,
    results: Option<PathBuf>,
    list: bool,
) -> Result<(), String> {
    let Some(name) = experiment.filter(|_| !list) else {
        for e in bench::EXPERIMENTS {
            println!("{:<24} {}", e.name, e.about);
        }
        return Ok(());
    };
    if args.placement.is_set() && !PLACED.contains(&name.as_str()) {
        return Err(format!(
            "--server-cpus and --client-cpus place the servers of {}; {name} runs none",
            PLACED.join(" and ")
        ));
    }
    if name == "all" {
        let path = results.unwrap_or_else(|| PathBuf::from("docs/RESULTS.md"));
        results::write(&path, args.quick, args.device.clone())?;
        println!("wrote {}", path.display());
        return Ok(());
    }
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
        Command::Run(args) => {
            return run::run(args).unwrap_or_else(|msg| {
                eprintln!("critio run: {msg}");
                ExitCode::FAILURE
            })
        }
        Command::Demo {
            quick,
            workload,
            out,
            device,
        } => demo::run(&demo::DemoArgs {
            quick,
            workload,
            out,
            device,
        }),
        Command::Bench {
            experiment,
            json,
            quick,
            device,
            workload,
            server_cpus,
            client_cpus,
            results,
            list,
        } => bench::placement::Placement::parse(server_cpus.as_deref(), client_cpus.as_deref())
            .and_then(|placement| {
                bench(
                    experiment,
                    bench::BenchArgs {
                        quick,
                        json,
                        device,
                        workload,
                        placement,
                    },
                    results,
                    list,
                )
            }),
        Command::Serve(args) => serve::run(args),
        Command::Dump(args) => dump::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("critio: {msg}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// The program's heap asks for no huge pages (mimalloc's `no_thp`): a
    /// large buffer's mapping has no `hg` flag.
    #[test]
    fn the_heap_asks_for_no_huge_pages() {
        let buffers: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 16 << 20]).collect();
        for b in &buffers {
            let flags = critio::sys::mapping_flags(b.as_ptr() as usize)
                .unwrap()
                .expect("mapped");
            assert!(
                !flags.iter().any(|f| f == "hg"),
                "a buffer's flags: {flags:?}"
            );
        }
    }
}
