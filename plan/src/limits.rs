//! What a message, a stream or a file of a job may make a role allocate, derived from the plan.

use crds::TrainingJobSpec;

use crate::appliance::shard_of;
use crate::layout::{LinearShape, ModelLayout};
use crate::memoryx::optimizer_values;
use errors::{Error, Result};

/// Bytes a checkpoint's safetensors header may take beside the tensor data: the metadata (format, job, uid,
/// step, checksum) and, per tensor, its name, dtype, shape and offsets — generously, as a bound, not an estimate.
const HEADER_ALLOWANCE: u64 = 16 << 10;
/// Header bytes allowed per tensor (a name like `layer.123.weight.m` with its JSON entry is about 90).
const HEADER_PER_TENSOR: u64 = 256;

/// The most any one message, stream or file of a job may make a role allocate, all from the plan: an engine's
/// shard of the batch, each layer's shape, the size of the model's whole state. Every role derives it from the
/// job it loads ([`Limits::for_spec`]) and checks a sender's lengths, counts and shapes against it *before*
/// allocating for them, so a client holding the job's own credentials still cannot make a role grow beyond
/// what the job needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Samples one engine takes per step ([`shard_of`]).
    pub shard: usize,
    /// Each weight layer's shape, in forward order: bounds its streams and gradients.
    pub layers: Vec<LinearShape>,
    /// Values per parameter the optimizer keeps beside the weights (0 for SGD, 2 for Adam).
    pub optimizer_values: u64,
}

impl Limits {
    /// The limits of the job `spec` describes (the spec the role loaded from its job manifest).
    pub fn for_spec(spec: &TrainingJobSpec) -> Limits {
        let layout = ModelLayout::from_spec(&spec.model);
        Limits::new(&layout, shard_of(spec), optimizer_values(spec.training.optimizer.kind))
    }

    /// The limits of a model `layout` trained with shards of `shard` samples and `optimizer_values` optimizer
    /// values per parameter.
    pub fn new(layout: &ModelLayout, shard: usize, optimizer_values: u64) -> Limits {
        Limits { shard: shard.max(1), layers: layout.linears.clone(), optimizer_values }
    }

    /// How long one call to a stage may take by default: two minutes, plus the model's whole state at 16 MiB/s
    /// (a `Prime` or `Snapshot` carries it all; no other call carries more). Keepalives find a dead peer long
    /// before; this bounds a live one that never finishes.
    pub fn call_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(120)
            .saturating_add(std::time::Duration::from_secs(self.state_bytes() / (16 << 20)))
    }

    /// Samples a `BeginStep` may carry to a stage with `engines` engines below it.
    pub fn samples(&self, engines: usize) -> u64 {
        (self.shard as u64).saturating_mul(engines.max(1) as u64)
    }

    /// The shape of layer `layer`, or an error when the model has no such layer.
    pub fn layer(&self, layer: u64) -> Result<LinearShape> {
        usize::try_from(layer).ok().and_then(|l| self.layers.get(l).copied()).ok_or_else(|| {
            Error::Protocol(format!(
                "a stream for layer {layer} reached a stage of a model of {} layers",
                self.layers.len()
            ))
        })
    }

    /// Most weight values layer `shape` may stream or return as gradients: every weight of its shape (a
    /// sparse layer's non-zeros are fewer; a tied layer's gradient covers the whole matrix).
    pub fn weight_values(shape: &LinearShape) -> u64 {
        (shape.inputs as u64).saturating_mul(shape.outputs as u64)
    }

    /// Most lines a layer's mask may have, and the most any one index may point into: the larger side.
    pub fn mask_lines(shape: &LinearShape) -> u64 {
        shape.inputs.max(shape.outputs) as u64
    }

    /// Most bytes the model's whole state (weights, biases and optimizer moments, as a checkpoint file or a
    /// pipelined engine's replica) may take. Sparse layers are counted dense: their non-zero count is drawn at
    /// random, so the dense shape is the bound the plan can guarantee.
    pub fn state_bytes(&self) -> u64 {
        let values: u64 = self
            .layers
            .iter()
            .map(|s| if s.tied_to.is_some() { 0 } else { Self::weight_values(s) }.saturating_add(s.vector_len() as u64))
            .fold(0u64, u64::saturating_add);
        let tensors = 6 * self.layers.len() as u64;
        values
            .saturating_mul(4 * (1 + self.optimizer_values))
            .saturating_add(HEADER_ALLOWANCE)
            .saturating_add(tensors.saturating_mul(HEADER_PER_TENSOR))
    }
}
