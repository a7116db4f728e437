//! `wsctl`: the user's front door to weightstream. `run` trains a job on local processes, `plan` shows the
//! appliance a job would get without running it, `bench` measures the kernels, the machine and the transport,
//! `simulate` reproduces the seeds' sparsity and scaling figures with the wafer's cost model; `checkpoint`
//! fetches a job's checkpoints from MemoryX and `export` converts one for other tools (Hugging Face); `submit`,
//! `get`, `logs`, `cancel`, `suspend`, `resume` and `checkpoint JOB` manage jobs on a cluster (see [`cluster`]).

mod affinity;
mod bench;
mod checkpoint;
mod cluster;
mod dashboard;
mod export;
mod failure;
mod generate;
mod local;
mod manifest;
#[cfg(test)]
mod reference;
mod run;
mod simulate;
mod tensorboard;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Weight-streaming training on a simulated wafer-scale appliance.
#[derive(Parser)]
#[command(name = "wsctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How a failure is written on standard error: `text` (`error: MESSAGE`) or `json` (one line,
    /// `{"kind": …, "message": …}`, for programs that drive wsctl).
    #[arg(long, global = true, value_enum, default_value = "text")]
    error_format: failure::ErrorFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Train a TrainingJob on this machine and evaluate it on the held-out data.
    Run {
        /// The TrainingJob manifest (YAML; `-` reads it from standard input).
        job: PathBuf,
        /// How to run it.
        #[command(flatten)]
        opts: run::RunOptions,
    },
    /// Run one role of the appliance (what `wsctl run` starts for each component): `wsctl node ROLE ARGS…`
    /// takes exactly the arguments of the role's program (`memoryx`, `swarmx`, `sim-wse`).
    #[command(hide = true)]
    Node {
        /// The CPUs the role runs on (`wsctl run --engine-cpus`), set before it starts any thread.
        #[arg(long, value_name = "LIST", value_parser = affinity::CpuList::parse)]
        cpus: Option<affinity::CpuList>,
        /// memoryx, swarmx or engine.
        role: String,
        /// The role program's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Show the appliance a job would be assembled into, without running anything.
    Plan {
        /// The TrainingJob manifest (YAML; `-` reads it from standard input).
        job: PathBuf,
        /// Override the job's CS-2 count (spec.cs2).
        #[arg(long)]
        cs2: Option<u32>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Reproduce the seeds' figures with the wafer's cost model: sparsity to acceleration, speed-up against
    /// engine count, and MemoryX's egress against the engines' demand with and without a funnel through its
    /// coordinator; prints three tables and writes sparsity.svg, scaling.svg and funnel.svg.
    Simulate {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// Where to write the SVG plots.
        #[arg(long, default_value = "runs/simulate")]
        out: PathBuf,
        /// The engine generation to simulate.
        #[arg(long, value_enum, default_value = "wse2")]
        preset: Preset,
    },
    /// Measure kernels, the machine's ceilings and the transport (see bench/README.md).
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
    /// Convert a checkpoint file for other tools: a GPT to a Hugging Face GPT2LMHeadModel folder, a Llama to
    /// LlamaForCausalLM, any model to plainly named safetensors.
    Export {
        /// The checkpoint (step-XXXXXXXX.safetensors: pulled, or from a local run's OUT/checkpoints).
        checkpoint: PathBuf,
        /// huggingface (a GPT or Llama: config.json + model.safetensors) or safetensors (layers.{i}.weight/bias).
        #[arg(long, value_enum)]
        format: export::Format,
        /// The folder to write into (created).
        #[arg(short, long)]
        out: PathBuf,
        /// The job's manifest, for a checkpoint written before checkpoints recorded their model.
        #[arg(long)]
        job: Option<PathBuf>,
        /// The job's tokenizer.json (spec.data.tokenizer), written beside the model so `transformers` loads both.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// Continue a prompt with a language model: a checkpoint a job wrote, or a Hugging Face Llama folder.
    Generate {
        /// The checkpoint (step-XXXXXXXX.safetensors) or the model folder (config.json + model.safetensors).
        model: PathBuf,
        /// The text to continue.
        #[arg(long)]
        prompt: String,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 40)]
        tokens: usize,
        /// Sample at this softmax temperature (e.g. 0.8) instead of taking the most likely token.
        #[arg(long)]
        temperature: Option<f64>,
        /// Seed of the samples.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The tokenizer.json (default: the model folder's, or the one of the folder the job started from).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// The job's manifest, for a checkpoint written before checkpoints recorded their model.
        #[arg(long)]
        job: Option<PathBuf>,
    },
    /// Print, as JSON, the `spec.model` a Hugging Face model folder's config.json gives (a GPT-2 or a Llama),
    /// without reading its weights: the shape a job adopts from `spec.model.from`.
    Model {
        /// The folder holding config.json.
        folder: PathBuf,
    },
    /// The cluster commands, and `checkpoint` (of a cluster job, or of any MemoryX by URL).
    #[command(flatten)]
    Cluster(cluster::Command),
}

/// Engine generations `wsctl simulate` can model (the CRD's enum has no clap derive).
#[derive(Clone, Copy, clap::ValueEnum)]
enum Preset {
    /// WSE-2, the CS-2's engine.
    Wse2,
    /// WSE-3.
    Wse3,
    /// The scaled-down test engine.
    Tiny,
}

impl From<Preset> for crds::EnginePreset {
    fn from(p: Preset) -> Self {
        match p {
            Preset::Wse2 => crds::EnginePreset::Wse2,
            Preset::Wse3 => crds::EnginePreset::Wse3,
            Preset::Tiny => crds::EnginePreset::Tiny,
        }
    }
}

/// Large buffers in huge pages, for every role this binary runs (`wsctl node …`, `wsctl run --in-process`):
/// see [`runtime::process::HugePages`].
#[global_allocator]
static ALLOCATOR: runtime::process::HugePages = runtime::process::HugePages;

/// Lets a report command end as `cat` would when its reader goes away (`wsctl plan job.yaml | head`), instead
/// of panicking on the next line it prints. Only for commands that print and open no sockets: the roles keep
/// Rust's default (a closed connection is an error to handle, never a signal that ends the process).
fn end_quietly_when_stdout_closes() {
    // SAFETY: restoring a signal's default disposition touches no memory; it runs before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { job, opts } => run::run(&job, opts),
        Command::Node { cpus, role, args } => local::node(&role, args, cpus.as_ref()),
        Command::Plan { job, cs2, json } => {
            end_quietly_when_stdout_closes();
            run::plan(&job, cs2, json)
        }
        Command::Simulate { json, out, preset } => {
            end_quietly_when_stdout_closes();
            simulate::simulate(preset.into(), json, out)
        }
        Command::Bench { what } => bench::bench(what),
        Command::Export { checkpoint, format, out, job, tokenizer } => {
            export::command(&checkpoint, format, &out, job.as_deref(), tokenizer.as_deref())
        }
        Command::Generate { model, prompt, tokens, temperature, seed, tokenizer, job } => {
            generate::command(&model, &generate::Options { prompt, tokens, temperature, seed, tokenizer, job })
        }
        Command::Model { folder } => {
            end_quietly_when_stdout_closes();
            run::model(&folder)
        }
        Command::Cluster(c) => cluster::run(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", failure::render(&e, cli.error_format));
            ExitCode::FAILURE
        }
    }
}
