//! The plan: one function from a job spec to the appliance that runs it — what MemoryX stores, what each
//! engine holds, what streams per layer. `wsctl plan`, `wsctl run` and the operator all call it, so a job
//! means the same thing everywhere, and a job that cannot fit is refused before anything starts.

use crds::contract::SwarmxTree;
use crds::{ExecutionMode, TrainingJobSpec};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::{LinearShape, ModelLayout};
use crate::optim::OptState;

/// One layer's stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerPlan {
    /// What the unit is (`fc1`, `block0.qkv`, `head (tied)`, …).
    pub name: String,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// Weights kept (non-zeros when sparse).
    pub weights: usize,
    /// Bytes of the forward stream if the layer were dense.
    pub dense_bytes: u64,
    /// Bytes of the forward stream as sent.
    pub stream_bytes: u64,
}

/// The assembled appliance for one job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// CS-2 systems, one engine each.
    pub cs2: u32,
    /// Samples each engine takes per step.
    pub shard: usize,
    /// Tokens each engine takes per step (samples × context length for a GPT).
    pub shard_tokens: usize,
    /// Bytes of the model's weights as stored and streamed (values, indices, biases): what the engine would
    /// have to hold to run without streaming.
    pub weight_bytes: u64,
    /// Bytes MemoryX holds: weights, biases and optimizer state.
    pub memoryx_bytes: u64,
    /// SRAM of each engine.
    pub engine_sram_bytes: u64,
    /// Bytes of one shard's activations, resident for a whole step.
    pub activation_bytes: u64,
    /// The most an engine holds at once: activations, one layer and the prefetched next layer.
    pub peak_engine_bytes: u64,
    /// How weights reach the engines.
    pub execution_mode: ExecutionMode,
    /// The SwarmX tree between MemoryX and the engines: the operator names its pods after it, the local runner
    /// starts its processes from it, the cost model prices its depth.
    pub swarmx: SwarmxTree,
    /// The layer-by-layer stream.
    pub layers: Vec<LayerPlan>,
    /// Bytes a step moves between MemoryX and the fabric (forward and backward streams, gradients back).
    pub step_bytes: u64,
    /// The same for the dense model: what sparsity is measured against.
    pub dense_equivalent_step_bytes: u64,
}

impl Plan {
    /// Plans `spec` for engines of `sram_bytes` under a SwarmX tree of `fan_out` children per node, refusing a
    /// job whose shard cannot fit one engine.
    pub fn new(spec: &TrainingJobSpec, sram_bytes: u64, fan_out: u32) -> Result<Plan> {
        spec.validate()?;
        let layout = ModelLayout::from_spec(&spec.model);
        let shard = shard_of(spec);
        let n = layout.linears.len();
        let layers: Vec<LayerPlan> = (0..n)
            .map(|l| {
                let s = layout.linears[l];
                LayerPlan {
                    name: layout.unit_name(l),
                    inputs: s.inputs,
                    outputs: s.outputs,
                    weights: layout.expected_weights(l),
                    dense_bytes: 4 * (s.dense_weights() + s.bias_len()) as u64,
                    stream_bytes: layout.forward_stream_bytes(l),
                }
            })
            .collect();
        let activation_bytes = layout.activation_bytes(shard);
        let streaming_peak = (0..n)
            .map(|l| layers[l].stream_bytes + layers.get(l + 1).map_or(0, |next| next.stream_bytes))
            .max()
            .unwrap_or(0);
        let all_weights = layout.weight_bytes();
        let execution_mode = match spec.execution_mode {
            ExecutionMode::Auto if activation_bytes + all_weights <= sram_bytes => ExecutionMode::Pipelined,
            ExecutionMode::Auto => ExecutionMode::WeightStreaming,
            mode => mode,
        };
        let peak_engine_bytes = activation_bytes
            + if execution_mode == ExecutionMode::Pipelined { all_weights } else { streaming_peak };
        if peak_engine_bytes > sram_bytes {
            let what = match execution_mode {
                ExecutionMode::Pipelined => format!(
                    "pipelined execution (all weights resident beside the activations of a {shard}-sample shard; \
                     set spec.executionMode to auto or weightStreaming to stream them)"
                ),
                _ => format!("the activations of a {shard}-sample shard plus two layers of weights"),
            };
            return Err(Error::OutOfSram {
                engine: "every engine".into(),
                what,
                needed: peak_engine_bytes,
                available: sram_bytes,
            });
        }
        let stored: u64 = (0..n)
            .map(|l| {
                let s = layout.linears[l];
                (if s.tied_to.is_some() { 0 } else { layers[l].weights } + s.bias_len()) as u64
            })
            .sum();
        let opt = OptState::values_per_parameter(spec.training.optimizer.kind);
        let sparse_index_bytes: u64 = (0..n).filter(|&l| layout.linears[l].sparse).map(|l| 8 * layers[l].weights as u64).sum();
        Ok(Plan {
            cs2: spec.cs2,
            shard,
            shard_tokens: shard * layout.tokens_per_sample(),
            weight_bytes: layout.weight_bytes(),
            memoryx_bytes: 4 * stored * (1 + opt) + sparse_index_bytes,
            engine_sram_bytes: sram_bytes,
            activation_bytes,
            peak_engine_bytes,
            execution_mode,
            swarmx: SwarmxTree::new(spec.cs2, fan_out),
            step_bytes: step_bytes(&layout, false),
            dense_equivalent_step_bytes: step_bytes(&layout, true),
            layers,
        })
    }
}

/// Bytes one training step moves between MemoryX and the fabric: every layer forward (values, indices and
/// bias), every layer backward but the first's values (the first sends its mask, or nothing when dense), and the
/// gradients back. With `dense` the same for the model without its mask.
pub fn step_bytes(layout: &ModelLayout, dense: bool) -> u64 {
    let mut total = 0;
    for (l, s) in layout.linears.iter().enumerate() {
        let sparse = s.sparse && !dense;
        let nnz = if dense { s.dense_weights() } else { layout.expected_weights(l) } as u64;
        let values = 4 * nnz;
        let out = s.outputs as u64;
        let inp = s.inputs as u64;
        let bias = s.bias_len() as u64;
        let (fwd_index, bwd_index) =
            if sparse { (4 * nnz + 4 * (2 * out + 1), 4 * nnz + 4 * (2 * inp + 1)) } else { (0, 0) };
        total += values + fwd_index + 4 * bias;
        total += bwd_index + if l > 0 { values } else { 0 };
        total += values + 4 * bias;
    }
    total
}

/// Samples each engine takes per step: the batch over the CS-2s (validation makes it divide evenly). Training
/// steps and evaluation batches alike never hand an engine more, so it is also what a `BeginStep` may ask.
pub fn shard_of(spec: &TrainingJobSpec) -> usize {
    (spec.training.batch_size / spec.cs2.max(1)) as usize
}

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
        Limits::new(&layout, shard_of(spec), OptState::values_per_parameter(spec.training.optimizer.kind))
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
        std::time::Duration::from_secs(120).saturating_add(std::time::Duration::from_secs(self.state_bytes() / (16 << 20)))
    }

    /// Samples a `BeginStep` may carry to a stage with `engines` engines below it.
    pub fn samples(&self, engines: usize) -> u64 {
        (self.shard as u64).saturating_mul(engines.max(1) as u64)
    }

    /// The shape of layer `layer`, or an error when the model has no such layer.
    pub fn layer(&self, layer: u64) -> Result<LinearShape> {
        usize::try_from(layer).ok().and_then(|l| self.layers.get(l).copied()).ok_or_else(|| {
            Error::Protocol(format!("a stream for layer {layer} reached a stage of a model of {} layers", self.layers.len()))
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
            .map(|s| if s.tied_to.is_some() { 0 } else { Self::weight_values(s) }.saturating_add(s.bias_len() as u64))
            .fold(0u64, u64::saturating_add);
        let tensors = 6 * self.layers.len() as u64;
        values
            .saturating_mul(4 * (1 + self.optimizer_values))
            .saturating_add(HEADER_ALLOWANCE)
            .saturating_add(tensors.saturating_mul(HEADER_PER_TENSOR))
    }
}

#[cfg(test)]
mod tests {
    use crds::{Activation, ModelKind, ModelSpec, OptimizerKind, OptimizerSpec, ScheduleSpec};

    use super::*;
    use crate::memoryx::{MemoryX, WeightStore};

    /// The state bound is a bound: every model's real state (as a checkpoint or a replica) fits under it, the
    /// sparse layers' random non-zero counts and a GPT's tied head included, and it is not wildly above it.
    #[test]
    fn every_models_real_state_fits_its_limit() {
        let gpt = ModelSpec {
            kind: ModelKind::Gpt,
            width: Some(32),
            heads: Some(2),
            blocks: Some(2),
            context_length: Some(16),
            ..ModelSpec::mlp(Vec::new(), Activation::Gelu, 0.5)
        };
        let models = [ModelSpec::mlp(vec![784, 64, 10], Activation::Relu, 0.9), ModelSpec::mlp(vec![784, 32, 10], Activation::Relu, 0.0), gpt];
        for (model, kind) in models.into_iter().zip([OptimizerKind::Adamw, OptimizerKind::Sgd, OptimizerKind::Momentum]) {
            let layout = ModelLayout::from_spec(&model);
            let optimizer = OptimizerSpec { kind, learning_rate: 0.01, momentum: 0.9, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.0 };
            let limits = Limits::new(&layout, 8, OptState::values_per_parameter(kind));
            let store = MemoryX::new(layout, optimizer, ScheduleSpec::default(), 10, 7);
            let state = store.state("a-job-name-of-forty-characters-at-most-x").expect("state").1.len() as u64;
            assert!(state <= limits.state_bytes(), "{kind:?}: a state of {state} bytes over its limit {}", limits.state_bytes());
            assert!(limits.state_bytes() <= 16 * state + (64 << 10), "{kind:?}: the limit is a bound, not a guess");
        }
    }
}
