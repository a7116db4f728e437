//! `wsctl run` and `wsctl plan`: load a job, plan it, and (for `run`) assemble MemoryX, SwarmX, the engines and
//! their input workers on this machine, train, evaluate and write the results.

use std::path::{Path, PathBuf};

use crate::affinity::{CpuList, Pinning};
use anyhow::{Context, Result};
use crds::contract::ProgressReport;
use errors::units;
use indicatif::{ProgressBar, ProgressStyle};
use plan::appliance::Plan;
use runtime::coordinator::driver::{Driver, Job, Outputs};
use runtime::coordinator::train::Summary;
use runtime::engine::role::EngineRole;
use runtime::input::{Feed, LocalFeed};
use runtime::swarmx::LocalSwarm;

/// Reads and validates a manifest, applying a `--cs2` override. A pretrained folder (`spec.model.from`) is
/// looked for inside the folders standing in for volumes (`--volume CLAIM=DIR`), where a cluster finds it,
/// and else as a path here.
fn load_job(path: &Path, cs2: Option<u32>, volumes: &[(String, PathBuf)]) -> Result<crds::TrainingJob> {
    let label = crate::manifest::label(path);
    let text = crate::manifest::read(path).with_context(|| format!("cannot read {label}"))?;
    let resolve = |from: &str| {
        let inside = volumes.iter().map(|(_, dir)| dir.join(from)).find(|p| !crds::escapes(from) && p.exists());
        match inside {
            Some(p) => runtime::memoryx::huggingface::resolve(&p.display().to_string()),
            None => runtime::memoryx::huggingface::resolve(from),
        }
    };
    let mut job = crds::parse_training_job_with(&text, &resolve).with_context(|| label.clone())?;
    if job.spec.model.kind == crds::ModelKind::Program {
        // Read (and refused, naming the operation and its line) before anything is planned or started.
        plan::program::for_spec(&job.spec.model).with_context(|| label.clone())?;
    }
    if let Some(n) = cs2 {
        job.spec.cs2 = n;
        job.spec.min_cs2 = job.spec.min_cs2.filter(|&m| m <= n);
        job.spec.validate().with_context(|| format!("{label} with --cs2 {n}"))?;
    }
    Ok(job)
}

/// `wsctl plan`.
pub fn plan(path: &Path, cs2: Option<u32>, json: bool) -> Result<()> {
    let job = load_job(path, cs2, &[])?;
    let plan = Plan::for_spec(&job.spec, crds::contract::DEFAULT_FAN_OUT)?;
    data::check_path(&job.spec)?;
    let simulated = sim_wse::cost::estimate(&job.spec);
    if json {
        let mut value = serde_json::to_value(&plan)?;
        value["simulated"] = serde_json::to_value(simulated)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("appliance for {}:", job.metadata.name.as_deref().unwrap_or("(unnamed)"));
    println!("  MemoryX     {} (weights, biases, optimizer state, mask indices)", units::bytes(plan.memoryx_bytes));
    let m = &plan.memoryx;
    println!(
        "              {} weight server(s), each {}: {} in memory, {} on disk (at least {} in memory)",
        m.servers,
        units::bytes(m.server_bytes),
        units::bytes(m.memory_bytes),
        units::bytes(m.disk_bytes),
        units::bytes(m.min_memory_bytes)
    );
    let streaming = plan.execution_mode != crds::ExecutionMode::Pipelined;
    let hub = if streaming && plan::memoryx::streams_from_servers(m.servers, plan.cs2) {
        "the SwarmX root, streaming straight from the servers,"
    } else {
        "the coordinator (server 0)"
    };
    println!(
        "              {hub} holds up to {} more in transit: {}",
        units::bytes(plan.coordinator_transit_bytes),
        match streaming {
            false => "a step's gradients from the engines' replicas",
            true => "a layer going out to the engines, the next behind it, a gradient going back to the servers",
        }
    );
    match plan.swarmx.depth() {
        0 => println!("  SwarmX      none: one engine, which MemoryX streams to directly"),
        depth => println!(
            "  SwarmX      {} node(s) in {} level(s), fan-out {}: broadcast to {} engine(s), sum on the way back",
            plan.swarmx.nodes().count(),
            depth,
            plan.swarmx.fan_out,
            plan.cs2
        ),
    }
    println!(
        "  input       {} worker(s), {} per CS-2: read, tokenize and shard {} for the engines{}",
        plan.input_workers,
        plan.input_workers_per_cs2,
        job.spec.data.path,
        job.spec.data.volume.as_ref().map(|v| format!(" (inside volume {v}, read-only)")).unwrap_or_default()
    );
    println!(
        "  engines     {} x {} samples/step; {} resident activations, peak {} of {} SRAM",
        plan.cs2,
        plan.shard,
        units::bytes(plan.activation_bytes),
        units::bytes(plan.peak_engine_bytes),
        units::bytes(plan.engine_sram_bytes)
    );
    println!(
        "  model       {} of weights as streamed{}",
        units::bytes(plan.weight_bytes),
        if plan.weight_bytes > plan.engine_sram_bytes {
            ", more than an engine's SRAM: only streaming can run it"
        } else {
            ""
        }
    );
    match &plan.weights_from {
        Some(from) if job.spec.model.sparsity > 0.0 => {
            println!(
                "  weights     pretrained, read unit by unit from {from}; each matrix pruned to its largest magnitudes"
            )
        }
        Some(from) => println!("  weights     pretrained, read unit by unit from {from}"),
        None => println!("  weights     drawn from seed {}", job.spec.training.seed),
    }
    println!("  execution   {:?}", plan.execution_mode);
    println!("  stream      unit                shape          dense        streamed");
    for (l, layer) in plan.layers.iter().enumerate() {
        println!(
            "              {:>2} {:<16} {:>5} x {:<5}  {:>11}  {:>11}",
            l,
            layer.name,
            layer.outputs,
            layer.inputs,
            units::bytes(layer.dense_bytes),
            units::bytes(layer.stream_bytes)
        );
    }
    println!(
        "  simulated   {:.1} µs per step on {} x {}, {:.0} samples/s ({:.0}% computing, {:.0}% streaming)",
        1e6 * simulated.step_s,
        simulated.engines,
        simulated.engine,
        simulated.samples_per_s,
        100.0 * simulated.compute_share,
        100.0 * simulated.streaming_share
    );
    println!(
        "  per step    {} moved ({:.1}% of the dense model's {})",
        units::bytes(plan.step_bytes),
        100.0 * plan.step_bytes as f64 / plan.dense_equivalent_step_bytes as f64,
        units::bytes(plan.dense_equivalent_step_bytes)
    );
    Ok(())
}

/// `wsctl model FOLDER`: the model spec a pretrained folder's config gives, as a job adopts it; for a folder
/// holding a captured program, the program's spec (refused, naming the operation and its line, when the
/// appliance cannot run it).
pub fn model(folder: &Path) -> Result<()> {
    let from = folder.display().to_string();
    if folder.join(plan::program::capture::PROGRAM_FILE).is_file() {
        let program = plan::program::load(folder)?;
        let model = crds::ModelSpec {
            kind: crds::ModelKind::Program,
            context_length: Some(program.context as u32),
            vocab_size: program.vocab as u32,
            from: Some(from),
            ..crds::ModelSpec::mlp(Vec::new(), crds::Activation::Relu, 0.0)
        };
        println!("{}", serde_json::to_string_pretty(&model)?);
        return Ok(());
    }
    let (shape, source) = runtime::memoryx::huggingface::resolve(&from)?
        .ok_or_else(|| anyhow::anyhow!("{from} does not exist: name a folder holding a Hugging Face config.json"))?;
    let mut model =
        crds::ModelSpec { kind: shape.kind, ..crds::ModelSpec::mlp(Vec::new(), crds::Activation::Relu, 0.0) };
    model.adopt(&shape, &source)?;
    println!("{}", serde_json::to_string_pretty(&model)?);
    Ok(())
}

/// How `wsctl run` assembles the appliance: its command line.
#[derive(clap::Args)]
pub struct RunOptions {
    /// Where to write metrics.jsonl and summary.json (default: runs/<job name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override the job's CS-2 count (spec.cs2).
    #[arg(long)]
    pub cs2: Option<u32>,
    /// Run every role in this process instead of as separate local processes.
    #[arg(long)]
    pub in_process: bool,
    /// Run the engines on these CPUs only (`0-3,6`) and every other role (MemoryX, SwarmX, input workers)
    /// on the rest, as on an appliance's own hosts; with --in-process, the whole process on these CPUs.
    #[arg(long, value_name = "LIST", value_parser = CpuList::parse)]
    pub engine_cpus: Option<CpuList>,
    /// Children per SwarmX node: engines are grouped under nodes of this fan-out, nodes under nodes (the
    /// operator's --swarmx-fan-out, the chart's operator.swarmxFanOut).
    #[arg(long, visible_alias = "fanout", default_value_t = crds::contract::DEFAULT_FAN_OUT)]
    pub swarmx_fan_out: u32,
    /// Where MemoryX keeps checkpoints and resumes from (default: OUT/checkpoints when the job sets
    /// spec.checkpoint.intervalSteps).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// After training a language model, decode and print this many lines of text from it.
    #[arg(long, default_value_t = 0)]
    pub sample: usize,
    /// A folder standing in for a PersistentVolumeClaim the job's data names (`spec.data.volume`), as
    /// CLAIM=DIR; repeatable.
    #[arg(long = "volume", value_name = "CLAIM=DIR", value_parser = parse_volume)]
    pub volumes: Vec<(String, PathBuf)>,
    /// Print one JSON object per line instead of the bar and the result line: `{"progress": …}` after each
    /// step, then `{"summary": …, "out": DIR}`.
    #[arg(long)]
    pub json: bool,
}

/// The folder standing in for the job's data volume, when it names one: `--volume CLAIM=DIR`. A job naming a
/// claim that was not given is refused when its data is loaded, with the flag to add.
fn data_root(spec: &crds::TrainingJobSpec, volumes: &[(String, PathBuf)]) -> Result<Option<PathBuf>> {
    let Some(claim) = &spec.data.volume else { return Ok(None) };
    match volumes.iter().find(|(c, _)| c == claim) {
        Some((_, dir)) => Ok(Some(
            std::fs::canonicalize(dir)
                .with_context(|| format!("--volume {claim}={}: the folder cannot be read", dir.display()))?,
        )),
        None => Ok(None),
    }
}

/// Parses `CLAIM=DIR`.
pub fn parse_volume(s: &str) -> std::result::Result<(String, PathBuf), String> {
    let (claim, dir) = s.split_once('=').ok_or_else(|| format!("'{s}' is not CLAIM=DIR"))?;
    if !crds::is_dns_subdomain(claim) {
        return Err(format!("'{claim}' is not a PersistentVolumeClaim name"));
    }
    Ok((claim.to_string(), PathBuf::from(dir)))
}

/// `wsctl run`.
pub fn run(path: &Path, opts: RunOptions) -> Result<()> {
    // Checked before anything starts; with --in-process, set before any thread is, so every thread inherits it.
    let pinning = match &opts.engine_cpus {
        Some(cpus) => Some(
            Pinning::split(cpus.clone(), &CpuList::allowed().map_err(anyhow::Error::msg)?)
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    if let (true, Some(p)) = (opts.in_process, &pinning) {
        p.engines.pin_this_thread().map_err(anyhow::Error::msg)?;
    }
    if opts.in_process {
        // The engines' activations are this process's working set, the same every step. Set before anything
        // else allocates, so every thread (the data loading's too) shares the arena it keeps.
        runtime::process::keep_allocator_warm();
    }
    let job = load_job(path, opts.cs2, &opts.volumes)?;
    let spec = &job.spec;
    let plan = Plan::for_spec(spec, opts.swarmx_fan_out)?;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let out = opts.out.clone().unwrap_or_else(|| Path::new("runs").join(&name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    // Data is loaded once, here, so a bad data set is reported before anything starts; the input workers load
    // it again in their own processes.
    let root = data_root(spec, &opts.volumes)?;
    let feed = std::sync::Arc::new(LocalFeed::load(spec, root.as_deref())?);
    // In this process the pretrained folder is read where it is (inside the volume's folder, when there is one);
    // processes place it themselves, from the data root they are given.
    let loaded = Job::new(spec.clone(), name.clone(), feed.describe()?)?.locate_pretrained(root.as_deref())?;
    let total = loaded.total_steps;
    let how = match plan.execution_mode {
        crds::ExecutionMode::Pipelined => "the model resident on the engines (pipelined)",
        _ => "weights streamed from MemoryX layer by layer",
    };
    eprintln!(
        "{name}: {} steps of {} samples on {} CS-2{}, {how}",
        total,
        plan.batch,
        plan.cs2,
        if opts.in_process { " in one process" } else { "" }
    );
    if let Some(p) = &pinning {
        match opts.in_process {
            true => eprintln!("{name}: on CPUs {} (--engine-cpus)", p.engines),
            false => {
                eprintln!("{name}: engines on CPUs {}, MemoryX, SwarmX and input workers on {}", p.engines, p.others)
            }
        }
    }
    if opts.json {
        let tokens = spec.model.kind.is_language_model().then_some(loaded.spec.model.context_length).flatten();
        let start = serde_json::json!({ "steps": total, "samplesPerStep": plan.batch, "cs2": plan.cs2, "tokensPerSample": tokens });
        println!("{}", serde_json::json!({ "start": start }));
    }
    let bar = if opts.json { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let checkpoints =
        opts.checkpoint_dir.clone().or_else(|| (spec.checkpoint.interval_steps > 0).then(|| out.join("checkpoints")));
    // Where the checkpoints went, for the summary line: `null` when the run kept none.
    let checkpoint_folder = checkpoints.clone();
    let json = opts.json;
    let show = |m: &ProgressReport| {
        if json {
            println!("{}", serde_json::json!({ "progress": m }));
        }
        bar.set_message(format!("loss {:.4}  {:.0} samples/s", m.loss, m.samples_per_s));
        bar.set_position(m.step);
    };
    // The weight servers' disk tiers are scratch of this run: under its output, removed when it ends however
    // the servers ended (a killed process cannot clean up after itself).
    let tier = out.join("tier");
    let result = if opts.in_process {
        let outputs = Outputs {
            checkpoint_dir: checkpoints,
            out: Some(out.clone()),
            tier_dir: Some(tier.clone()),
            sample: opts.sample,
            ..Outputs::default()
        };
        run_in_process(loaded, feed, &plan, outputs, show)
    } else {
        drop((loaded, feed));
        let local = LocalRun { data_root: root, checkpoint_dir: checkpoints, sample: opts.sample, pinning };
        run_local(&job, &plan, local, &out, show)
    };
    let _ = std::fs::remove_dir_all(&tier);
    bar.finish_and_clear();
    let s = result?;
    if opts.json {
        println!("{}", serde_json::json!({ "summary": s, "out": out, "checkpoints": checkpoint_folder }));
        return Ok(());
    }
    let held_out = match s.eval.perplexity {
        Some(ppl) => format!(
            "held-out loss {:.3} nats/token (perplexity {ppl:.2}; unigram baseline {:.3}) on {} tokens, {:.0} tokens/s",
            s.eval.loss,
            s.eval.unigram_loss.unwrap_or(f64::NAN),
            s.eval.samples,
            s.tokens_per_s
        ),
        None => format!("held-out accuracy {:.2}% on {} samples", 100.0 * s.eval.accuracy, s.eval.samples),
    };
    println!(
        "{name}: {} steps in {:.1}s ({:.0} samples/s), final loss {:.4}, {held_out}; \
         streamed {} ({:.1}% of dense), engines busy {:.0}% -> {}",
        s.steps,
        s.wall_s,
        s.samples_per_s,
        s.final_loss,
        units::bytes(s.bytes_streamed),
        100.0 * s.bytes_streamed as f64 / (s.dense_equivalent_bytes as f64).max(1.0),
        100.0 * s.wse_utilization,
        out.join("summary.json").display()
    );
    for line in &s.samples {
        println!("  > {line}");
    }
    Ok(())
}

/// What a run as processes is given besides the job and its plan.
struct LocalRun {
    /// The folder standing in for the job's data volume.
    data_root: Option<PathBuf>,
    /// Where MemoryX keeps checkpoints.
    checkpoint_dir: Option<PathBuf>,
    /// Lines of text to decode from a trained language model.
    sample: usize,
    /// The engines' CPUs and the other roles' (`--engine-cpus`).
    pinning: Option<Pinning>,
}

/// The appliance as processes: input workers, engines, the SwarmX tree, MemoryX's weight servers and its
/// coordinator, supervised until the coordinator finishes.
fn run_local(
    job: &crds::TrainingJob,
    plan: &Plan,
    run: LocalRun,
    out: &Path,
    show: impl FnMut(&ProgressReport),
) -> Result<Summary> {
    // The children read the job as this run sees it (with --cs2 applied), from the run's own folder.
    let job_file = std::fs::canonicalize(out)?.join("job.yaml");
    std::fs::write(&job_file, serde_yaml::to_string(job)?)
        .with_context(|| format!("cannot write {}", job_file.display()))?;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let job_id = format!("{name}-{}", std::process::id());
    let mut appliance = crate::local::Appliance::new(job_file, job_id, out.join("logs"))?;
    appliance.pinning = run.pinning;
    let outputs = crate::local::MemoryxOutputs {
        out: Some(out.to_path_buf()),
        sample: run.sample,
        checkpoint_dir: run.checkpoint_dir,
        tier_dir: Some(std::fs::canonicalize(out)?.join("tier")),
    };
    let args = appliance.start(plan, run.data_root, &outputs)?;
    appliance.run_memoryx(&args, std::time::Duration::from_secs(plan.stop_seconds()), show)?;
    drop(appliance);
    let path = out.join("summary.json");
    let text = std::fs::read_to_string(&path).context("MemoryX finished without a summary.json")?;
    serde_json::from_str(&text).with_context(|| format!("cannot read {}", path.display()))
}

/// The appliance in this process: the same roles and the same driver as MemoryX's program, with the engines
/// as objects and SwarmX as calls — for benchmarks and debugging.
fn run_in_process(
    job: Job,
    feed: std::sync::Arc<LocalFeed>,
    plan: &Plan,
    outputs: Outputs,
    mut show: impl FnMut(&ProgressReport),
) -> Result<Summary> {
    let spec = &job.spec;
    let layout = job.layout();
    let engines: Vec<Box<dyn EngineRole>> = (0..spec.cs2)
        .map(|i| Box::new(sim_wse::engine(format!("engine-{i}"), layout.clone(), &spec.engine)) as Box<dyn EngineRole>)
        .collect();
    let mut swarm = LocalSwarm::new(engines, feed)?;
    if plan.execution_mode == crds::ExecutionMode::Pipelined {
        swarm = swarm.with_replicas(job.id.clone(), job.replica_factory());
    }
    let mut driver = Driver::new(job, outputs);
    // Ctrl-C stops at the next step boundary with the step checkpointed, as the processes' MemoryX does; a
    // second one stops at once.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(crds::contract::exit::STOPPED_STATUS);
        }
        eprintln!("interrupted: checkpointing the step in flight (Ctrl-C again to stop at once)");
    });
    driver.stop_on(stop);
    Ok(driver.run(&mut swarm, &mut show)?)
}
