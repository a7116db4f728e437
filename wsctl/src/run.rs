//! `wsctl run` and `wsctl plan`: load a job, plan it, and (for `run`) assemble MemoryX, SwarmX and the
//! engines in this process, train, evaluate and write the results.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::data::mnist::{self, Split};
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
    if json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
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
    println!("  execution   {:?}", plan.execution_mode);
    println!("  stream      layer  shape          dense        streamed");
    for (l, layer) in plan.layers.iter().enumerate() {
        println!(
            "              {:>5}  {:>5} x {:<5}  {:>11}  {:>11}",
            l,
            layer.outputs,
            layer.inputs,
            units::bytes(layer.dense_bytes),
            units::bytes(layer.stream_bytes)
        );
    }
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

/// `wsctl run`.
pub fn run(path: &Path, out: Option<PathBuf>, cs2: Option<u32>) -> Result<()> {
    let job = load_job(path, cs2)?;
    let spec = &job.spec;
    let plan = plan_of(spec)?;
    let data_dir = Path::new(&spec.data.path);
    let train = mnist::load(data_dir, Split::Train)?;
    let test = mnist::load(data_dir, Split::Test)?;
    let total = runtime::train::total_steps(&spec.training, train.len())?;

    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let out = out.unwrap_or_else(|| Path::new("runs").join(&name));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let metrics_path = out.join("metrics.jsonl");
    let mut metrics = BufWriter::new(
        File::create(&metrics_path).with_context(|| format!("cannot create {}", metrics_path.display()))?,
    );

    let layout = ModelLayout::from_spec(&spec.model);
    let engines: Vec<Box<dyn EngineRole>> = (0..spec.cs2)
        .map(|i| Box::new(sim_wse::engine(format!("engine-{i}"), layout.clone(), &spec.engine)) as Box<dyn EngineRole>)
        .collect();
    let (train_len, test_len) = (train.len(), test.len());
    let mut swarm = LocalSwarm::new(engines, std::sync::Arc::new(train), std::sync::Arc::new(test))?;
    let memoryx = MemoryX::new(
        layout,
        spec.training.optimizer.clone(),
        spec.training.schedule.clone(),
        total,
        spec.training.seed,
    );
    eprintln!(
        "{name}: {} steps of {} samples on {} CS-2 ({:?}), {} parameters in MemoryX",
        total,
        spec.training.batch_size,
        spec.cs2,
        plan.execution_mode,
        memoryx.parameters()
    );

    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut write_error = None;
    let retry = runtime::train::RetryPolicy::default();
    let summary = runtime::train::run(spec, &memoryx, &mut swarm, train_len, test_len, 0, total, retry, &mut |m| {
        if let Err(e) = serde_json::to_writer(&mut metrics, m).map_err(std::io::Error::from).and_then(|()| metrics.write_all(b"\n")) {
            write_error.get_or_insert(e);
        }
        bar.set_message(format!("loss {:.4}  {:.0} samples/s", m.loss, m.samples_per_s));
        bar.inc(1);
        Ok(())
    });
    bar.finish_and_clear();
    let summary = summary?;
    if let Some(e) = write_error {
        return Err(e).with_context(|| format!("cannot write {}", metrics_path.display()));
    }
    metrics.flush().with_context(|| format!("cannot write {}", metrics_path.display()))?;
    write_json_atomic(&out.join("summary.json"), &summary)?;
    println!(
        "{name}: {} steps in {:.1}s ({:.0} samples/s), final loss {:.4}, held-out accuracy {:.2}% on {} samples; \
         streamed {} ({:.1}% of dense) -> {}",
        summary.steps,
        summary.wall_s,
        summary.samples_per_s,
        summary.final_loss,
        100.0 * summary.eval.accuracy,
        summary.eval.samples,
        units::bytes(summary.bytes_streamed),
        100.0 * summary.bytes_streamed as f64 / summary.dense_equivalent_bytes.max(1) as f64,
        out.join("summary.json").display()
    );
    Ok(())
}
