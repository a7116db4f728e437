//! SwarmX: the fabric between MemoryX and the engines. It broadcasts each streamed layer to every engine and
//! sums what comes back — gradients and loss reports — so MemoryX and the training loop see one engine
//! however many CS-2s the job uses.
//!
//! [`LocalSwarm`] holds its engines in this process; `relay` is a SwarmX node on the network whose children
//! are engines or further SwarmX nodes, and `remote` is the client the training loop uses to reach one.
//! [`stream`] is a step's layers streamed from MemoryX through a fabric; [`streamer`] the SwarmX root that
//! streams them straight from the weight servers, so MemoryX's bytes do not pass through its coordinator, and
//! [`direct`] the coordinator's client of it.

pub mod direct;
pub mod node;
pub mod relay;
pub mod remote;
pub mod stream;
pub mod streamer;

use std::sync::Arc;

use crate::engine::replica::{ReplicaFactory, apply_all, resident_pass};
use crate::engine::role::{EngineRole, EngineStats, ShardWork};
use crate::input::Feed;
use crate::memoryx::checkpoint;
use crate::memoryx::store::MemoryX;
use crate::model::loss::LossSum;
use crate::protocol::pb;
use crate::protocol::reduce::Pairwise;
use crate::protocol::{LayerGrad, LayerStream};
use data::shard::Split;
use data::split_even;
use errors::{Error, Result};
use kernels::on_workers;

/// What a step asks of the engines: which samples (by index into the split) and how to scale gradients.
/// Input workers feed each engine directly, as the seeds' input servers do, so only sample indices travel
/// through the fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRequest {
    /// The global step (0-based); evaluation steps reuse the step they follow.
    pub step: u64,
    /// The global batch, split evenly over the engines in order.
    pub samples: Vec<u32>,
    /// Where the samples come from; `Test` runs the forward pass only.
    pub split: Split,
    /// 1 / global batch, so engine gradients sum to the batch mean.
    pub grad_scale: f32,
    /// Samples per micro-batch on an engine (the plan's); 0 runs each shard whole.
    pub micro_batch: usize,
}

impl StepRequest {
    /// The request as it travels to a stage (or a streaming root) of `job`.
    pub fn to_pb(&self, job: &str) -> pb::BeginStepRequest {
        pb::BeginStepRequest {
            job: job.to_string(),
            step: self.step,
            samples: self.samples.clone(),
            split: match self.split {
                Split::Train => pb::Split::Train,
                Split::Test => pb::Split::Test,
            } as i32,
            grad_scale: self.grad_scale,
            micro_batch: u32::try_from(self.micro_batch).unwrap_or(u32::MAX),
        }
    }

    /// A request as it arrived (its job checked by the caller); an unknown split is refused.
    pub fn from_pb(b: &pb::BeginStepRequest) -> Result<StepRequest> {
        let split = match pb::Split::try_from(b.split) {
            Ok(pb::Split::Train) => Split::Train,
            Ok(pb::Split::Test) => Split::Test,
            Err(_) => return Err(Error::Protocol(format!("unknown split {}", b.split))),
        };
        Ok(StepRequest {
            step: b.step,
            samples: b.samples.clone(),
            split,
            grad_scale: b.grad_scale,
            micro_batch: b.micro_batch as usize,
        })
    }

    /// What an engine does with its shard of this step.
    pub fn work(&self) -> ShardWork {
        ShardWork { grad_scale: self.grad_scale, train: self.split == Split::Train, micro_batch: self.micro_batch }
    }
}

/// The source of a pass's layer streams, in order: the loop prefetches behind it.
pub type StreamSource<'a> = &'a mut dyn FnMut() -> Result<LayerStream>;

/// A fabric root that streams each step's layers from the weight servers itself and stages their gradients on
/// them: the training loop sends it only the batch, and commits the step.
pub trait Streamer {
    /// Training step `request`, streamed and its gradients staged (not committed): the loss summed over the
    /// engines, and the bytes streamed.
    fn train(&mut self, request: &StepRequest) -> Result<(LossSum, u64)>;
    /// A forward pass over the held-out batch `request`: the loss summed over the engines.
    fn evaluate(&mut self, request: &StepRequest) -> Result<LossSum>;
}

/// What the training loop needs from the fabric; the network client implements it the same way.
pub trait Swarm {
    /// Engines behind the fabric.
    fn engines(&self) -> usize;
    /// Starts a step on every engine with its share of the samples.
    fn begin_step(&mut self, request: &StepRequest) -> Result<()>;
    /// Broadcasts `layers` forward streams pulled from `next` and returns the loss summed over engines.
    fn forward_pass(&mut self, layers: usize, next: StreamSource<'_>) -> Result<LossSum>;
    /// Broadcasts `layers` backward streams pulled from `next` (last layer first) and returns each layer's
    /// gradients summed over engines, in the order streamed.
    fn backward_pass(&mut self, layers: usize, next: StreamSource<'_>) -> Result<Vec<LayerGrad>> {
        let mut grads = Vec::with_capacity(layers);
        self.backward_pass_into(layers, next, &mut |g| {
            grads.push(g);
            Ok(())
        })?;
        Ok(grads)
    }
    /// [`Swarm::backward_pass`], handing each layer's summed gradient to `sink` as soon as it is complete, so
    /// MemoryX never holds a whole step's gradients at once.
    fn backward_pass_into(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        sink: &mut dyn FnMut(LayerGrad) -> Result<()>,
    ) -> Result<()>;
    /// Each engine's counters, in engine order.
    fn stats(&mut self) -> Result<Vec<EngineStats>>;
    /// The smallest SRAM among the engines: what the plan's choice of execution mode is made against.
    fn sram_bytes(&self) -> u64;

    /// The root's own streaming from the weight servers, when it does it ([`Streamer`]); `None`: the training
    /// loop streams the layers from MemoryX through the fabric.
    fn streamer(&mut self) -> Option<&mut dyn Streamer> {
        None
    }

    /// Whether the engines can hold the whole model as replicas (pipelined execution). Engines in this process
    /// share MemoryX's memory, so there is nothing to keep resident and the streaming loop serves both modes.
    fn holds_replicas(&self) -> bool {
        false
    }
    /// Installs MemoryX's state of `step` (a checkpoint file's bytes) as every engine's replica.
    fn prime(&mut self, _state: &[u8]) -> Result<()> {
        Err(Error::Protocol("these engines cannot hold replicas".into()))
    }
    /// Begins and runs a training step on the replicas; every engine applies the gradients summed over all
    /// engines. Returns the loss summed over engines.
    fn resident_step(&mut self, _request: &StepRequest) -> Result<LossSum> {
        Err(Error::Protocol("these engines cannot hold replicas".into()))
    }
    /// The state of the first engine's replica, as a checkpoint file's bytes.
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        Err(Error::Protocol("these engines cannot hold replicas".into()))
    }
}

/// SwarmX with its engines in the same process: broadcast is a shared reference, reduce a sum in engine order.
pub struct LocalSwarm {
    engines: Vec<Box<dyn EngineRole>>,
    feed: Arc<dyn Feed>,
    replicas: Option<Replicas>,
}

/// Pipelined execution in one process: each engine's own copy of the model, as an engine process holds it.
struct Replicas {
    job: String,
    make: ReplicaFactory,
    held: Vec<Option<MemoryX>>,
}

impl LocalSwarm {
    /// A fabric over `engines`, fed their shards by `feed`; there must be at least one.
    pub fn new(engines: Vec<Box<dyn EngineRole>>, feed: Arc<dyn Feed>) -> Result<Self> {
        if engines.is_empty() {
            return Err(Error::Protocol("SwarmX needs at least one engine".into()));
        }
        Ok(LocalSwarm { engines, feed, replicas: None })
    }

    /// Lets every engine hold the whole model for pipelined execution of `job`, building replicas with `make`,
    /// exactly as engine processes do.
    pub fn with_replicas(mut self, job: impl Into<String>, make: ReplicaFactory) -> Self {
        let held = self.engines.iter().map(|_| None).collect();
        self.replicas = Some(Replicas { job: job.into(), make, held });
        self
    }
}

/// The replicas of engines started `with_replicas`; a fabric without them refuses pipelined calls.
fn held(replicas: &mut Option<Replicas>) -> Result<&mut Replicas> {
    replicas.as_mut().ok_or_else(|| Error::Protocol("these engines cannot hold replicas".into()))
}

impl Swarm for LocalSwarm {
    fn engines(&self) -> usize {
        self.engines.len()
    }

    fn begin_step(&mut self, request: &StepRequest) -> Result<()> {
        let parts = split_even(&request.samples, self.engines.len());
        for (engine, part) in self.engines.iter_mut().zip(parts) {
            engine.begin_step(self.feed.shard(request.split, part)?, request.work())?;
        }
        Ok(())
    }

    fn forward_pass(&mut self, layers: usize, next: StreamSource<'_>) -> Result<LossSum> {
        for _ in 0..layers {
            let stream = next()?;
            let engines = &mut self.engines;
            on_workers(|| engines.iter_mut().try_for_each(|e| e.forward(&stream)))?;
        }
        let mut total = Pairwise::default();
        for engine in &mut self.engines {
            total.push(on_workers(|| engine.loss())?)?;
        }
        Ok(total.finish()?.unwrap_or_default())
    }

    fn backward_pass_into(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        sink: &mut dyn FnMut(LayerGrad) -> Result<()>,
    ) -> Result<()> {
        for _ in 0..layers {
            let stream = next()?;
            let mut sum = Pairwise::default();
            for engine in &mut self.engines {
                sum.push(on_workers(|| engine.backward(&stream))?)?;
            }
            sink(sum.finish()?.ok_or_else(|| Error::Protocol("no engines".into()))?)?;
        }
        Ok(())
    }

    fn stats(&mut self) -> Result<Vec<EngineStats>> {
        Ok(self.engines.iter().map(|e| e.stats()).collect())
    }

    fn sram_bytes(&self) -> u64 {
        self.engines.iter().map(|e| e.stats().sram_bytes).min().unwrap_or(0)
    }

    fn holds_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    fn prime(&mut self, state: &[u8]) -> Result<()> {
        let (step, tensors) = checkpoint::from_bytes(state, "the replica sent to the engines")?;
        let replicas = held(&mut self.replicas)?;
        for (engine, held) in self.engines.iter_mut().zip(&mut replicas.held) {
            let store = (replicas.make)()?;
            store.restore(step, &tensors)?;
            *held = Some(store);
            engine.set_resident(true);
        }
        Ok(())
    }

    fn resident_step(&mut self, request: &StepRequest) -> Result<LossSum> {
        let parts = split_even(&request.samples, self.engines.len());
        let replicas = held(&mut self.replicas)?;
        let (mut loss, mut sum) = (Pairwise::default(), Pairwise::default());
        for ((engine, held), part) in self.engines.iter_mut().zip(&replicas.held).zip(parts) {
            let store =
                held.as_ref().ok_or_else(|| Error::Protocol("an engine holds no replica: prime it first".into()))?;
            if store.step() != request.step {
                return Err(Error::Protocol(format!(
                    "step {} asked of a replica of step {}",
                    request.step,
                    store.step()
                )));
            }
            engine.begin_step(self.feed.shard(Split::Train, part)?, ShardWork { train: true, ..request.work() })?;
            let (l, grads) = resident_pass(engine.as_mut(), store, store.layout().linears.len())?;
            loss.push(l)?;
            sum.push(grads)?;
        }
        let loss = loss.finish()?.unwrap_or_default();
        let sum = sum.finish()?.ok_or_else(|| Error::Protocol("no engines".into()))?;
        for store in replicas.held.iter().flatten() {
            apply_all(store, &sum, request.step)?;
        }
        Ok(loss)
    }

    fn snapshot(&mut self) -> Result<Vec<u8>> {
        let replicas = held(&mut self.replicas)?;
        let store = replicas
            .held
            .first()
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Protocol("no engine holds a replica".into()))?;
        let (step, tensors) = store.snapshot()?;
        checkpoint::to_bytes(step, &tensors, &replicas.job)
    }
}
