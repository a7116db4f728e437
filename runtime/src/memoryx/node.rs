//! The MemoryX program. It is also the job's coordinator: it runs the [`crate::driver`] against the SwarmX
//! tree, and reports progress on `GET /status` (what the operator reads, [`crds::contract::MemoryxStatus`]) and
//! `/metrics`. `POST /checkpoint` asks for a checkpoint at the next step boundary; `GET /checkpoints` and
//! `GET /checkpoints/{file}` hand the checkpoints back ([`super::serve`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use crds::contract::{Handshake, MemoryxArgs, ProgressReport, Role};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::driver::{Driver, Job, Outputs};
use crate::error::{Error, Result};
use crate::swarmx::remote::RemoteSwarm;
use crate::train::RetryPolicy;
use crate::transport::{announce_ready, bind, dial, load_identity, load_job, serve_http, start};

struct Metrics {
    step: Gauge<i64>,
    loss: Gauge<f64, AtomicU64>,
    bytes: Counter,
    samples_per_s: Gauge<f64, AtomicU64>,
}

impl Metrics {
    fn register(r: &mut Registry) -> Metrics {
        let m = Metrics { step: Gauge::default(), loss: Gauge::default(), bytes: Counter::default(), samples_per_s: Gauge::default() };
        r.register("ws_step", "Training steps completed", m.step.clone());
        r.register("ws_loss", "Mean loss of the last step", m.loss.clone());
        r.register("ws_bytes_streamed", "Bytes moved between MemoryX and SwarmX", m.bytes.clone());
        r.register("ws_samples_per_second", "Training throughput of the last step", m.samples_per_s.clone());
        m
    }

    fn record(&self, m: &ProgressReport) {
        self.step.set(m.step as i64);
        self.loss.set(m.loss);
        self.bytes.inc_by(m.bytes_streamed);
        self.samples_per_s.set(m.samples_per_s);
    }
}

/// Runs MemoryX and the job to the end (or failure).
pub fn main(args: MemoryxArgs) -> Result<()> {
    start(&args.common);
    let (manifest, job_id) = load_job(&args.common)?;
    let identity = load_identity(&args.common)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    let outputs = Outputs {
        checkpoint_dir: args.checkpoint_dir.clone(),
        out: args.out.clone(),
        sample: args.sample,
        retry: RetryPolicy { attempts: (args.retry_seconds * 2).max(1) as u32, pause: Duration::from_millis(500) },
        hold_after_requested_checkpoint: Duration::from_secs(args.hold_seconds),
    };
    // Until the data is loaded the driver does not exist; /status answers Starting meanwhile.
    let status = Arc::new(Mutex::new(crds::contract::MemoryxStatus::default()));
    let want_checkpoint = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let http = rt.block_on(bind(args.common.http, Role::Memoryx, "http"))?;
    announce_ready(Role::Memoryx, None, &http)?;
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
            .merge(super::serve::routes(args.checkpoint_dir.clone()))
    };
    let http_task = {
        let identity = identity.clone();
        rt.spawn(async move { serve_http(http, Arc::new(Mutex::new(registry)), &identity, routes).await })
    };

    let uid = manifest.metadata.uid.clone();
    let result = Job::load(manifest.spec, job_id).and_then(|mut job| {
        job.uid = uid;
        let mut driver = Driver::new(job, outputs);
        driver.share(status.clone(), want_checkpoint.clone());
        let limits = crate::plan::Limits::for_spec(&driver.job().spec);
        let mut swarm = RemoteSwarm::connect(
            rt.handle().clone(),
            &args.swarmx,
            &driver.job().id,
            dial(&args.common, &identity, args.connect_timeout, &limits),
            limits,
        )?;
        let mut steps_done = 0;
        driver.run(&mut swarm, &mut |m| {
            metrics.record(m);
            if args.progress {
                Handshake::Progress(m.clone()).announce();
            }
            steps_done += 1;
            if args.crash_after_steps.is_some_and(|n| steps_done >= n) {
                tracing::error!(step = m.step, "fault injection: exiting abruptly");
                std::process::exit(3);
            }
        })
    });
    match &result {
        Ok(summary) => Handshake::Done { steps: summary.steps }.announce(),
        Err(e) => {
            // A failure before the driver started (bad data) is reported the same way as one during training.
            if let Ok(mut s) = status.lock() {
                s.phase = crds::contract::MemoryxPhase::Failed;
                s.message.get_or_insert_with(|| e.to_string());
            }
        }
    }
    if args.linger {
        tracing::info!("job finished; serving /status and /checkpoints until stopped");
        let _ = rt.block_on(http_task);
    }
    result.map(|_| ())
}
