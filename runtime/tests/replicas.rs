//! Pipelined execution over gRPC: an engine holding the model as a replica trains exactly as MemoryX would, and
//! refuses bad `Prime`, `Step` and `Apply` messages without its replica changing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{SEED, identity, layout, store};
use data::shard::Split;
use data::{Dataset, Sampler, mnist};
use errors::Error;
use plan::limits::Limits;
use runtime::coordinator::train;
use runtime::engine::hw::CountingHw;
use runtime::engine::role::EngineRole;
use runtime::engine::server::EngineServer;
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::checkpoint;
use runtime::memoryx::checkpoint::Tensors;
use runtime::memoryx::store::WeightStore;
use runtime::protocol::codec::grad::encode_grads;
use runtime::protocol::codec::state::encode_state;
use runtime::protocol::pb::{self, stage_client::StageClient};
use runtime::protocol::{LayerGrad, WeightPayload};
use runtime::swarmx::remote::RemoteSwarm;
use runtime::swarmx::{LocalSwarm, StepRequest, Swarm};
use wire::grpc::Dial;

const JOB: &str = "replica-test";

/// The job's limits: shards of `shard` samples of the test model, trained with AdamW (two moments).
fn limits(shard: usize) -> Limits {
    Limits::new(&layout(), shard, 2)
}

fn data() -> Arc<Dataset> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/mnist");
    Arc::new(Dataset::Images(mnist::load(&path, mnist::Split::Train).expect("the shipped digits load")))
}

fn engine() -> Box<dyn EngineRole> {
    Box::new(Wse::new("engine-0", layout(), CountingHw::new(1 << 30)))
}

/// An engine server with room for a replica on a loopback port, and a client of it.
fn serve(rt: &tokio::runtime::Runtime, data: &Arc<Dataset>) -> (String, StageClient<tonic::transport::Channel>) {
    let server =
        EngineServer::new(JOB.into(), limits(64), engine(), Arc::new(LocalFeed::new(data.clone(), data.clone())))
            .with_replicas(Arc::new(|| Ok(store())));
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { runtime::protocol::serve_stage(Arc::new(server), listener, identity()).await });
        let child = runtime::swarmx::relay::connect(&url, JOB, Dial::new(identity(), Duration::from_secs(10)))
            .await
            .expect("connect");
        (url, child.client)
    })
}

/// A replica's state as step and tensors (its bytes differ between writes: the metadata's order is not fixed).
fn decoded(bytes: &[u8]) -> (u64, Tensors) {
    checkpoint::from_bytes(bytes, "a replica").expect("a readable replica")
}

fn request(sampler: &Sampler, step: u64) -> StepRequest {
    let samples = sampler.batch(step);
    let grad_scale = 1.0 / samples.len() as f32;
    StepRequest { step, samples, split: Split::Train, grad_scale, micro_batch: 0 }
}

#[test]
fn a_replica_trains_exactly_like_memoryx() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let data = data();
    let (url, _) = serve(&rt, &data);
    let mut swarm = RemoteSwarm::connect(
        rt.handle().clone(),
        &url,
        JOB,
        Dial::new(identity(), Duration::from_secs(10)),
        limits(64),
    )
    .expect("swarm");
    assert!(swarm.holds_replicas());
    assert_eq!(swarm.sram_bytes(), 1 << 30, "the engine reports its SRAM for the plan");

    // The same steps streamed from MemoryX in this process, as the reference.
    let reference = store();
    let mut local =
        LocalSwarm::new(vec![engine()], Arc::new(LocalFeed::new(data.clone(), data.clone()))).expect("engines");
    let coordinator = store();
    let sampler = Sampler::new(data.len(), 64, SEED);
    // An engine without a replica (a replacement pod) is a lost component: the loop primes it and reruns.
    match swarm.resident_step(&request(&sampler, 0)) {
        Err(Error::Unavailable(why)) => assert!(why.contains("holds no replica"), "{why}"),
        other => panic!("a step on an unprimed engine must be unavailable, got {other:?}"),
    }
    swarm.prime(&coordinator.state(JOB).expect("state").1).expect("prime");
    assert!(
        decoded(&swarm.snapshot().expect("snapshot")) == decoded(&coordinator.state(JOB).expect("state").1),
        "the replica is MemoryX's state"
    );

    for step in 0..4 {
        let (want, _) = train::train_step(
            &reference,
            &mut local,
            train::StepShape { layers: 2, tokens_per_sample: 1, micro_batch: 0 },
            sampler.batch(step),
            step,
        )
        .expect("reference");
        let got = swarm.resident_step(&request(&sampler, step)).expect("resident step");
        assert_eq!((got.loss, got.correct, got.samples), (want.loss, want.correct, want.samples), "step {step}");
    }
    // Same gradients, same optimizer, same order: the replica holds MemoryX's state bit for bit.
    assert!(decoded(&swarm.snapshot().expect("snapshot")) == decoded(&reference.state(JOB).expect("state").1));
    coordinator.set_state(&swarm.snapshot().expect("snapshot")).expect("take back");
    assert_eq!(coordinator.step(), 4);
    assert_eq!(coordinator.dense_weights(0).expect("weights"), reference.dense_weights(0).expect("weights"));
}

#[test]
fn bad_replica_messages_are_refused_and_change_nothing() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let data = data();
    let (_, client) = serve(&rt, &data);
    let coordinator = store();
    let state = coordinator.state(JOB).expect("state").1;
    let call = |f: &dyn Fn(StageClient<tonic::transport::Channel>) -> tonic::Status| f(client.clone());
    let prime = |chunks: Vec<pb::StateChunk>| {
        let mut c = client.clone();
        rt.block_on(async move { c.prime(tokio_stream::iter(chunks)).await.map(|_| ()) })
    };
    let snapshot = || {
        let mut c = client.clone();
        rt.block_on(async move {
            let mut s = c.snapshot(pb::SnapshotRequest { job: JOB.into() }).await?.into_inner();
            let mut bytes = Vec::new();
            while let Some(chunk) = s.message().await? {
                bytes.extend(chunk.data);
            }
            Ok::<_, tonic::Status>(bytes)
        })
    };

    // Before any replica: nothing to snapshot or step.
    assert!(snapshot().unwrap_err().message().contains("holds no replica"));
    // A replica of another job, and a replica cut short.
    assert!(prime(encode_state(state.clone().into(), "other-job")).unwrap_err().message().contains("job 'other-job'"));
    let mut cut = encode_state(state.clone().into(), JOB);
    cut.pop();
    if let Some(last) = cut.last_mut() {
        last.data.truncate(last.data.len() / 2);
    }
    assert!(prime(cut).unwrap_err().message().contains("truncated"));
    // A replica whose bytes were damaged on the way: its checksum catches it.
    let mut damaged = encode_state(state.clone().into(), JOB);
    if let Some(last) = damaged.last_mut() {
        let mut bytes = last.data.to_vec();
        let n = bytes.len();
        bytes[n - 5] ^= 0x40;
        last.data = bytes.into();
    }
    assert!(prime(damaged).unwrap_err().message().contains("checksum"));
    assert!(snapshot().is_err(), "no refused replica was installed");

    prime(encode_state(state.clone().into(), JOB)).expect("a good replica is taken");
    let before = decoded(&snapshot().expect("snapshot"));
    assert!(before == decoded(&state));

    // A step for another job, and a step the replica is not at.
    let sampler = Sampler::new(data.len(), 32, SEED);
    let begin = |step: u64| pb::BeginStepRequest {
        job: JOB.into(),
        step,
        samples: sampler.batch(step),
        split: pb::Split::Train as i32,
        grad_scale: 1.0 / 32.0,
        micro_batch: 0,
    };
    let step = |job: &str, step: u64| {
        let req = pb::ResidentStepRequest { job: job.into(), step, reduce: true, begin: Some(begin(step)) };
        call(&|mut c| {
            let req = req.clone();
            rt.block_on(async move {
                match c.step(req).await {
                    Err(s) => s,
                    Ok(r) => {
                        let mut r = r.into_inner();
                        loop {
                            match r.message().await {
                                Err(s) => return s,
                                Ok(None) => return tonic::Status::ok("completed"),
                                Ok(Some(_)) => {}
                            }
                        }
                    }
                }
            })
        })
    };
    assert!(step("other-job", 0).message().contains("job 'other-job'"));
    assert!(step(JOB, 7).message().contains("replica of step 0"));
    assert!(decoded(&snapshot().expect("snapshot")) == before, "refused steps change nothing");

    // Gradients from another job, of the wrong shape, or for another step.
    let grads = |len: usize| vec![LayerGrad { layer: 1, weights: vec![0.1; len], bias: vec![0.0; 10] }];
    let apply = |job: &str, at: u64, g: Vec<LayerGrad>| {
        let mut chunks = encode_grads(g);
        chunks[0].job = job.into();
        chunks[0].step = at;
        let mut c = client.clone();
        rt.block_on(async move { c.apply(tokio_stream::iter(chunks)).await.map(|_| ()) })
    };
    let weights = match coordinator.forward_stream(1).expect("layer 1").weights {
        WeightPayload::Dense(v) | WeightPayload::Sparse { values: v, .. } => v.len(),
        _ => unreachable!("layer 1 has values"),
    };
    assert!(apply("other-job", 0, grads(weights)).unwrap_err().message().contains("job 'other-job'"));
    assert!(apply(JOB, 0, grads(3)).unwrap_err().message().contains("3 weight"));
    assert!(apply(JOB, 5, grads(weights)).unwrap_err().message().contains("step 5"));
    assert!(decoded(&snapshot().expect("snapshot")) == before, "refused gradients change nothing");
    assert_eq!(step(JOB, 0).code(), tonic::Code::Ok, "a good step still runs");
    let after = decoded(&snapshot().expect("snapshot"));
    assert!(after.0 == 1 && after.1 != before.1, "and it trains the replica");
}

/// A `BeginStep` for more samples than the engine's shard of the plan's batch is refused before the engine
/// gathers a single one (a client with the job's identity still cannot make it allocate beyond the plan); one
/// within the shard goes through.
#[test]
fn a_step_larger_than_the_shard_is_refused_before_anything_is_gathered() {
    use runtime::protocol::pb::stage_server::Stage;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let data = data();
    let server =
        EngineServer::new(JOB.into(), limits(16), engine(), Arc::new(LocalFeed::new(data.clone(), data.clone())));
    let begin = |n: usize| pb::BeginStepRequest {
        job: JOB.into(),
        step: 0,
        samples: (0..n as u32).collect(),
        split: pb::Split::Train as i32,
        grad_scale: 1.0,
        micro_batch: 0,
    };
    // Two million indices: what one 8 MiB message can carry, and ~6 GB of images if gathered.
    let err = rt.block_on(server.begin_step(tonic::Request::new(begin(2_000_000)))).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("shard of the batch) is 2000000, beyond the 16"), "{}", err.message());
    assert!(server.stats_if_free().is_some_and(|s| s.peak_sram_bytes == 0), "nothing was held for the refused step");
    rt.block_on(server.begin_step(tonic::Request::new(begin(16)))).expect("a step within the shard");
}

/// An engine whose `begin_step` keeps the engine until the test lets it go, as a pipelined step keeps it for
/// the whole step.
struct Held {
    inner: Box<dyn EngineRole>,
    began: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl EngineRole for Held {
    fn begin_step(&mut self, shard: data::shard::Shard, work: runtime::engine::role::ShardWork) -> errors::Result<()> {
        let _ = self.began.send(());
        let _ = self.release.recv_timeout(Duration::from_secs(60));
        self.inner.begin_step(shard, work)
    }
    fn forward(&mut self, stream: &runtime::protocol::LayerStream) -> errors::Result<()> {
        self.inner.forward(stream)
    }
    fn loss(&mut self) -> errors::Result<runtime::model::loss::LossSum> {
        self.inner.loss()
    }
    fn backward(&mut self, stream: &runtime::protocol::LayerStream) -> errors::Result<LayerGrad> {
        self.inner.backward(stream)
    }
    fn stats(&self) -> runtime::engine::role::EngineStats {
        self.inner.stats()
    }
}

/// The engine's counters never make an async worker wait for the engine: while a computation holds it,
/// `stats_if_free` answers at once with nothing (an async worker waiting there stopped the engine process
/// answering its health checks through a pipelined step, and the local appliance stopped the run as frozen);
/// once the engine is free the counters come back, and the `Stats` call waits for them off the async workers.
#[test]
fn the_counters_never_wait_for_a_busy_engine() {
    use runtime::protocol::pb::stage_server::Stage;
    // One async worker: a task that blocked it would stop every other.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let data = data();
    let ((began_tx, began), (release, release_rx)) = (std::sync::mpsc::channel(), std::sync::mpsc::channel());
    let held = Held { inner: engine(), began: began_tx, release: release_rx };
    let server = Arc::new(EngineServer::new(
        JOB.into(),
        limits(16),
        Box::new(held),
        Arc::new(LocalFeed::new(data.clone(), data.clone())),
    ));
    let begin = pb::BeginStepRequest {
        job: JOB.into(),
        step: 0,
        samples: (0..8).collect(),
        split: pb::Split::Train as i32,
        grad_scale: 1.0,
        micro_batch: 0,
    };
    let busy = rt.spawn({
        let server = server.clone();
        async move { server.begin_step(tonic::Request::new(begin)).await }
    });
    began.recv_timeout(Duration::from_secs(60)).expect("the step began");
    assert!(server.stats_if_free().is_none(), "the engine is held: no counters, and no wait");
    let stats = rt.spawn({
        let server = server.clone();
        async move { server.stats(tonic::Request::new(pb::StatsRequest { job: JOB.into() })).await }
    });
    // The worker stays free while `Stats` waits: another task still runs on it.
    let other = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), tokio::spawn(async { 7 })).await });
    assert_eq!(other.expect("the worker answered").expect("task"), 7);
    release.send(()).expect("the engine waits");
    rt.block_on(busy).expect("task").expect("the step begins once let go");
    let reply = rt.block_on(stats).expect("task").expect("the counters once free").into_inner();
    assert_eq!(reply.engines.len(), 1);
    assert!(server.stats_if_free().is_some(), "free: the counters");
}
