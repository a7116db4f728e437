//! The MemoryX program. It is also the job's coordinator: it owns the step counter, drives the training loop
//! through the SwarmX tree, checkpoints, and reports progress on `GET /status` (what the operator reads) and
//! `/metrics`. `POST /checkpoint` asks for a checkpoint at the next step boundary.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::{checkpoint, MemoryX};
use crate::error::{Error, Result};
use crate::model::ModelLayout;
use crate::swarmx::remote::RemoteSwarm;
use crate::swarmx::Swarm;
use crate::train::{self, RetryPolicy, StepMetrics};
use crate::transport::{bind, serve_http, CommonArgs};

/// Flags of the `memoryx` program.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// The root SwarmX node.
    #[arg(long, env = "WS_SWARMX")]
    pub swarmx: String,
    /// Where checkpoints live; the job resumes from the newest one found here.
    #[arg(long, env = "WS_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Where to write metrics.jsonl and summary.json.
    #[arg(long, env = "WS_OUT")]
    pub out: Option<PathBuf>,
    /// Seconds to wait for the SwarmX tree to come up.
    #[arg(long, env = "WS_CONNECT_TIMEOUT", default_value_t = 120)]
    pub connect_timeout: u64,
    /// Seconds to keep rerunning a step while a lost engine comes back.
    #[arg(long, env = "WS_RETRY_SECONDS", default_value_t = 60)]
    pub retry_seconds: u64,
    /// Print each step's metrics on standard output as `progress {json}`, for a local supervisor.
    #[arg(long)]
    pub progress: bool,
    /// Keep serving `/status` after the job ends (as a pod does), instead of exiting.
    #[arg(long, env = "WS_LINGER")]
    pub linger: bool,
    /// After training a language model, decode this many lines of text from it into `summary.json`.
    #[arg(long, env = "WS_SAMPLE", default_value_t = 0)]
    pub sample: usize,
    /// Fault injection for tests: exit abruptly, without a final checkpoint, after this many steps.
    #[arg(long, hide = true)]
    pub crash_after_steps: Option<u64>,
}

/// The last checkpoint written.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointRef {
    /// The step it holds.
    pub step: u64,
    /// Its file.
    pub path: String,
}

/// What `GET /status` answers: the job's progress as the operator copies it into the TrainingJob status.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Running, Checkpointing, Succeeded or Failed.
    pub phase: String,
    /// Steps completed.
    pub step: u64,
    /// Steps in the whole job.
    pub total_steps: u64,
    /// Mean loss of the last step.
    pub loss: Option<f64>,
    /// Throughput of the last step.
    pub samples_per_second: Option<f64>,
    /// Simulated wafer time per step.
    pub simulated_step_seconds: Option<f64>,
    /// The newest checkpoint.
    pub last_checkpoint: Option<CheckpointRef>,
    /// Held-out accuracy once the job has finished.
    pub eval_accuracy: Option<f64>,
    /// Why the job failed, when it did.
    pub message: Option<String>,
}

struct Metrics {
    step: Gauge<i64>,
    loss: Gauge<f64, std::sync::atomic::AtomicU64>,
    bytes: Counter,
    samples_per_s: Gauge<f64, std::sync::atomic::AtomicU64>,
}

fn registry() -> (Registry, Metrics) {
    let mut r = Registry::default();
    let m = Metrics { step: Gauge::default(), loss: Gauge::default(), bytes: Counter::default(), samples_per_s: Gauge::default() };
    r.register("ws_step", "Training steps completed", m.step.clone());
    r.register("ws_loss", "Mean loss of the last step", m.loss.clone());
    r.register("ws_bytes_streamed", "Bytes moved between MemoryX and SwarmX", m.bytes.clone());
    r.register("ws_samples_per_second", "Training throughput of the last step", m.samples_per_s.clone());
    (r, m)
}

/// Runs MemoryX and the job to the end (or failure).
pub fn main(args: Args) -> Result<()> {
    args.common.start();
    let (job, job_id) = args.common.load()?;
    let spec = job.spec.clone();
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    let status = Arc::new(Mutex::new(Status { phase: "Starting".into(), ..Status::default() }));
    let want_checkpoint = Arc::new(AtomicBool::new(false));
    let (registry, metrics) = registry();
    let http = rt.block_on(bind(args.common.http, "memoryx", "http"))?;
    let routes = {
        let (status, want) = (status.clone(), want_checkpoint.clone());
        Router::new()
            .route("/status", get(move || {
                let s = status.lock().map(|s| s.clone()).unwrap_or_default();
                async move { Json(s) }
            }))
            .route("/checkpoint", post(move || {
                want.store(true, Ordering::SeqCst);
                async { (axum::http::StatusCode::ACCEPTED, "checkpoint requested\n") }
            }))
    };
    let http_task = rt.spawn(serve_http(http, Arc::new(Mutex::new(registry)), routes));

    let result = coordinate(&args, &spec, &job_id, rt.handle().clone(), &status, &want_checkpoint, &metrics);
    if let Ok(mut s) = status.lock() {
        match &result {
            Ok(summary) => {
                s.phase = "Succeeded".into();
                s.eval_accuracy = Some(summary.eval.accuracy);
            }
            Err(e) => {
                s.phase = "Failed".into();
                s.message = Some(e.to_string());
            }
        }
    }
    if args.linger {
        tracing::info!("job finished; serving /status until stopped");
        let _ = rt.block_on(http_task);
    }
    result.map(|_| ())
}

fn update(status: &Mutex<Status>, f: impl FnOnce(&mut Status)) {
    if let Ok(mut s) = status.lock() {
        f(&mut s);
    }
}

fn coordinate(
    args: &Args,
    spec: &crds::TrainingJobSpec,
    job_id: &str,
    handle: tokio::runtime::Handle,
    status: &Mutex<Status>,
    want_checkpoint: &AtomicBool,
    metrics: &Metrics,
) -> Result<train::Summary> {
    let (train_set, test_set) = crate::data::load(spec)?;
    let total = train::total_steps(&spec.training, train_set.len())?;
    let layout = ModelLayout::from_spec(&spec.model);
    let store = MemoryX::new(layout, spec.training.optimizer.clone(), spec.training.schedule.clone(), total, spec.training.seed);
    let mut start = 0;
    if let Some(dir) = &args.checkpoint_dir {
        if let Some((step, tensors, path)) = checkpoint::latest(dir)? {
            store.restore(step, &tensors)?;
            tracing::info!(step, path = %path.display(), "resumed from checkpoint");
            start = step.min(total);
            update(status, |s| s.last_checkpoint = Some(CheckpointRef { step, path: path.display().to_string() }));
        }
    }
    update(status, |s| {
        s.phase = "Running".into();
        s.step = start;
        s.total_steps = total;
    });
    let mut swarm = RemoteSwarm::connect(handle, &args.swarmx, job_id, Duration::from_secs(args.connect_timeout))?;
    tracing::info!(engines = swarm.engines(), start, total, "training");

    let mut metrics_file = match &args.out {
        Some(out) => {
            std::fs::create_dir_all(out).map_err(|e| Error::io(format!("creating {}", out.display()), e))?;
            let path = out.join("metrics.jsonl");
            let file = if start > 0 {
                keep_steps_up_to(&path, start)?;
                OpenOptions::new().append(true).create(true).open(&path)
            } else {
                File::create(&path)
            };
            Some(BufWriter::new(file.map_err(|e| Error::io(format!("opening {}", path.display()), e))?))
        }
        None => None,
    };
    let keep = spec.checkpoint.keep as usize;
    let interval = spec.checkpoint.interval_steps;
    let write_checkpoint = |step: u64| -> Result<()> {
        let Some(dir) = &args.checkpoint_dir else { return Ok(()) };
        update(status, |s| s.phase = "Checkpointing".into());
        let (at, tensors) = store.snapshot()?;
        debug_assert_eq!(at, step);
        let path = checkpoint::write(dir, at, &tensors, job_id, keep)?;
        update(status, |s| {
            s.phase = "Running".into();
            s.last_checkpoint = Some(CheckpointRef { step: at, path: path.display().to_string() });
        });
        Ok(())
    };
    let crash_after = args.crash_after_steps;
    let steps_done = AtomicU64::new(0);
    let retry = RetryPolicy { attempts: (args.retry_seconds * 2).max(1) as u32, pause: Duration::from_millis(500) };
    // With the model resident on the engines, MemoryX's copy is brought up to date for each checkpoint.
    let sync_at = |step: u64| (interval > 0 && step % interval == 0) || want_checkpoint.load(Ordering::SeqCst);
    let data = (&train_set, &test_set);
    let mut summary = train::run(spec, job_id, &store, &mut swarm, data, start, total, retry, &sync_at, &mut |m: &StepMetrics| {
        metrics.step.set(m.step as i64);
        metrics.loss.set(m.loss);
        metrics.bytes.inc_by(m.bytes_streamed);
        metrics.samples_per_s.set(m.samples_per_s);
        update(status, |s| {
            s.step = m.step;
            s.loss = Some(m.loss);
            s.samples_per_second = Some(m.samples_per_s);
        });
        if let Some(f) = metrics_file.as_mut() {
            serde_json::to_writer(&mut *f, m).map_err(|e| Error::io("writing metrics.jsonl", e.into()))?;
            f.write_all(b"\n").and_then(|()| f.flush()).map_err(|e| Error::io("writing metrics.jsonl", e))?;
        }
        if args.progress {
            crate::transport::announce(&format!("progress {}", serde_json::to_string(m).unwrap_or_default()));
        }
        let due = interval > 0 && m.step % interval == 0;
        if due || want_checkpoint.swap(false, Ordering::SeqCst) {
            write_checkpoint(m.step)?;
        }
        if crash_after.is_some_and(|n| steps_done.fetch_add(1, Ordering::SeqCst) + 1 >= n) {
            tracing::error!(step = m.step, "fault injection: exiting abruptly");
            std::process::exit(3);
        }
        Ok(())
    })?;
    if args.checkpoint_dir.is_some() && status.lock().map(|s| s.last_checkpoint.as_ref().map(|c| c.step)).ok().flatten() != Some(total) {
        write_checkpoint(total)?;
    }
    update(status, |s| s.simulated_step_seconds = Some(summary.simulated_step_s));
    summary.samples = crate::sample::lines(&store, &ModelLayout::from_spec(&spec.model), args.sample, spec.training.seed)?;
    if let Some(out) = &args.out {
        let path = out.join("summary.json");
        let tmp = out.join("summary.json.tmp");
        let text = serde_json::to_string_pretty(&summary).map_err(|e| Error::io("encoding summary", e.into()))?;
        std::fs::write(&tmp, text + "\n").map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))?;
    }
    crate::transport::announce(&format!(
        "done {}",
        serde_json::to_string(&serde_json::json!({"steps": summary.steps, "accuracy": summary.eval.accuracy})).unwrap_or_default()
    ));
    Ok(summary)
}

/// After a restart from the checkpoint of step `start`, drops the metrics of steps after it, which are about
/// to be run again, so the file keeps one line per step.
fn keep_steps_up_to(path: &Path, start: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: String = text
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v["step"].as_u64()).is_some_and(|s| s <= start))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).map_err(|e| Error::io(format!("rewriting {}", path.display()), e))
}
