//! The plan: one function from a job spec to the appliance that runs it — what MemoryX stores, what each
//! engine holds, what streams per layer. `wsctl plan`, `wsctl run`, the operator and every role call it, so a
//! job means the same thing everywhere, and a job that cannot fit is refused before anything starts.

use crds::contract::SwarmxTree;
use crds::{ExecutionMode, TrainingJobSpec};
use serde::Serialize;

use crate::layout::ModelLayout;
use crate::memoryx::{MemoryxPlan, optimizer_values};
use errors::{Error, Result};

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
    /// Samples in one training step, over all engines (`spec.training.batchSize`): what the curve is a
    /// function of, whatever the CS-2 count.
    pub batch: usize,
    /// Input workers feeding each engine (`spec.data.workers`, at least 1).
    pub input_workers_per_cs2: u32,
    /// Samples each engine takes per step.
    pub shard: usize,
    /// Tokens each engine takes per step (samples × context length for a GPT).
    pub shard_tokens: usize,
    /// Samples per micro-batch (`TrainingJobSpec::micro_batch`): an engine runs its shard as micro-batches of
    /// this size, each streamed layer serving all of them, and sums their gradients.
    pub micro_batch: usize,
    /// Bytes of the model's weights as stored and streamed (values, indices, biases): what the engine would
    /// have to hold to run without streaming.
    pub weight_bytes: u64,
    /// Bytes MemoryX holds: weights, biases and optimizer state.
    pub memoryx_bytes: u64,
    /// How MemoryX's weight servers share that state, and what each keeps in memory and on disk.
    pub memoryx: MemoryxPlan,
    /// The most MemoryX's coordinator holds at once beside its own server's slice, as the hub between the weight
    /// servers and SwarmX ([`coordinator_transit_bytes`]): what its process needs on top of
    /// [`MemoryxPlan::memory_bytes`].
    pub coordinator_transit_bytes: u64,
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
    /// Input workers in all: [`Plan::input_workers_per_cs2`] for each engine.
    pub input_workers: u32,
    /// The layer-by-layer stream.
    pub layers: Vec<LayerPlan>,
    /// Bytes a step moves between MemoryX and the fabric (forward and backward streams, gradients back).
    pub step_bytes: u64,
    /// The same for the dense model: what sparsity is measured against.
    pub dense_equivalent_step_bytes: u64,
    /// Where the initial weights come from: the pretrained Hugging Face folder MemoryX reads unit by unit
    /// (`spec.model.from`), or `None` when they are drawn from the seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_from: Option<String>,
    /// Whether the model's matrices are masked (`spec.model.sparsity` > 0).
    pub sparse: bool,
}

impl Plan {
    /// Plans `spec` for engines of its preset's SRAM (or the spec's override, [`crate::preset::sram_bytes`])
    /// under a SwarmX tree of `fan_out` children per node: what the operator, `wsctl` and the roles all call.
    pub fn for_spec(spec: &TrainingJobSpec, fan_out: u32) -> Result<Plan> {
        if spec.model.kind == crds::ModelKind::Program {
            // A program is planned from its graph: where it cannot be read (an operator without the folder, a
            // path that is not there) nothing is planned, and the error says so.
            crate::program::for_spec(&spec.model).map_err(|e| {
                Error::Plan(format!(
                    "the model program in spec.model.from cannot be read here ({e}): a program job runs where its \
                     folder is (wsctl run, or pods that mount it at that path)"
                ))
            })?;
        }
        Plan::new(spec, crate::preset::sram_bytes(&spec.engine), fan_out)
    }

    /// Whether a component of `role` reads the pretrained folder `spec.model.from`, and so needs the volume it is
    /// in (in a cluster, `spec.data.volume`): every weight server reads its slice of every unit from it; an
    /// engine only when it holds a replica of the model (pipelined) whose masks are chosen by magnitude from it
    /// (sparse); nothing else.
    pub fn reads_pretrained(&self, role: crds::contract::Role) -> bool {
        use crds::contract::Role;
        self.weights_from.is_some()
            && match role {
                Role::Memoryx => true,
                Role::Engine => self.execution_mode == ExecutionMode::Pipelined && self.sparse,
                Role::Input | Role::Swarmx => false,
            }
    }

    /// How long MemoryX may need to stop gracefully (a termination signal: the pod evicted, the node drained,
    /// Ctrl-C locally): finish the step in flight and checkpoint the whole state. Generous on purpose, since
    /// running out of it loses the work since the last checkpoint: the step's stream and the state each at
    /// 50 MB/s, plus half a minute. The pod's grace period and the local supervisor's patience.
    pub fn stop_seconds(&self) -> u64 {
        const RATE: u64 = 50_000_000;
        30 + self.step_bytes.div_ceil(RATE) + self.memoryx_bytes.div_ceil(RATE)
    }

    /// The input workers that feed engine `engine`: a block of [`Plan::input_workers_per_cs2`], in order.
    pub fn inputs_of(&self, engine: u32) -> std::ops::Range<u32> {
        crds::contract::input_workers_of(engine, self.input_workers_per_cs2)
    }

    /// Plans `spec` for engines of `sram_bytes` under a SwarmX tree of `fan_out` children per node, refusing a
    /// job whose shard cannot fit one engine.
    pub fn new(spec: &TrainingJobSpec, sram_bytes: u64, fan_out: u32) -> Result<Plan> {
        spec.validate()?;
        // A job that may go on with fewer CS-2s must fit them too: each then takes a larger shard.
        if spec.min_cs2() < spec.cs2 {
            let fewest = TrainingJobSpec { cs2: spec.min_cs2(), min_cs2: None, ..spec.clone() };
            if let Err(e) = Plan::new(&fewest, sram_bytes, fan_out) {
                return Err(Error::Plan(format!("on spec.minCs2 = {} CS-2s: {e}", fewest.cs2)));
            }
        }
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
                    dense_bytes: 4 * (s.dense_weights() + s.vector_len()) as u64,
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
        let peak_engine_bytes =
            activation_bytes + if execution_mode == ExecutionMode::Pipelined { all_weights } else { streaming_peak };
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
                (if s.tied_to.is_some() { 0 } else { layers[l].weights } + s.vector_len()) as u64
            })
            .sum();
        let opt = optimizer_values(spec.training.optimizer.kind);
        let memoryx = MemoryxPlan::for_spec(spec)?;
        let sparse_index_bytes: u64 =
            (0..n).filter(|&l| layout.linears[l].sparse).map(|l| 8 * layers[l].weights as u64).sum();
        let input_workers_per_cs2 = spec.data.workers.max(1);
        let coordinator_transit_bytes = coordinator_transit_bytes(&layout, &layers, execution_mode);
        Ok(Plan {
            cs2: spec.cs2,
            batch: spec.training.batch_size as usize,
            input_workers_per_cs2,
            input_workers: spec.cs2 * input_workers_per_cs2,
            shard,
            shard_tokens: shard * layout.tokens_per_sample(),
            micro_batch: spec.micro_batch() as usize,
            weight_bytes: layout.weight_bytes(),
            memoryx_bytes: 4 * stored * (1 + opt) + sparse_index_bytes,
            memoryx,
            coordinator_transit_bytes,
            engine_sram_bytes: sram_bytes,
            activation_bytes,
            peak_engine_bytes,
            execution_mode,
            swarmx: SwarmxTree::new(spec.cs2, fan_out),
            step_bytes: step_bytes(&layout, false),
            dense_equivalent_step_bytes: step_bytes(&layout, true),
            layers,
            weights_from: spec.model.from.clone(),
            sparse: spec.model.sparsity > 0.0,
        })
    }
}

/// Layers MemoryX's coordinator holds whole while streaming: the one on its way to SwarmX, the next gathered
/// from the servers behind it (one ahead, no more), and a layer's summed gradient on its way to the servers
/// (scattered from the buffer it arrived in, a few chunks copied ahead per server).
pub const COORDINATOR_WHOLE_LAYERS: u64 = 3;

/// The most MemoryX's coordinator holds at once beside its own server's slice. Streaming, it is
/// [`COORDINATOR_WHOLE_LAYERS`] of the largest layer as streamed, plus a tied layer's weight gradient, which waits
/// for its target's through the backward pass. Pipelined, a step's gradients from the engines' replicas arrive
/// together: the model's weights' worth. The operator reserves it for the MemoryX pod and the bench holds the
/// coordinator's process to it.
pub fn coordinator_transit_bytes(layout: &ModelLayout, layers: &[LayerPlan], mode: ExecutionMode) -> u64 {
    if mode == ExecutionMode::Pipelined {
        return layout.weight_bytes();
    }
    let largest = layers.iter().map(|l| l.stream_bytes).max().unwrap_or(0);
    let tied: u64 = layout.linears.iter().filter(|s| s.tied_to.is_some()).map(|s| 4 * s.dense_weights() as u64).sum();
    COORDINATOR_WHOLE_LAYERS * largest + tied
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
        let bias = s.vector_len() as u64;
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
