//! The MemoryX program. It is also the job's coordinator: it runs the [`crate::coordinator::driver`] against the SwarmX
//! tree, and reports progress on `GET /status` (what the operator reads, [`crds::contract::MemoryxStatus`]) and
//! `/metrics`. `POST /checkpoint` asks for a checkpoint at the next step boundary; `GET /checkpoints` and
//! `GET /checkpoints/{file}` hand the checkpoints back ([`crate::memoryx::checkpoint_routes`]), `GET /run` and
//! `GET /run/{file}` the run's records ([`crate::coordinator::run_routes`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use crds::contract::{Handshake, MemoryxArgs, ProgressReport, Role};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::coordinator::driver::{Driver, Job, Outputs};
use crate::coordinator::train::RetryPolicy;
use crate::memoryx::grpc_service::{WeightsService, weights_service};
use crate::memoryx::remote::RemoteServer;
use crate::memoryx::slice::SliceId;
use crate::memoryx::store::MemoryX;
use crate::memoryx::weight_server::{LocalSlice, Masking, WeightServer, layer_lengths};
use crate::protocol::codec::chunk::Recycled;
use crate::swarmx::Swarm;
use crate::swarmx::remote::RemoteSwarm;
use errors::{Error, Result};
use wire::program::Program;

struct Metrics {
    step: Gauge<i64>,
    loss: Gauge<f64, AtomicU64>,
    bytes: Counter,
    samples_per_s: Gauge<f64, AtomicU64>,
}

impl Metrics {
    fn register(r: &mut Registry) -> Metrics {
        let m = Metrics {
            step: Gauge::default(),
            loss: Gauge::default(),
            bytes: Counter::default(),
            samples_per_s: Gauge::default(),
        };
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

/// What a weight server's process holds and moves, on `/metrics`: its budget is judged by these.
#[derive(Clone, Default)]
struct Usage {
    peak_rss: Gauge<i64>,
    memory: Gauge<i64>,
    disk: Gauge<i64>,
    tier_read: Gauge<i64>,
    tier_written: Gauge<i64>,
}

impl Usage {
    fn register(r: &mut Registry) -> Usage {
        let u = Usage::default();
        r.register(
            "ws_memoryx_peak_rss_bytes",
            "Peak resident memory of this MemoryX process (VmHWM)",
            u.peak_rss.clone(),
        );
        r.register("ws_memoryx_memory_bytes", "Bytes of state this weight server keeps in memory", u.memory.clone());
        r.register("ws_memoryx_disk_bytes", "Bytes of state this weight server keeps in its disk tier", u.disk.clone());
        r.register("ws_memoryx_tier_read_bytes", "Bytes read from the disk tier", u.tier_read.clone());
        r.register("ws_memoryx_tier_written_bytes", "Bytes written to the disk tier", u.tier_written.clone());
        u
    }

    /// Keeps the gauges current, once a second, for as long as the process runs.
    fn follow(self, shard: Arc<LocalSlice>) {
        std::thread::spawn(move || {
            loop {
                let (memory, disk) = shard.bytes();
                let (read, written) = shard.tier_traffic();
                self.peak_rss.set(crate::process::peak_rss_bytes() as i64);
                self.memory.set(memory as i64);
                self.disk.set(disk as i64);
                self.tier_read.set(read as i64);
                self.tier_written.set(written as i64);
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    }
}

/// Runs MemoryX and the job to the end (or failure): the coordinator (weight server 0), or, with a
/// `--server-index` above 0, a weight server serving its slice to the coordinator.
pub fn main(args: MemoryxArgs) -> Result<()> {
    crate::process::tighten_allocator();
    if args.server_index > 0 {
        return serve_slice(args);
    }
    let program = Program::start(Role::Memoryx, &args.common)?;
    keep_layers_within(&program.job.spec);
    let (manifest, job_id, rt) = (program.job.clone(), program.job_id.clone(), &program.runtime);
    let outputs = Outputs {
        checkpoint_dir: args.checkpoint_dir.clone(),
        out: args.out.clone(),
        tier_dir: args.tier_dir.clone(),
        sample: args.sample,
        retry: RetryPolicy { budget: Duration::from_secs(args.retry_seconds), pause: Duration::from_millis(500) },
        hold_after_requested_checkpoint: Duration::from_secs(args.hold_seconds),
    };
    // Until the data is loaded the driver does not exist; /status answers Starting meanwhile.
    let status = Arc::new(Mutex::new(crds::contract::MemoryxStatus::default()));
    let want_checkpoint = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let usage = Usage::register(&mut registry);
    // With other weight servers, the coordinator serves its own slice too: the SwarmX root streams from it.
    let (mut grpc, http) = if args.weight_servers.is_empty() {
        (None, program.listen_http()?)
    } else {
        let (grpc, http) = program.listen(args.listen)?;
        (Some(grpc), http)
    };
    let routes = {
        let (status, want) = (status.clone(), want_checkpoint.clone());
        Router::new()
            .route(
                "/status",
                get(move || {
                    let s = status.lock().map(|s| s.clone()).unwrap_or_default();
                    async move { Json(s) }
                }),
            )
            .route(
                "/checkpoint",
                post(move || {
                    want.store(true, Ordering::SeqCst);
                    async { (axum::http::StatusCode::ACCEPTED, "checkpoint requested\n") }
                }),
            )
            .merge(crate::memoryx::checkpoint_routes::routes(args.checkpoint_dir.clone()))
            .merge(crate::coordinator::run_routes::routes(args.out.clone()))
    };
    let http_task = program.serve_http(http, registry, routes);

    let uid = manifest.metadata.uid.clone();
    let described = {
        // The data stays with the input workers: one of them says what it holds.
        let bound = crate::input::ShardBound::for_spec(&manifest.spec);
        let dial = program.dial(args.connect_timeout);
        crate::input::remote::RemoteFeed::new(
            rt.handle().clone(),
            std::slice::from_ref(&args.input),
            &job_id,
            dial,
            bound,
        )
        .and_then(|feed| crate::input::Feed::describe(&feed))
    };
    let root = args.data_root.clone();
    let located = described.and_then(|data| Job::new(manifest.spec, job_id, data)?.locate_pretrained(root.as_deref()));
    let result = located.and_then(|mut job| {
        job.uid = uid;
        let store = if args.weight_servers.is_empty() {
            job.store(&outputs)?
        } else {
            remote_store(&job, &args, &outputs, &program)?
        };
        if let Some(local) = store.local() {
            usage.clone().follow(local.clone());
        }
        let store_masks = (store.local().cloned(), store.masks());
        let mut driver = Driver::new(job, outputs);
        driver.with_store(store);
        driver.share(status.clone(), want_checkpoint.clone());
        // Evicted or drained, MemoryX saves the step in flight before it goes (the pod's grace period is sized
        // for it), so the job resumes with no step lost.
        driver.stop_on(program.stop_gracefully());
        let mut swarm = RemoteSwarm::connect(
            rt.handle().clone(),
            &args.stage,
            &driver.job().id,
            program.dial(args.connect_timeout),
            program.limits.clone(),
        )?;
        if let Some(listener) = grpc.take() {
            let own = serve_own_slice(&program, driver.job(), &store_masks, listener, args.advertise.clone())?;
            let (servers, engines) = (args.weight_servers.len() as u32 + 1, swarm.engines() as u32);
            if plan::memoryx::streams_from_servers(servers, engines) {
                swarm.stream_from([own].into_iter().chain(args.weight_servers.iter().cloned()).collect())?;
                tracing::info!(servers, engines, "the SwarmX root streams straight from the weight servers");
            }
        }
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
    if let Err(Error::Stopped { step, checkpoint }) = &result {
        Handshake::Stopped { step: *step, checkpoint: checkpoint.clone() }.announce();
        // Nothing to linger for: the job is not over, and its next MemoryX resumes it.
        return result.map(|_| ());
    }
    program.stop_at_once();
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
        if let Err(e) = &result {
            // Said now, not only on exit: the operator's post-mortem names the first error a pod logged.
            tracing::error!("the run failed: {e}");
        }
        tracing::info!("job finished; serving /status and /checkpoints until stopped");
        let _ = rt.block_on(http_task);
    }
    result.map(|_| ())
}

/// The coordinator's store over its weight servers: slice 0 here, slice `i` at `--weight-servers`' `i`-th
/// address. The plan's server count and the addresses given must agree.
fn remote_store(job: &Job, args: &MemoryxArgs, outputs: &Outputs, program: &Program) -> Result<MemoryX> {
    let n = job.memoryx_plan()?.servers;
    if n as usize != args.weight_servers.len() + 1 {
        return Err(Error::Plan(format!(
            "the plan spreads MemoryX over {n} weight servers but --weight-servers names {} besides the coordinator",
            args.weight_servers.len()
        )));
    }
    let t = &job.spec.training;
    let layout = job.layout();
    let masking = Masking::of(&job.recipe());
    let lengths = layer_lengths(&layout, &t.optimizer, &masking);
    let local = Arc::new(job.local_slice(outputs, SliceId { index: 0, count: n })?);
    let mut servers: Vec<Arc<dyn WeightServer>> = vec![local.clone()];
    for (i, url) in args.weight_servers.iter().enumerate() {
        let slice = SliceId { index: i as u32 + 1, count: n };
        let d = program.dial(args.connect_timeout);
        servers.push(Arc::new(RemoteServer::new(program.runtime.handle().clone(), url, &job.id, slice, &lengths, d)?));
    }
    MemoryX::over(layout, &masking, lengths, servers, Some(local))
}

/// Serves the coordinator's own slice (`local`, with the `masks` it chose) on `listener` in the background, for
/// the SwarmX root that streams straight from the weight servers; returns the URL the root reaches it at
/// (`advertise`, else the address bound, which must then be a specific one).
fn serve_own_slice(
    program: &Program,
    job: &Job,
    (local, masks): &(Option<Arc<LocalSlice>>, Vec<Option<Arc<kernels::sparse::SparsePattern>>>),
    listener: tokio::net::TcpListener,
    advertise: Option<String>,
) -> Result<String> {
    let local = local.clone().ok_or_else(|| Error::Protocol("the coordinator holds no slice of its own".into()))?;
    let bound = listener.local_addr().map_err(|e| Error::io("reading the weight-server address bound", e))?;
    let url = match advertise {
        Some(url) => url,
        None if bound.ip().is_unspecified() => {
            return Err(Error::Plan(format!(
                "the coordinator listens on {bound}, which the SwarmX root cannot dial: pass --advertise URL"
            )));
        }
        None => format!("https://{bound}"),
    };
    let service = slice_service(job, local).with_masks(masks.clone());
    let identity = program.identity.clone();
    program.runtime.spawn(async move {
        if let Err(e) = wire::grpc::serve(weights_service(Arc::new(service)), listener, &identity).await {
            tracing::error!("the coordinator's weight-server service stopped: {e}");
        }
    });
    Ok(url)
}

/// Keeps layer buffers for reuse ([`Recycled::layers`]): in a MemoryX process under a memory budget only within
/// what it has had in use at once, and in one without as many as a step holds at once: a staged gradient per
/// layer, and a few layers in transit.
fn keep_layers_within(spec: &crds::TrainingJobSpec) {
    if spec.memoryx.memory_bytes.is_some() {
        Recycled::layers().keep_within_peak();
    } else {
        Recycled::layers()
            .keep_up_to(plan::layout::ModelLayout::from_spec(&spec.model).linears.len() + LAYERS_IN_TRANSIT);
    }
}

/// Layer buffers a MemoryX process has in transit besides its staged gradients: the layer being sent and the one
/// prepared behind it, the gradient being received, each a weight and a bias buffer.
const LAYERS_IN_TRANSIT: usize = 6;

/// A weight server other than the coordinator: it asks an input worker how long the run is (the learning-rate
/// schedule needs it), builds its slice, and serves it on `--listen` until stopped.
fn serve_slice(args: MemoryxArgs) -> Result<()> {
    let program = Program::start(Role::Memoryx, &args.common)?;
    keep_layers_within(&program.job.spec);
    let (grpc, http) = program.listen(args.listen)?;
    let mut registry = Registry::default();
    let usage = Usage::register(&mut registry);
    program.serve_http(http, registry, Router::new());
    let (manifest, job_id) = (program.job.clone(), program.job_id.clone());
    let bound = crate::input::ShardBound::for_spec(&manifest.spec);
    let feed = crate::input::remote::RemoteFeed::new(
        program.runtime.handle().clone(),
        std::slice::from_ref(&args.input),
        &job_id,
        program.dial(args.connect_timeout),
        bound,
    )?;
    let data = crate::input::Feed::describe(&feed)?;
    let job = Job::new(manifest.spec, job_id.clone(), data)?.locate_pretrained(args.data_root.as_deref())?;
    let n = job.memoryx_plan()?.servers;
    if args.server_index >= n {
        return Err(Error::Plan(format!("this is weight server {} but the plan has {n} (0..{n})", args.server_index)));
    }
    let slice = SliceId { index: args.server_index, count: n };
    let outputs =
        Outputs { checkpoint_dir: args.checkpoint_dir.clone(), tier_dir: args.tier_dir.clone(), ..Outputs::default() };
    let shard = Arc::new(job.local_slice(&outputs, slice)?);
    let (memory, disk) = shard.bytes();
    tracing::info!(%slice, memory, disk, "serving its slice");
    usage.follow(shard.clone());
    let service = Arc::new(slice_service(&job, shard));
    program.runtime.block_on(wire::grpc::serve(weights_service(service), grpc, &program.identity))
}

/// The `Weights` service of `job`'s weight server `shard`, its slice's lengths derived from the job.
fn slice_service(job: &Job, shard: Arc<LocalSlice>) -> WeightsService {
    let whole = layer_lengths(&job.layout(), &job.spec.training.optimizer, &Masking::of(&job.recipe()));
    let lengths = shard.slice().lengths(&whole);
    WeightsService::new(job.id.clone(), shard, lengths)
}
