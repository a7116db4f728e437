//! The contract between SwarmX and an engine. SwarmX drives a step through [`EngineRole`] without knowing
//! whether the engine is in this process ([`super::wse::Wse`]) or behind gRPC, so the data type it reads back from
//! an engine — [`EngineStats`] — lives here, apart from any one implementation; the batch shard it hands one
//! ([`data::shard::Shard`]) is data's.

use serde::Serialize;

use data::shard::Shard;

use super::hw::EngineCounters;
use crate::model::loss::LossSum;
use crate::protocol::{LayerGrad, LayerStream};
use errors::Result;

/// An engine's report of itself, for summaries and metrics.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize)]
pub struct EngineStats {
    /// Work counters.
    #[serde(flatten)]
    pub counters: EngineCounters,
    /// The most SRAM it held at once.
    pub peak_sram_bytes: u64,
    /// Its SRAM budget.
    pub sram_bytes: u64,
    /// Wall time spent computing (not waiting for weights).
    pub compute_s: f64,
}

/// How an engine runs its shard of a step: what travels with the shard from the training loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardWork {
    /// 1 / the tokens of the global batch, so gradients summed over engines give the batch mean.
    pub grad_scale: f32,
    /// False runs the forward pass only (evaluation).
    pub train: bool,
    /// Samples per micro-batch (the full job's shard, `Plan::micro_batch`); 0 runs the shard whole.
    pub micro_batch: usize,
}

impl ShardWork {
    /// A training step's shard, run in micro-batches of `micro_batch` samples (0: whole).
    pub fn train(grad_scale: f32, micro_batch: usize) -> Self {
        ShardWork { grad_scale, train: true, micro_batch }
    }

    /// An evaluation step's shard (the forward pass only), whole.
    pub fn eval() -> Self {
        ShardWork { grad_scale: 0.0, train: false, micro_batch: 0 }
    }
}

/// What SwarmX talks to: one engine, local or behind a transport.
pub trait EngineRole: Send {
    /// Starts a step on this engine's shard, run as `work` says.
    fn begin_step(&mut self, shard: Shard, work: ShardWork) -> Result<()>;
    /// Computes one layer of the forward pass.
    fn forward(&mut self, stream: &LayerStream) -> Result<()>;
    /// Computes the loss at the end of the forward pass (and the first delta when training).
    fn loss(&mut self) -> Result<LossSum>;
    /// Computes one layer of the backward pass and returns its weight gradients.
    fn backward(&mut self, stream: &LayerStream) -> Result<LayerGrad>;
    /// Counters and memory use so far.
    fn stats(&self) -> EngineStats;
    /// Whether the engine holds the whole model (pipelined execution): its layers then come from its own
    /// memory and are not counted as received.
    fn set_resident(&mut self, _resident: bool) {}
}
