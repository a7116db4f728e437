//! The engine program: one simulated CS-2 on the network. Its input workers feed it each step's samples (as
//! the seeds' input servers feed each engine directly; it never opens a data file), it runs the runtime's
//! engine program on a [`crate::SimWse`], and serves the `Stage` service to its SwarmX node.

use std::sync::Arc;

use std::sync::atomic::AtomicU64;

use crds::contract::{EngineArgs, Role};
use errors::Result;
use plan::layout::ModelLayout;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use runtime::engine::server::EngineServer;
use runtime::input::remote::RemoteFeed;
use runtime::input::{Feed, ShardBound};
use runtime::memoryx::store::MemoryX;
use wire::program::Program;

/// Seconds an engine waits for its input workers to answer when it first needs data: they may still be loading
/// (tokenizing a corpus takes a while).
const INPUT_CONNECT_SECONDS: u64 = 600;

/// Runs one engine until it is stopped.
pub fn main(args: EngineArgs) -> Result<()> {
    runtime::process::keep_allocator_warm();
    let program = Program::start(Role::Engine, &args.common)?;
    let spec = &program.job.spec;
    // A pipelined replica pruned by magnitude reads the pretrained folder: in the data volume when there is one.
    let pretrained = match &args.data_root {
        Some(root) => runtime::memoryx::huggingface::locate(spec, Some(root))?,
        None => spec.model.from.as_ref().map(std::path::PathBuf::from),
    };
    let layout = ModelLayout::from_spec(&spec.model);
    let engine = crate::engine(format!("engine-{}", args.index), layout.clone(), &spec.engine);
    // What the plan lets a message make this engine hold (`program.limits`): its shard of the batch (training
    // steps and evaluation batches alike never hand it more), each layer's shape, the model's state.
    let dial = program.dial(INPUT_CONNECT_SECONDS);
    let feed: Arc<dyn Feed> = Arc::new(RemoteFeed::new(
        program.runtime.handle().clone(),
        &args.inputs,
        &program.job_id,
        dial,
        ShardBound::for_spec(spec),
    )?);
    let (described, spec) = (feed.clone(), spec.clone());
    // A replica's optimizer schedule spans the run, whose length the data decides: asked of the input workers
    // when the first replica is made (they are up by then: MemoryX has already asked one).
    let replica = move || {
        let total = runtime::coordinator::train::total_steps(&spec.training, described.describe()?.train_samples)?;
        MemoryX::replica(
            layout.clone(),
            &runtime::optim::Recipe { from: pretrained.clone(), ..runtime::optim::Recipe::of(&spec, total) },
        )
    };
    let server = EngineServer::new(program.job_id.clone(), program.limits.clone(), Box::new(engine), feed)
        .with_replicas(Arc::new(replica));
    let (grpc, http) = program.listen(args.listen)?;
    let server = Arc::new(server);
    let mut registry = Registry::default();
    let gauges = EngineGauges::register(&mut registry);
    program.serve_http(http, registry, axum::Router::new());
    let (watched, started) = (server.clone(), std::time::Instant::now());
    program.runtime.spawn(async move {
        loop {
            if let Some(s) = watched.stats_if_free() {
                gauges.update(&s, started.elapsed().as_secs_f64());
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    tracing::info!(index = args.index, "engine ready");
    program.runtime.block_on(runtime::protocol::serve_layer_stage(server, grpc, &program.identity))
}

/// The engine's counters as Prometheus gauges, refreshed every second.
struct EngineGauges {
    busy: Gauge<f64, AtomicU64>,
    compute: Gauge<f64, AtomicU64>,
    simulated: Gauge<f64, AtomicU64>,
    received: Gauge<f64, AtomicU64>,
    flops: Gauge<f64, AtomicU64>,
    peak_sram: Gauge<f64, AtomicU64>,
    sram: Gauge<f64, AtomicU64>,
}

impl EngineGauges {
    fn register(r: &mut Registry) -> Self {
        let g = EngineGauges {
            busy: Gauge::default(),
            compute: Gauge::default(),
            simulated: Gauge::default(),
            received: Gauge::default(),
            flops: Gauge::default(),
            peak_sram: Gauge::default(),
            sram: Gauge::default(),
        };
        r.register("ws_engine_busy_fraction", "Share of the engine's life spent computing", g.busy.clone());
        r.register("ws_engine_compute_seconds", "Wall time spent computing", g.compute.clone());
        r.register("ws_engine_simulated_seconds", "Time a real wafer would have taken", g.simulated.clone());
        r.register("ws_engine_bytes_received", "Bytes streamed into the engine", g.received.clone());
        r.register("ws_engine_flops", "Floating-point operations done (zeros skipped)", g.flops.clone());
        r.register("ws_engine_peak_sram_bytes", "Most SRAM held at once", g.peak_sram.clone());
        r.register("ws_engine_sram_bytes", "SRAM budget", g.sram.clone());
        g
    }

    fn update(&self, s: &runtime::engine::role::EngineStats, uptime_s: f64) {
        self.busy.set(s.compute_s / uptime_s.max(1e-9));
        self.compute.set(s.compute_s);
        self.simulated.set(s.counters.simulated_s);
        self.received.set(s.counters.bytes_received as f64);
        self.flops.set(s.counters.flops as f64);
        self.peak_sram.set(s.peak_sram_bytes as f64);
        self.sram.set(s.sram_bytes as f64);
    }
}
