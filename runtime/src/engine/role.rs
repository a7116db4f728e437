//! The contract between SwarmX and an engine. SwarmX drives a step through [`EngineRole`] without knowing
//! whether the engine is in this process ([`super::wse::Wse`]) or behind gRPC, so the data type it reads back from
//! an engine — [`EngineStats`] — lives here, apart from any one implementation; the batch shard it hands one
//! ([`data::shard::Shard`]) is data's.

use serde::Serialize;

use data::shard::Shard;

use super::hw::EngineCounters;
use wire::error::Result;
use crate::model::loss::LossSum;
use crate::protocol::{LayerGrad, LayerStream};

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

/// What SwarmX talks to: one engine, local or behind a transport.
pub trait EngineRole: Send {
    /// Starts a step on this engine's shard. `grad_scale` is 1 / global batch; `train` false runs the forward
    /// pass only (evaluation).
    fn begin_step(&mut self, shard: Shard, grad_scale: f32, train: bool) -> Result<()>;
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
