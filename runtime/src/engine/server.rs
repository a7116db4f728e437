//! An engine on the network: the `Stage` gRPC service in front of one engine program. Layers arrive as
//! concurrent streams — the next one is received into a buffer (the prefetch) while the current one computes —
//! and are computed strictly in the order of the step: forward 1..L, loss, backward L..1. On the network the layer
//! calls are read from HTTP/2's frames ([`crate::protocol::direct`]); tonic's generated path reads the same.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use super::replica::{ReplicaFactory, apply_all, resident_pass};
use super::role::{EngineRole, EngineStats, ShardWork};
use crate::input::Feed;
use crate::memoryx::checkpoint;
use crate::memoryx::store::MemoryX;
use crate::protocol::codec::chunk::Recycled;
use crate::protocol::codec::grad::receive_grads;
use crate::protocol::codec::grad::{decode_grads, encode_grad_owned};
use crate::protocol::codec::layer::LayerAssembler;
use crate::protocol::codec::state::{StateMeter, encode_state};
use crate::protocol::codec::step::encode_step;
use crate::protocol::direct::{Chunks, LayerCalls, assemble};
use crate::protocol::pb::stage_server::Stage;
use crate::protocol::pb::{
    self, Ack, BeginStepRequest, GradChunk, InfoReply, InfoRequest, LayerChunk, ResidentStepRequest, SnapshotRequest,
    StateChunk, StepChunk,
};
use crate::protocol::{LayerStream, Pass};
use errors::{Error, Result};
use kernels::on_workers;
use plan::limits::Limits;
use wire::grpc::JobGuard;
use wire::status::to_status;

/// Where the engine is in its step: which step (and which attempt at it), and how many of its operations
/// (forward layers, loss, backward layers) are done.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Turn {
    step: u64,
    attempt: u64,
    done: usize,
}

/// The `Stage` service of one engine.
pub struct EngineServer {
    job: JobGuard,
    layers: usize,
    engine: Arc<Mutex<Box<dyn EngineRole>>>,
    /// Where the samples of a step come from: the engine's input workers.
    feed: Arc<dyn Feed>,
    turn: watch::Sender<Turn>,
    /// Pipelined execution: the whole model held on the engine, and how to make one.
    replica: Arc<Mutex<Option<MemoryX>>>,
    make_replica: Option<ReplicaFactory>,
    /// Time spent running the optimizer on the replica: engine work, counted as compute.
    update_nanos: Arc<AtomicU64>,
    /// What the plan lets one message make this engine hold: its shard of the batch (a `BeginStep` for more is
    /// refused before anything is gathered for it), each layer's shape (bounding every stream and gradient),
    /// the model's state (bounding a `Prime`).
    limits: Arc<Limits>,
    /// The value buffers of layers computed, for the next layers received.
    recycled: Arc<Recycled>,
}

impl EngineServer {
    /// Serves `engine` for `job`, taking each step's samples from `feed`, and refusing anything beyond the
    /// job's `limits` (whose layers are the model the engine runs).
    pub fn new(job: String, limits: Limits, engine: Box<dyn EngineRole>, feed: Arc<dyn Feed>) -> Self {
        EngineServer {
            job: JobGuard::new(job, "an engine"),
            layers: limits.layers.len(),
            engine: Arc::new(Mutex::new(engine)),
            feed,
            turn: watch::channel(Turn::default()).0,
            replica: Arc::new(Mutex::new(None)),
            make_replica: None,
            update_nanos: Arc::new(AtomicU64::new(0)),
            limits: Arc::new(limits),
            recycled: Arc::default(),
        }
    }

    /// Lets the engine hold the whole model for pipelined execution, building its replicas with `make`.
    pub fn with_replicas(mut self, make: ReplicaFactory) -> Self {
        self.make_replica = Some(make);
        self
    }

    /// Counters of the engine for this process's metrics, or `None` while a computation holds the engine (a
    /// pipelined step holds it for the whole step). Async code calls it: an async worker waiting on the
    /// engine's lock stopped the process answering anything else, its health checks among them, and the local
    /// appliance's watchdog stopped a pipelined ~100M run as frozen.
    pub fn stats_if_free(&self) -> Option<EngineStats> {
        let engine = self.engine.try_lock().ok()?;
        Some(with_updates(engine.stats(), &self.update_nanos))
    }

    /// Counters of the engine once it is free, waited for off the async threads.
    async fn stats_when_free(&self) -> Result<EngineStats, Status> {
        let (engine, nanos) = (self.engine.clone(), self.update_nanos.clone());
        tokio::task::spawn_blocking(move || {
            let engine = engine.lock().map_err(|_| Status::internal("engine state poisoned"))?;
            Ok(with_updates(engine.stats(), &nanos))
        })
        .await
        .map_err(|e| Status::internal(format!("engine task failed: {e}")))?
    }

    /// Waits until operation `op` of `step` is next, so concurrently received layers compute in order.
    async fn wait_turn(&self, step: u64, op: usize) -> Result<Turn, Status> {
        let mut rx = self.turn.subscribe();
        let attempt = rx.borrow().attempt;
        loop {
            let now = *rx.borrow_and_update();
            if now.step != step || now.attempt != attempt {
                return Err(Status::aborted(format!(
                    "step {step} was superseded by step {} (attempt {})",
                    now.step, now.attempt
                )));
            }
            if now.done == op {
                return Ok(now);
            }
            if now.done > op {
                return Err(Status::invalid_argument(format!("operation {op} of step {step} arrived twice")));
            }
            rx.changed().await.map_err(|_| Status::unavailable("engine shutting down"))?;
        }
    }

    /// Runs `f` on the engine over a received layer (on [`on_workers`]), then gives the layer's buffer back for
    /// the next one received.
    async fn compute_layer<T: Send + 'static>(
        &self,
        turn: Turn,
        stream: LayerStream,
        f: impl FnOnce(&mut dyn EngineRole, &LayerStream) -> Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let recycled = self.recycled.clone();
        self.compute(turn, move |e| {
            let done = on_workers(|| f(e, &stream));
            recycled.give(stream.weights.into_values());
            done
        })
        .await
    }

    /// Runs `f` on the engine off the async threads, then lets the next operation go. `f` runs on a blocking
    /// thread holding the engine's lock. It takes any lock other handlers take too (the replica's) there, and
    /// only then hands its arithmetic to [`on_workers`] (see its rules).
    async fn compute<T: Send + 'static>(
        &self,
        turn: Turn,
        f: impl FnOnce(&mut dyn EngineRole) -> Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.engine.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut guard = engine.lock().map_err(|_| Error::Protocol("engine state poisoned".into()))?;
            f(guard.as_mut())
        })
        .await
        .map_err(|e| Status::internal(format!("engine task failed: {e}")))?;
        self.turn.send_if_modified(|t| {
            let same = t.step == turn.step && t.attempt == turn.attempt;
            if same {
                t.done += 1;
            }
            same
        });
        result.map_err(to_status)
    }

    /// Starts step `r.step` on this engine's share of the batch.
    async fn begin(&self, r: BeginStepRequest) -> Result<(), Status> {
        self.job.check(&r.job)?;
        let split = match pb::Split::try_from(r.split) {
            Ok(pb::Split::Train) => data::shard::Split::Train,
            Ok(pb::Split::Test) => data::shard::Split::Test,
            Err(_) => return Err(Status::invalid_argument(format!("unknown split {}", r.split))),
        };
        let train = split == data::shard::Split::Train;
        Error::check_limit(
            || "the samples of a BeginStep (an engine's shard of the batch)".into(),
            r.samples.len() as u64,
            self.limits.samples(1),
        )
        .map_err(to_status)?;
        let (engine, feed) = (self.engine.clone(), self.feed.clone());
        let work = ShardWork { grad_scale: r.grad_scale, train, micro_batch: r.micro_batch as usize };
        let samples = r.samples;
        tokio::task::spawn_blocking(move || {
            let shard = feed.shard(split, &samples)?;
            engine.lock().map_err(|_| Error::Protocol("engine state poisoned".into()))?.begin_step(shard, work)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(to_status)?;
        self.turn.send_modify(|t| *t = Turn { step: r.step, attempt: t.attempt + 1, done: 0 });
        Ok(())
    }

    async fn receive(&self, chunks: Chunks) -> Result<(u64, LayerStream), Status> {
        assemble(chunks, LayerAssembler::recycling(self.recycled.clone()), self.job.job(), &self.limits).await
    }
}

impl LayerCalls for EngineServer {
    async fn forward_layer(&self, chunks: Chunks) -> Result<(), Status> {
        let (step, stream) = self.receive(chunks).await?;
        if stream.pass != Pass::Forward || stream.layer >= self.layers {
            return Err(Status::invalid_argument(format!(
                "forward call carried layer {} ({:?} pass)",
                stream.layer, stream.pass
            )));
        }
        let turn = self.wait_turn(step, stream.layer).await?;
        self.compute_layer(turn, stream, |e, s| e.forward(s)).await?;
        Ok(())
    }

    async fn backward_layer(&self, chunks: Chunks) -> Result<Vec<GradChunk>, Status> {
        let (step, stream) = self.receive(chunks).await?;
        if stream.pass != Pass::Backward || stream.layer >= self.layers {
            return Err(Status::invalid_argument(format!(
                "backward call carried layer {} ({:?} pass)",
                stream.layer, stream.pass
            )));
        }
        let op = self.layers + 1 + (self.layers - 1 - stream.layer);
        let turn = self.wait_turn(step, op).await?;
        let grad = self.compute_layer(turn, stream, |e, s| e.backward(s)).await?;
        Ok(encode_grad_owned(grad))
    }
}

type GradStream = Pin<Box<dyn Stream<Item = Result<GradChunk, Status>> + Send>>;
type StateStream = Pin<Box<dyn Stream<Item = Result<StateChunk, Status>> + Send>>;
type StepChunkStream = Pin<Box<dyn Stream<Item = Result<StepChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Stage for EngineServer {
    async fn info(&self, request: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        self.job.check(&request.get_ref().job)?;
        let sram_bytes = self.stats_when_free().await?.sram_bytes;
        Ok(Response::new(InfoReply { job: self.job.job().to_string(), engines: 1, sram_bytes }))
    }

    async fn begin_step(&self, request: Request<BeginStepRequest>) -> Result<Response<Ack>, Status> {
        self.begin(request.into_inner()).await?;
        Ok(Response::new(Ack {}))
    }

    async fn forward(&self, request: Request<Streaming<LayerChunk>>) -> Result<Response<Ack>, Status> {
        self.forward_layer(Box::pin(request.into_inner())).await.map(|()| Response::new(Ack {}))
    }

    async fn loss(&self, request: Request<pb::LossRequest>) -> Result<Response<pb::LossReply>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let turn = self.wait_turn(r.step, self.layers).await?;
        let sum = self.compute(turn, |e| on_workers(|| e.loss())).await?;
        Ok(Response::new(sum.into()))
    }

    type BackwardStream = GradStream;

    async fn backward(&self, request: Request<Streaming<LayerChunk>>) -> Result<Response<GradStream>, Status> {
        let grads = self.backward_layer(Box::pin(request.into_inner())).await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(grads.into_iter().map(Ok)))))
    }

    async fn stats(&self, request: Request<pb::StatsRequest>) -> Result<Response<pb::StatsReply>, Status> {
        self.job.check(&request.get_ref().job)?;
        let s = self.stats_when_free().await?;
        Ok(Response::new(pb::StatsReply { engines: vec![stats_to_pb(&s)] }))
    }

    async fn prime(&self, request: Request<Streaming<StateChunk>>) -> Result<Response<Ack>, Status> {
        let make = self.make_replica.clone().ok_or_else(|| {
            Status::failed_precondition("this engine was started without room for a replica (pipelined execution)")
        })?;
        let mut stream = request.into_inner();
        let mut meter = StateMeter::new(&self.limits);
        let mut bytes = Vec::new();
        while let Some(c) = stream.message().await? {
            meter.check(&c, self.job.job()).map_err(to_status)?;
            bytes.extend_from_slice(&c.data);
        }
        if !meter.done() {
            return Err(to_status(Error::Protocol(
                "the replica's state is truncated: its last chunk never came".into(),
            )));
        }
        let (replica, engine) = (self.replica.clone(), self.engine.clone());
        tokio::task::spawn_blocking(move || {
            let (step, tensors) = checkpoint::from_bytes(&bytes, "the replica sent to this engine")?;
            let store = make()?;
            store.restore(step, &tensors)?;
            *replica.lock().map_err(|_| Error::Protocol("replica poisoned".into()))? = Some(store);
            engine.lock().map_err(|_| Error::Protocol("engine state poisoned".into()))?.set_resident(true);
            Ok::<_, Error>(())
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(to_status)?;
        Ok(Response::new(Ack {}))
    }

    type SnapshotStream = StateStream;

    async fn snapshot(&self, request: Request<SnapshotRequest>) -> Result<Response<StateStream>, Status> {
        self.job.check(&request.get_ref().job)?;
        let (replica, job) = (self.replica.clone(), self.job.job().to_string());
        let chunks = tokio::task::spawn_blocking(move || {
            let guard = replica.lock().map_err(|_| Error::Protocol("replica poisoned".into()))?;
            let store = guard.as_ref().ok_or_else(|| Error::Protocol("this engine holds no replica".into()))?;
            let (step, tensors) = store.snapshot()?;
            Ok::<_, Error>(encode_state(checkpoint::to_bytes(step, &tensors, &job)?.into(), &job))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks.into_iter().map(Ok)))))
    }

    type StepStream = StepChunkStream;

    async fn step(&self, request: Request<ResidentStepRequest>) -> Result<Response<StepChunkStream>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        if let Some(begin) = r.begin.clone() {
            self.begin(begin).await?;
        }
        let turn = self.wait_turn(r.step, 0).await?;
        let (replica, layers, nanos) = (self.replica.clone(), self.layers, self.update_nanos.clone());
        let (step, reduce) = (r.step, r.reduce);
        let (loss, grads) = self
            .compute(turn, move |e| {
                let guard = replica.lock().map_err(|_| Error::Protocol("replica poisoned".into()))?;
                let store = guard.as_ref().ok_or_else(no_replica)?;
                if store.step() != step {
                    return Err(Error::Protocol(format!("step {step} asked of a replica of step {}", store.step())));
                }
                let (loss, grads) = resident_pass(e, store, layers)?;
                if !reduce {
                    return Ok((loss, grads));
                }
                // Alone at the top of the tree: its own gradients are the sum.
                let started = Instant::now();
                apply_all(store, &grads, step)?;
                nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok((loss, Vec::new()))
            })
            .await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(encode_step(loss.into(), grads).into_iter().map(Ok)))))
    }

    async fn apply(&self, request: Request<Streaming<GradChunk>>) -> Result<Response<Ack>, Status> {
        let chunks = receive_grads(request.into_inner(), self.job.job(), &self.limits).await?;
        let step = chunks.first().map_or(0, |c| c.step);
        let grads = decode_grads(chunks, &self.limits).map_err(to_status)?;
        let (replica, nanos) = (self.replica.clone(), self.update_nanos.clone());
        tokio::task::spawn_blocking(move || {
            let guard = replica.lock().map_err(|_| Error::Protocol("replica poisoned".into()))?;
            let store = guard.as_ref().ok_or_else(no_replica)?;
            let started = Instant::now();
            apply_all(store, &grads, step)?;
            nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            Ok::<_, Error>(())
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(to_status)?;
        Ok(Response::new(Ack {}))
    }
}

/// `stats` with the time the optimizer ran on the replica counted as compute.
fn with_updates(mut stats: EngineStats, update_nanos: &AtomicU64) -> EngineStats {
    stats.compute_s += update_nanos.load(Ordering::Relaxed) as f64 * 1e-9;
    stats
}

/// A step or an update reached an engine without a replica: it was replaced (its pod restarted) since the
/// fabric primed it. That is a lost component, like a dropped connection, so it is [`Error::Unavailable`]: the
/// training loop takes the state back from a surviving replica (or MemoryX), primes every engine again and
/// reruns the step, where a refusal would have failed the job.
fn no_replica() -> Error {
    Error::Unavailable("this engine holds no replica (it was replaced since it was primed): prime it again".into())
}

/// Engine counters as they travel.
pub fn stats_to_pb(s: &EngineStats) -> pb::EngineStats {
    pb::EngineStats {
        bytes_received: s.counters.bytes_received,
        bytes_sent: s.counters.bytes_sent,
        dense_equivalent_flops: s.counters.dense_equivalent_flops,
        flops: s.counters.flops,
        simulated_s: s.counters.simulated_s,
        peak_sram_bytes: s.peak_sram_bytes,
        sram_bytes: s.sram_bytes,
        compute_s: s.compute_s,
    }
}

/// Engine counters as they arrive.
pub fn stats_from_pb(s: &pb::EngineStats) -> EngineStats {
    EngineStats {
        counters: super::hw::EngineCounters {
            bytes_received: s.bytes_received,
            bytes_sent: s.bytes_sent,
            dense_equivalent_flops: s.dense_equivalent_flops,
            flops: s.flops,
            simulated_s: s.simulated_s,
        },
        peak_sram_bytes: s.peak_sram_bytes,
        sram_bytes: s.sram_bytes,
        compute_s: s.compute_s,
    }
}
