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

/// How MemoryX's state is spread over its weight servers and, on each, between memory and its disk.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryxPlan {
    /// Weight servers: each owns an equal slice of every layer.
    pub servers: u32,
    /// Bytes of state (weights, biases, optimizer moments) the busiest server holds: its slice of every layer.
    pub server_bytes: u64,
    /// Of those, what it keeps in memory (`spec.memoryx.memoryBytes` caps it).
    pub memory_bytes: u64,
    /// Of those, what lives on its volume (the disk tier), read ahead in stream order.
    pub disk_bytes: u64,
    /// The least memory a server can work in: its slice of the largest layer with its staged gradient, twice:
    /// one being updated while the next is read ahead.
    pub min_memory_bytes: u64,
}

/// Bytes a server's slice of a layer of `values` values takes with its staged gradient.
fn values_with_grad(values: u64, servers: u32, per_value: u64) -> u64 {
    values.div_ceil(u64::from(servers)) * (per_value + 4)
}

/// Most weight servers the plan chooses by itself; more must be asked for (`spec.memoryx.servers`).
pub const AUTO_SERVERS_MAX: u32 = 8;

/// The part of slice `index` of `count` in a tensor of `len` values: equal contiguous ranges in stored order,
/// the first ones one shorter when `len` does not divide. Every server, the coordinator and every checkpoint
/// reader cut a layer with this one function.
pub fn slice_range(len: usize, index: u32, count: u32) -> std::ops::Range<usize> {
    let n = count.max(1) as usize;
    let i = (index as usize).min(n);
    len * i / n..len * (i + 1).min(n) / n
}

impl MemoryxPlan {
    /// The spread of the job `spec`'s state.
    pub fn for_spec(spec: &TrainingJobSpec) -> Result<MemoryxPlan> {
        let layout = ModelLayout::from_spec(&spec.model);
        let layer_values: Vec<u64> = (0..layout.linears.len())
            .map(|l| {
                let s = layout.linears[l];
                (if s.tied_to.is_some() { 0 } else { layout.expected_weights(l) } + s.bias_len()) as u64
            })
            .collect();
        MemoryxPlan::new(&spec.memoryx, &layer_values, OptState::values_per_parameter(spec.training.optimizer.kind))
    }

    /// Spreads a state whose layers hold `layer_values[l]` stored values (weights and bias; 0 for a tied
    /// layer) with `opt` optimizer values beside each, as `spec` asks, refusing a spread that cannot work.
    pub fn new(spec: &crds::MemoryxSpec, layer_values: &[u64], opt: u64) -> Result<MemoryxPlan> {
        let per_value = 4 * (1 + opt);
        let total_values: u64 = layer_values.iter().sum();
        let state = total_values * per_value;
        let servers = match (spec.servers, spec.memory_bytes) {
            (Some(n), _) => n.max(1),
            (None, Some(budget)) => state.div_ceil(budget.max(1)).clamp(1, AUTO_SERVERS_MAX as u64) as u32,
            (None, None) => 1,
        };
        if u64::from(servers) > total_values {
            return Err(Error::Plan(format!(
                "spec.memoryx.servers is {servers} but the model stores only {total_values} parameters: every weight                  server must own at least one; use at most {total_values} servers"
            )));
        }
        let slice = |values: u64| values.div_ceil(u64::from(servers)) * per_value;
        let server_bytes: u64 = layer_values.iter().map(|&v| slice(v)).sum();
        // A layer in use also has its staged gradient beside it.
        let largest = layer_values.iter().map(|&v| values_with_grad(v, servers, per_value)).max().unwrap_or(0);
        let min_memory_bytes = 2 * largest;
        let memory_bytes = spec.memory_bytes.map_or(server_bytes, |b| b.min(server_bytes));
        if let Some(budget) = spec.memory_bytes {
            if budget < server_bytes && budget < min_memory_bytes {
                return Err(Error::Plan(format!(
                    "spec.memoryx.memoryBytes is {} but each of the {servers} weight servers needs at least {} in                      memory: its slice of the largest layer ({}) being updated while the next one is read ahead;                      raise memoryBytes to {min_memory_bytes} or more, or add weight servers (spec.memoryx.servers)",
                    crate::units::bytes(budget),
                    crate::units::bytes(min_memory_bytes),
                    crate::units::bytes(largest)
                )));
            }
        }
        Ok(MemoryxPlan { servers, server_bytes, memory_bytes, disk_bytes: server_bytes - memory_bytes, min_memory_bytes })
    }
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
    /// How MemoryX's weight servers share that state, and what each keeps in memory and on disk.
    pub memoryx: MemoryxPlan,
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
        let memoryx = MemoryxPlan::for_spec(spec)?;
        let sparse_index_bytes: u64 = (0..n).filter(|&l| layout.linears[l].sparse).map(|l| 8 * layers[l].weights as u64).sum();
        Ok(Plan {
            cs2: spec.cs2,
            shard,
            shard_tokens: shard * layout.tokens_per_sample(),
            weight_bytes: layout.weight_bytes(),
            memoryx_bytes: 4 * stored * (1 + opt) + sparse_index_bytes,
            memoryx,
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
mod servers_tests {
    use super::*;

    #[test]
    fn slices_cover_every_value_once() {
        for len in [0usize, 1, 7, 10, 1000] {
            for n in 1..=5u32 {
                let ranges: Vec<_> = (0..n).map(|i| slice_range(len, i, n)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[n as usize - 1].end, len);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "{len} {n}: {ranges:?}");
            }
        }
    }

    #[test]
    fn servers_are_chosen_from_the_budget_and_a_spread_that_cannot_work_is_refused() {
        let spec = |servers, memory_bytes| crds::MemoryxSpec { servers, memory_bytes };
        // 4 layers of 1000 values with Adam: 12 kB each, 48 kB in all.
        let layers = [1000u64; 4];
        let one = MemoryxPlan::new(&spec(None, None), &layers, 2).unwrap();
        assert_eq!((one.servers, one.server_bytes, one.memory_bytes, one.disk_bytes), (1, 48_000, 48_000, 0));
        let auto = MemoryxPlan::new(&spec(None, Some(16_000)), &layers, 2).unwrap();
        assert_eq!((auto.servers, auto.server_bytes, auto.disk_bytes), (3, 16_032, 32), "48 kB over 16 kB servers");
        let tiered = MemoryxPlan::new(&spec(Some(2), Some(16_000)), &layers, 2).unwrap();
        assert_eq!((tiered.server_bytes, tiered.memory_bytes, tiered.disk_bytes, tiered.min_memory_bytes), (24_000, 16_000, 8_000, 16_000));
        let err = MemoryxPlan::new(&spec(Some(2), Some(5_000)), &layers, 2).unwrap_err().to_string();
        assert!(err.contains("memoryBytes") && err.contains("largest layer"), "{err}");
        let err = MemoryxPlan::new(&spec(Some(5), None), &[2, 2], 2).unwrap_err().to_string();
        assert!(err.contains("only 4 parameters"), "{err}");
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
