//! Bounded input: a client holding the job's own identity still cannot make a role allocate beyond the job's
//! plan. The real engine server and a real SwarmX node over it run in this process on loopback, and a client of
//! the same job sends each role what the plan does not allow — a `BeginStep` of 8 million samples, layer and
//! gradient streams whose header announces `u64::MAX` values and then keep sending, a stream that keeps going
//! past what its header announced, an oversized `Prime` — and MemoryX is given checkpoint files larger than the
//! model's state or with an absurd header. Each gets its clear refusal (code and message), the role answers the
//! next legitimate call, and the process's peak resident memory grows by less than 100 MB for each.
//!
//! The servers run in the test's own process rather than as separate programs: the roles are exactly the
//! objects the programs serve (`EngineServer`, `Relay`, `transport::serve_stage`), no job manifest or data copy
//! is needed, and the measurement is conservative — the client's own buffers (up to 8 MiB per message it
//! encodes) are counted with the servers'. Peak memory is measured per case by resetting the kernel's
//! high-water mark (`/proc/self/clear_refs`, value 5) and reading `VmHWM` after the case against `VmRSS`
//! before it; so that no other test's allocations are counted, this file has a single test and the cases run in
//! turn.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
mod common;
// The client holds the job's own identity: the limits, not the credentials, must refuse.
use common::{identity, layout, store};
use data::{Dataset, mnist};
use plan::limits::Limits;
use runtime::engine::hw::CountingHw;
use runtime::engine::server::EngineServer;
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::checkpoint;
use runtime::memoryx::store::WeightStore;
use runtime::protocol::codec::layer::encode_layer;
use runtime::protocol::codec::state::encode_state;
use runtime::protocol::pb::{self, stage_client::StageClient};
use runtime::swarmx::relay::{Relay, connect};
use tonic::transport::Channel;
use tonic::{Code, Status};
use wire::grpc::Dial;

const JOB: &str = "bounded-test";
/// Samples per engine per step: the plan's shard.
const SHARD: usize = 64;
/// What each case may grow the process's resident memory by.
const BUDGET: u64 = 100 << 20;
/// How long any one call may take: a refusal comes at the first chunk, so this is only a backstop.
const CALL_DEADLINE: Duration = Duration::from_secs(120);
/// Chunks an endless stream sends at most (1 MiB each): far beyond the budget, so a role that kept them would
/// fail the memory check rather than the test hanging.
const ENDLESS: usize = 512;

fn limits() -> Limits {
    Limits::new(&layout(), SHARD, 2)
}

/// The job's roles on loopback and a client of each: one engine with room for a replica, and a SwarmX node
/// over it; and a second SwarmX node over two children that answer with replies beyond the plan (a peer of the
/// job turned hostile), so a node is seen to bound what comes back up the tree too. The one place servers are
/// started and clients connected, so a change of transport (identities) is made here alone.
struct Appliance {
    engine: StageClient<Channel>,
    swarmx: StageClient<Channel>,
    over_liars: StageClient<Channel>,
    /// A SwarmX node over one hostile child: it passes the child's gradient up as it comes, unsummed.
    over_liar: StageClient<Channel>,
}

/// Serves `stage` over mutual TLS on a loopback port; its URL.
async fn serve<S: pb::stage_server::Stage>(stage: S) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { runtime::protocol::serve_stage(Arc::new(stage), listener, identity()).await });
    url
}

fn appliance(rt: &tokio::runtime::Runtime) -> Appliance {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/mnist");
    let data = Arc::new(Dataset::Images(mnist::load(&path, mnist::Split::Train).expect("the shipped digits load")));
    let engine = Box::new(Wse::new("engine-0", layout(), CountingHw::new(1 << 30)));
    let server = EngineServer::new(JOB.into(), limits(), engine, Arc::new(LocalFeed::new(data.clone(), data)))
        .with_replicas(Arc::new(|| Ok(store())));
    rt.block_on(async {
        let engine_url = serve(server).await;
        let child = connect(&engine_url, JOB, Dial::new(identity(), Duration::from_secs(10)))
            .await
            .expect("connect to the engine");
        let engine = child.client.clone();
        let swarmx_url = serve(Relay::new(JOB.into(), vec![child], limits())).await;
        let swarmx = connect(&swarmx_url, JOB, Dial::new(identity(), Duration::from_secs(10)))
            .await
            .expect("connect to SwarmX")
            .client;
        let liar_url = serve(Liar).await;
        let mut liars = Vec::new();
        for _ in 0..2 {
            liars.push(
                connect(&liar_url, JOB, Dial::new(identity(), Duration::from_secs(10)))
                    .await
                    .expect("connect to the liar"),
            );
        }
        let one = vec![liars[0].clone()];
        let over_url = serve(Relay::new(JOB.into(), liars, limits())).await;
        let over_liars = connect(&over_url, JOB, Dial::new(identity(), Duration::from_secs(10)))
            .await
            .expect("connect to SwarmX")
            .client;
        let over_one_url = serve(Relay::new(JOB.into(), one, limits())).await;
        let over_liar = connect(&over_one_url, JOB, Dial::new(identity(), Duration::from_secs(10)))
            .await
            .expect("connect to SwarmX")
            .client;
        Appliance { engine, swarmx, over_liars, over_liar }
    })
}

/// A child that answers every call that streams back with a stream beyond the plan: gradients announcing
/// `u64::MAX` values and then sent on, a replica that never ends.
struct Liar;

type Reply<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl pb::stage_server::Stage for Liar {
    async fn info(&self, _: tonic::Request<pb::InfoRequest>) -> Result<tonic::Response<pb::InfoReply>, Status> {
        Ok(tonic::Response::new(pb::InfoReply { job: JOB.into(), engines: 1, sram_bytes: 1 << 30 }))
    }
    async fn begin_step(&self, _: tonic::Request<pb::BeginStepRequest>) -> Result<tonic::Response<pb::Ack>, Status> {
        Ok(tonic::Response::new(pb::Ack {}))
    }
    async fn forward(
        &self,
        _: tonic::Request<tonic::Streaming<pb::LayerChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        Ok(tonic::Response::new(pb::Ack {}))
    }
    async fn loss(&self, _: tonic::Request<pb::LossRequest>) -> Result<tonic::Response<pb::LossReply>, Status> {
        Ok(tonic::Response::new(pb::LossReply::default()))
    }
    type BackwardStream = Reply<pb::GradChunk>;
    async fn backward(
        &self,
        _: tonic::Request<tonic::Streaming<pb::LayerChunk>>,
    ) -> Result<tonic::Response<Self::BackwardStream>, Status> {
        Ok(tonic::Response::new(Box::pin(futures::StreamExt::map(endless_grads(), Ok))))
    }
    async fn stats(&self, _: tonic::Request<pb::StatsRequest>) -> Result<tonic::Response<pb::StatsReply>, Status> {
        Ok(tonic::Response::new(pb::StatsReply::default()))
    }
    async fn prime(
        &self,
        _: tonic::Request<tonic::Streaming<pb::StateChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        Ok(tonic::Response::new(pb::Ack {}))
    }
    type SnapshotStream = Reply<pb::StateChunk>;
    async fn snapshot(
        &self,
        _: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, Status> {
        Ok(tonic::Response::new(Box::pin(futures::StreamExt::map(endless_state(), Ok))))
    }
    type StepStream = Reply<pb::StepChunk>;
    async fn step(
        &self,
        _: tonic::Request<pb::ResidentStepRequest>,
    ) -> Result<tonic::Response<Self::StepStream>, Status> {
        let loss = pb::StepChunk { loss: Some(pb::LossReply::default()), grad: None };
        let grads = futures::StreamExt::map(endless_grads(), |g| pb::StepChunk { loss: None, grad: Some(g) });
        Ok(tonic::Response::new(Box::pin(futures::StreamExt::map(
            futures::StreamExt::chain(tokio_stream::iter([loss]), grads),
            Ok,
        ))))
    }
    async fn apply(
        &self,
        _: tonic::Request<tonic::Streaming<pb::GradChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        Ok(tonic::Response::new(pb::Ack {}))
    }
}

/// A field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line =
        status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a size in kB");
    kb << 10
}

/// Runs `case` and returns its result with how far it raised the process's peak resident memory above what was
/// resident before it. When the kernel refuses to reset the high-water mark, an earlier, higher peak is counted
/// against the case: the measure can only err on the side of failing.
fn peak_growth<T>(case: impl FnOnce() -> T) -> (T, u64) {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmRSS:");
    let out = case();
    (out, status_bytes("VmHWM:").saturating_sub(before))
}

/// Asserts a refusal: its code, and that its message says what was refused.
fn refused(what: &str, got: Result<(), Status>, code: Code, says: &str) {
    let status = got.expect_err(what);
    assert_eq!(status.code(), code, "{what}: {}", status.message());
    assert!(status.message().contains(says), "{what}: '{}' does not say '{says}'", status.message());
}

fn begin(samples: Vec<u32>) -> pb::BeginStepRequest {
    pb::BeginStepRequest {
        job: JOB.into(),
        step: 0,
        samples,
        split: pb::Split::Train as i32,
        grad_scale: 1.0,
        micro_batch: 0,
    }
}

/// A layer stream whose header announces `values_len` values of layer 0 and which then keeps sending values,
/// 1 MiB a chunk, sharing one buffer (so the client holds one chunk at a time).
fn endless_layer(values_len: u64) -> impl futures::Stream<Item = pb::LayerChunk> + Send + 'static {
    let piece = Bytes::from(vec![0u8; 1 << 20]);
    let header = pb::LayerChunk {
        job: JOB.into(),
        layer: 0,
        pass: pb::Pass::Forward as i32,
        encoding: pb::Encoding::Dense as i32,
        first: true,
        values_len,
        bias_len: 32,
        ..pb::LayerChunk::default()
    };
    let body = (0..ENDLESS).map(move |_| pb::LayerChunk {
        job: JOB.into(),
        values: piece.clone(),
        ..pb::LayerChunk::default()
    });
    tokio_stream::iter(std::iter::once(header).chain(body))
}

/// An `Apply` stream whose first chunk announces `u64::MAX` weights of layer 1 and which then keeps sending.
fn endless_grads() -> impl futures::Stream<Item = pb::GradChunk> + Send + 'static {
    let piece = Bytes::from(vec![0u8; 1 << 20]);
    let header = pb::GradChunk {
        layer: 1,
        first: true,
        weights_len: u64::MAX,
        bias_len: 10,
        job: JOB.into(),
        ..pb::GradChunk::default()
    };
    let body =
        (0..ENDLESS).map(move |_| pb::GradChunk { layer: 1, weights: piece.clone(), ..pb::GradChunk::default() });
    tokio_stream::iter(std::iter::once(header).chain(body))
}

/// A `Prime` that never ends: 1 MiB of state a chunk, far past the model's state.
fn endless_state() -> impl futures::Stream<Item = pb::StateChunk> + Send + 'static {
    let piece = Bytes::from(vec![0u8; 1 << 20]);
    tokio_stream::iter((0..ENDLESS).map(move |_| pb::StateChunk { job: JOB.into(), data: piece.clone(), last: false }))
}

#[test]
fn no_message_or_file_makes_a_role_allocate_beyond_the_plan() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let roles = appliance(&rt);
    let limits = limits();
    let state_limit = limits.state_bytes();
    let call = |f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Status>> + Send>>| {
        rt.block_on(async {
            tokio::time::timeout(CALL_DEADLINE, f).await.unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer")))
        })
    };
    // The next legitimate call each role must still answer.
    let healthy = |who: &str, client: &StageClient<Channel>| {
        let mut c = client.clone();
        let ok = call(Box::pin(async move { c.begin_step(begin((0..SHARD as u32).collect())).await.map(|_| ()) }));
        ok.unwrap_or_else(|s| panic!("{who} refused a legitimate step after the attack: {}", s.message()));
    };
    let mut report = Vec::new();
    let roles_of = [("engine", roles.engine.clone()), ("swarmx", roles.swarmx.clone())];

    // A BeginStep of 8 million samples: index 0 encodes in one byte, so it fits one 8 MiB message and reaches
    // the role; the role refuses it against its shard (the SwarmX node against the shards of its engines)
    // before gathering or splitting anything.
    let eight_million = vec![0u32; 8_000_000];
    for (who, client) in &roles_of {
        // The request is built before the measure: it is the client's, not the role's.
        let (mut c, request) = (client.clone(), begin(eight_million.clone()));
        let (got, growth) = peak_growth(|| call(Box::pin(async move { c.begin_step(request).await.map(|_| ()) })));
        refused(&format!("{who}: BeginStep of 8M samples"), got, Code::ResourceExhausted, "is 8000000, beyond the 64");
        healthy(who, client);
        report.push((format!("{who}: BeginStep of 8,000,000 samples"), growth));
    }
    drop(eight_million);

    // A layer stream announcing u64::MAX values, then sending on: refused at its header.
    for (who, client) in &roles_of {
        let (got, growth) = peak_growth(|| {
            let mut c = client.clone();
            call(Box::pin(async move { c.forward(endless_layer(u64::MAX)).await.map(|_| ()) }))
        });
        refused(
            &format!("{who}: u64::MAX layer"),
            got,
            Code::ResourceExhausted,
            "values_len is 18446744073709551615, beyond the 25088",
        );
        healthy(who, client);
        report.push((format!("{who}: layer stream announcing u64::MAX values"), growth));
    }

    // A layer stream announcing what the layer allows, then sending past it: refused at the first chunk beyond.
    for (who, client) in &roles_of {
        let (got, growth) = peak_growth(|| {
            let mut c = client.clone();
            call(Box::pin(async move { c.forward(endless_layer(784 * 32)).await.map(|_| ()) }))
        });
        refused(&format!("{who}: overlong layer"), got, Code::ResourceExhausted, "beyond what its header announced");
        healthy(who, client);
        report.push((format!("{who}: layer stream sending past its header"), growth));
    }

    // An Apply stream announcing u64::MAX gradient values, then sending on.
    for (who, client) in &roles_of {
        let (got, growth) = peak_growth(|| {
            let mut c = client.clone();
            call(Box::pin(async move { c.apply(endless_grads()).await.map(|_| ()) }))
        });
        refused(
            &format!("{who}: u64::MAX gradients"),
            got,
            Code::ResourceExhausted,
            "weights_len is 18446744073709551615, beyond the 320",
        );
        healthy(who, client);
        report.push((format!("{who}: gradient stream announcing u64::MAX values"), growth));
    }

    // A Prime far larger than the model's state: refused at the first chunk beyond it.
    for (who, client) in &roles_of {
        let (got, growth) = peak_growth(|| {
            let mut c = client.clone();
            call(Box::pin(async move { c.prime(endless_state()).await.map(|_| ()) }))
        });
        refused(&format!("{who}: oversized Prime"), got, Code::ResourceExhausted, &format!("beyond the {state_limit}"));
        healthy(who, client);
        report.push((format!("{who}: Prime of more than the model's state"), growth));
    }
    // Replies beyond the plan coming back up the tree: a SwarmX node refuses them, naming the child, whether it
    // sums its children's gradients or passes its one child's up as they come.
    for (over, node) in [("two children", roles.over_liars.clone()), ("one child", roles.over_liar.clone())] {
        let backward = encode_layer(store().backward_stream(1).expect("layer 1 backward"), JOB, 0);
        let (got, growth) = peak_growth(|| {
            let mut c = node.clone();
            call(Box::pin(async move {
                let mut s = c.backward(tokio_stream::iter(backward)).await?.into_inner();
                while s.message().await?.is_some() {}
                Ok(())
            }))
        });
        refused(
            &format!("swarmx over {over}: u64::MAX gradients from a child"),
            got,
            Code::ResourceExhausted,
            "weights_len is 18446744073709551615, beyond the 320",
        );
        report.push((format!("swarmx over {over}: a child's gradients announcing u64::MAX values"), growth));
    }
    let (got, growth) = peak_growth(|| {
        let mut c = roles.over_liars.clone();
        let request = pb::ResidentStepRequest { job: JOB.into(), step: 0, reduce: true, begin: None };
        call(Box::pin(async move {
            let mut s = c.step(request).await?.into_inner();
            while s.message().await?.is_some() {}
            Ok(())
        }))
    });
    refused(
        "swarmx: endless step reply from a child",
        got,
        Code::ResourceExhausted,
        "weights_len is 18446744073709551615",
    );
    report.push(("swarmx: a child's step reply announcing u64::MAX values".into(), growth));
    let (got, growth) = peak_growth(|| {
        let mut c = roles.over_liars.clone();
        call(Box::pin(async move {
            let mut s = c.snapshot(pb::SnapshotRequest { job: JOB.into() }).await?.into_inner();
            while s.message().await?.is_some() {}
            Ok(())
        }))
    });
    refused("swarmx: endless replica from a child", got, Code::ResourceExhausted, &format!("beyond the {state_limit}"));
    report.push(("swarmx: a child's endless replica".into(), growth));

    // A legitimate Prime still goes through, and its state comes back.
    let state = store().state(JOB).expect("state").1;
    let mut c = roles.swarmx.clone();
    let chunks = encode_state(state.clone().into(), JOB);
    call(Box::pin(async move { c.prime(tokio_stream::iter(chunks)).await.map(|_| ()) })).expect("a legitimate Prime");
    assert!((state.len() as u64) < state_limit, "the model's real state is within its limit");

    // Checkpoint files MemoryX would resume from: one far larger than the model's state (sparse on disk, so
    // only its size is large), one whose header claims an absurd shape. Both are passed over unread.
    let dir = std::env::temp_dir().join(format!("ws-bounded-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("dir");
    let (tensors_step, tensors) = store().snapshot().expect("snapshot");
    checkpoint::write(&dir, tensors_step, &tensors, JOB, 5).expect("a good checkpoint");
    let huge = checkpoint::path_for(&dir, 30);
    std::fs::File::create(&huge).and_then(|f| f.set_len(64 << 30)).expect("a 64 GiB sparse file");
    let absurd = checkpoint::path_for(&dir, 20);
    let header = br#"{"layer.0.weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,64]},"__metadata__":{"step":"20","crc32":"0"}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0u8; 64]);
    std::fs::write(&absurd, bytes).expect("write");
    let (read, growth) = peak_growth(|| checkpoint::read(&huge, state_limit));
    match read {
        Err(errors::Error::OverLimit { what, value, limit }) => {
            assert!(what.contains("step-00000030.safetensors (bytes on disk)"), "{what}");
            assert_eq!((value, limit), (64 << 30, state_limit));
        }
        other => panic!("a 64 GiB checkpoint must be refused by its size: {:?}", other.map(|(s, _)| s)),
    }
    report.push(("memoryx: checkpoint file of 64 GiB".into(), growth));
    let (read, growth) = peak_growth(|| checkpoint::read(&absurd, state_limit));
    assert!(read.expect_err("an absurd shape").to_string().contains("is unusable"));
    report.push(("memoryx: checkpoint header with an absurd shape".into(), growth));
    let (resumed, growth) = peak_growth(|| checkpoint::latest(&dir, state_limit).expect("resume"));
    assert_eq!(resumed.map(|(step, _, _)| step), Some(tensors_step), "both are passed over for the good checkpoint");
    report.push(("memoryx: resume past both".into(), growth));
    std::fs::remove_dir_all(&dir).ok();

    for (case, growth) in &report {
        eprintln!("peak RSS growth {:>7.1} MiB  {case}", *growth as f64 / (1 << 20) as f64);
    }
    for (case, growth) in report {
        assert!(growth < BUDGET, "{case}: resident memory grew by {growth} bytes, over the {BUDGET} budget");
    }
}

/// A stage that answers `Info` (so it can be dialled) and then never finishes a call, while its transport
/// answers every keepalive: what a deadlocked peer looks like.
struct Silent;

async fn never<T>() -> Result<tonic::Response<T>, Status> {
    std::future::pending().await
}

#[tonic::async_trait]
impl pb::stage_server::Stage for Silent {
    async fn info(&self, _: tonic::Request<pb::InfoRequest>) -> Result<tonic::Response<pb::InfoReply>, Status> {
        Ok(tonic::Response::new(pb::InfoReply { job: JOB.into(), engines: 1, sram_bytes: 1 << 30 }))
    }
    async fn begin_step(&self, _: tonic::Request<pb::BeginStepRequest>) -> Result<tonic::Response<pb::Ack>, Status> {
        never().await
    }
    async fn forward(
        &self,
        _: tonic::Request<tonic::Streaming<pb::LayerChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        never().await
    }
    async fn loss(&self, _: tonic::Request<pb::LossRequest>) -> Result<tonic::Response<pb::LossReply>, Status> {
        never().await
    }
    type BackwardStream = Reply<pb::GradChunk>;
    async fn backward(
        &self,
        _: tonic::Request<tonic::Streaming<pb::LayerChunk>>,
    ) -> Result<tonic::Response<Self::BackwardStream>, Status> {
        never().await
    }
    async fn stats(&self, _: tonic::Request<pb::StatsRequest>) -> Result<tonic::Response<pb::StatsReply>, Status> {
        never().await
    }
    async fn prime(
        &self,
        _: tonic::Request<tonic::Streaming<pb::StateChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        never().await
    }
    type SnapshotStream = Reply<pb::StateChunk>;
    async fn snapshot(
        &self,
        _: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, Status> {
        never().await
    }
    type StepStream = Reply<pb::StepChunk>;
    async fn step(
        &self,
        _: tonic::Request<pb::ResidentStepRequest>,
    ) -> Result<tonic::Response<Self::StepStream>, Status> {
        never().await
    }
    async fn apply(
        &self,
        _: tonic::Request<tonic::Streaming<pb::GradChunk>>,
    ) -> Result<tonic::Response<pb::Ack>, Status> {
        never().await
    }
}

/// A peer that keeps answering keepalives but never finishes a call is given up within the call deadline,
/// directly and through a SwarmX node above it, and the error says the deadline passed: the step is rerun or
/// the job fails naming it, instead of waiting for ever. The plan's default deadline grows with the state.
#[test]
fn a_call_that_never_finishes_ends_at_its_deadline() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (direct, through) = rt.block_on(async {
        let dial = Dial::new(identity(), Duration::from_secs(10)).with_call_timeout(Duration::from_secs(2));
        let silent_url = serve(Silent).await;
        let silent = connect(&silent_url, JOB, dial).await.expect("the silent stage answers Info");
        let relay_url = serve(Relay::new(JOB.into(), vec![silent.clone()], limits())).await;
        let relay = connect(&relay_url, JOB, dial.with_call_timeout(Duration::from_secs(20))).await.expect("the relay");
        let started = std::time::Instant::now();
        let direct = silent.client.clone().begin_step(begin(vec![0])).await.map(|_| ());
        let direct = (direct, started.elapsed());
        let started = std::time::Instant::now();
        let through = relay.client.clone().begin_step(begin(vec![0])).await.map(|_| ());
        (direct, (through, started.elapsed()))
    });
    for (what, (result, took)) in [("direct", direct), ("through SwarmX", through)] {
        let status = result.expect_err(what);
        assert!(took < Duration::from_secs(15), "{what}: gave up only after {took:?}");
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled | Code::Unavailable),
            "{what}: {:?} {}",
            status.code(),
            status.message()
        );
    }
    let small = limits();
    assert!(small.call_timeout() >= Duration::from_secs(120));
    let mut big = small.clone();
    big.optimizer_values = 2_000_000;
    assert!(big.call_timeout() > small.call_timeout(), "a larger state gets a longer deadline");
}

/// A peer whose kernel accepts connections but whose process never answers (SIGSTOPped, hung) cannot hold a
/// dialler in its TLS handshake: connecting gives up within its timeout plus one handshake timeout.
#[test]
fn a_peer_that_accepts_but_never_handshakes_is_given_up() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    let started = std::time::Instant::now();
    let got = rt.block_on(connect(&url, JOB, Dial::new(identity(), Duration::from_secs(2))));
    let err = got.err().expect("nobody answered, so nothing connected");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2) + wire::tls::HANDSHAKE_TIMEOUT + Duration::from_secs(5), "took {took:?}");
    assert!(err.to_string().contains(&url), "{err}");
    drop(listener);
}
