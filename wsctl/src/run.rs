//! `wsctl run` and `wsctl plan`: load a job, plan it, and (for `run`) assemble MemoryX, SwarmX and the
//! engines in this process, train, evaluate and write the results.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::engine::EngineRole;
use runtime::memoryx::MemoryX;
use runtime::model::ModelLayout;
use runtime::plan::Plan;
use runtime::swarmx::LocalSwarm;
use runtime::units;

/// Reads and validates a manifest, applying a `--cs2` override.
fn load_job(path: &Path, cs2: Option<u32>) -> Result<crds::TrainingJob> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut job = crds::parse_training_job(&text).with_context(|| path.display().to_string())?;
    if let Some(n) = cs2 {
        job.spec.cs2 = n;
        job.spec.validate().with_context(|| format!("{} with --cs2 {n}", path.display()))?;
    }
    Ok(job)
}

fn plan_of(spec: &crds::TrainingJobSpec) -> Result<Plan> {
    Ok(Plan::new(spec, sim_wse::preset::sram_bytes(&spec.engine))?)
}

/// `wsctl plan`.
pub fn plan(path: &Path, cs2: Option<u32>, json: bool) -> Result<()> {
    let job = load_job(path, cs2)?;
    let plan = plan_of(&job.spec)?;
    let simulated = sim_wse::cost::estimate(&job.spec);
    if json {
        let mut value = serde_json::to_value(&plan)?;
        value["simulated"] = serde_json::to_value(&simulated)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("appliance for {}:", job.metadata.name.as_deref().unwrap_or("(unnamed)"));
    println!("  MemoryX     {} (weights, biases, optimizer state, mask indices)", units::bytes(plan.memoryx_bytes));
    println!("  SwarmX      broadcast to {} engine(s), sum on the way back", plan.cs2);
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
        if plan.weight_bytes > plan.engine_sram_bytes { ", more than an engine's SRAM: only streaming can run it" } else { "" }
    );
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

/// Writes `value` as pretty JSON to `path` through a temporary file, so a reader never sees half a file.
fn write_json_atomic(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(&tmp, text + "\n").with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// How `wsctl run` assembles the appliance.
pub struct RunOptions {
    /// Override of spec.cs2.
    pub cs2: Option<u32>,
    /// Where results go (default: runs/<job name>).
    pub out: Option<PathBuf>,
    /// Run MemoryX, SwarmX and the engines as threads of this process instead of separate processes.
    pub in_process: bool,
    /// Lines of text to decode from a trained language model.
    pub sample: usize,
    /// Children per SwarmX node.
    pub fanout: usize,
    /// Where MemoryX keeps checkpoints (default: OUT/checkpoints when spec.checkpoint.intervalSteps > 0).
    pub checkpoint_dir: Option<PathBuf>,
}

/// `wsctl run`.
pub fn run(path: &Path, opts: RunOptions) -> Result<()> {
    let job = load_job(path, opts.cs2)?;
    let spec = &job.spec;
    let plan = plan_of(spec)?;
    let (train, test) = runtime::data::load(spec)?;
    let total = runtime::train::total_steps(&spec.training, train.len())?;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let out = opts.out.clone().unwrap_or_else(|| Path::new("runs").join(&name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let how = match plan.execution_mode {
        // Engines in this process read MemoryX's memory directly: there is nothing to keep resident.
        crds::ExecutionMode::Pipelined if !opts.in_process => "the model resident on the engines (pipelined)",
        _ => "weights streamed from MemoryX layer by layer",
    };
    eprintln!(
        "{name}: {} steps of {} samples on {} CS-2{}, {how}",
        total,
        spec.training.batch_size,
        spec.cs2,
        if opts.in_process { " in one process" } else { "" }
    );
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let result = if opts.in_process {
        run_in_process(&job, total, train, test, opts.sample, &out, &bar)
    } else {
        run_local(&job, &opts, &out, &bar)
    };
    bar.finish_and_clear();
    let summary = result?;
    let get = |k: &str| summary.pointer(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let held_out = match summary.pointer("/eval/perplexity").and_then(|v| v.as_f64()) {
        Some(ppl) => format!(
            "held-out loss {:.3} nats/token (perplexity {ppl:.2}; unigram baseline {:.3}) on {} tokens, {:.0} tokens/s",
            get("/eval/loss"),
            get("/eval/unigram_loss"),
            get("/eval/samples"),
            get("/tokens_per_s")
        ),
        None => format!("held-out accuracy {:.2}% on {} samples", 100.0 * get("/eval/accuracy"), get("/eval/samples")),
    };
    println!(
        "{name}: {} steps in {:.1}s ({:.0} samples/s), final loss {:.4}, {held_out}; \
         streamed {} ({:.1}% of dense), engines busy {:.0}% -> {}",
        get("/steps"),
        get("/wall_s"),
        get("/samples_per_s"),
        get("/final_loss"),
        units::bytes(get("/bytes_streamed") as u64),
        100.0 * get("/bytes_streamed") / get("/dense_equivalent_bytes").max(1.0),
        100.0 * get("/wse_utilization"),
        out.join("summary.json").display()
    );
    for line in summary.pointer("/samples").and_then(|v| v.as_array()).into_iter().flatten() {
        println!("  > {}", line.as_str().unwrap_or_default());
    }
    Ok(())
}

/// The appliance as processes: engines, the SwarmX tree and MemoryX, supervised until MemoryX finishes.
fn run_local(job: &crds::TrainingJob, opts: &RunOptions, out: &Path, bar: &ProgressBar) -> Result<serde_json::Value> {
    // The children read the job as this run sees it (with --cs2 applied), from the run's own folder.
    let job_file = std::fs::canonicalize(out)?.join("job.yaml");
    std::fs::write(&job_file, serde_yaml::to_string(job)?).with_context(|| format!("cannot write {}", job_file.display()))?;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let job_id = format!("{name}-{}", std::process::id());
    let mut appliance = crate::local::Appliance::new(job_file, job_id, out.join("logs"))?;
    let root = appliance.start_fabric(job.spec.cs2, opts.fanout)?;
    let mut args = vec!["--swarmx".to_string(), root, "--out".into(), out.display().to_string(), "--progress".into()];
    if opts.sample > 0 {
        args.extend(["--sample".to_string(), opts.sample.to_string()]);
    }
    let checkpoints = opts.checkpoint_dir.clone().or_else(|| (job.spec.checkpoint.interval_steps > 0).then(|| out.join("checkpoints")));
    if let Some(dir) = checkpoints {
        args.extend(["--checkpoint-dir".to_string(), dir.display().to_string()]);
    }
    appliance.run_memoryx(&args, |m| {
        let loss = m["loss"].as_f64().unwrap_or(f64::NAN);
        let rate = m["samples_per_s"].as_f64().unwrap_or(0.0);
        bar.set_message(format!("loss {loss:.4}  {rate:.0} samples/s"));
        bar.set_position(m["step"].as_u64().unwrap_or(0));
    })?;
    drop(appliance);
    let text = std::fs::read_to_string(out.join("summary.json")).context("MemoryX finished without a summary.json")?;
    Ok(serde_json::from_str(&text)?)
}

/// The appliance in this process: the same roles as threads and calls, for benchmarks and debugging.
fn run_in_process(
    job: &crds::TrainingJob,
    total: u64,
    train: runtime::data::Dataset,
    test: runtime::data::Dataset,
    sample: usize,
    out: &Path,
    bar: &ProgressBar,
) -> Result<serde_json::Value> {
    let spec = &job.spec;
    let metrics_path = out.join("metrics.jsonl");
    let mut metrics = BufWriter::new(
        File::create(&metrics_path).with_context(|| format!("cannot create {}", metrics_path.display()))?,
    );
    let layout = ModelLayout::from_spec(&spec.model);
    let engines: Vec<Box<dyn EngineRole>> = (0..spec.cs2)
        .map(|i| Box::new(sim_wse::engine(format!("engine-{i}"), layout.clone(), &spec.engine)) as Box<dyn EngineRole>)
        .collect();
    let (train, test) = (std::sync::Arc::new(train), std::sync::Arc::new(test));
    let mut swarm = LocalSwarm::new(engines, train.clone(), test.clone())?;
    let memoryx = MemoryX::new(
        layout,
        spec.training.optimizer.clone(),
        spec.training.schedule.clone(),
        total,
        spec.training.seed,
    );
    let retry = runtime::train::RetryPolicy::default();
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let mut summary = runtime::train::run(spec, &name, &memoryx, &mut swarm, (&train, &test), 0, total, retry, &|_| false, &mut |m| {
        serde_json::to_writer(&mut metrics, m).map_err(|e| runtime::Error::io("writing metrics.jsonl", e.into()))?;
        metrics.write_all(b"\n").map_err(|e| runtime::Error::io("writing metrics.jsonl", e))?;
        bar.set_message(format!("loss {:.4}  {:.0} samples/s", m.loss, m.samples_per_s));
        bar.inc(1);
        Ok(())
    })?;
    metrics.flush().with_context(|| format!("cannot write {}", metrics_path.display()))?;
    summary.samples = runtime::sample::lines(&memoryx, &ModelLayout::from_spec(&spec.model), sample, spec.training.seed)?;
    write_json_atomic(&out.join("summary.json"), &summary)?;
    Ok(serde_json::to_value(&summary)?)
}
