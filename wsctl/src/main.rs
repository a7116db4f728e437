//! `wsctl`: the user's front door to weightstream. `run` trains a job on local processes, `plan` shows the
//! appliance a job would get without running it, `bench` measures the kernels.

mod bench;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Weight-streaming training on a simulated wafer-scale appliance.
#[derive(Parser)]
#[command(name = "wsctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a TrainingJob on this machine and evaluate it on the held-out data.
    Run {
        /// The TrainingJob manifest (YAML).
        job: PathBuf,
        /// Where to write metrics.jsonl and summary.json (default: runs/<job name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override the job's CS-2 count (spec.cs2).
        #[arg(long)]
        cs2: Option<u32>,
    },
    /// Show the appliance a job would be assembled into, without running anything.
    Plan {
        /// The TrainingJob manifest (YAML).
        job: PathBuf,
        /// Override the job's CS-2 count (spec.cs2).
        #[arg(long)]
        cs2: Option<u32>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure kernels.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { job, out, cs2 } => run::run(&job, out, cs2),
        Command::Plan { job, cs2, json } => run::plan(&job, cs2, json),
        Command::Bench { what } => bench::bench(what),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
