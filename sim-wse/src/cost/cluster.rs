//! The cluster model: N engines training data-parallel, MemoryX streaming each layer's weights at its
//! bandwidth, SwarmX broadcasting them to every engine and reducing the gradients on the way back.
//!
//! Choices, since the seeds give the architecture but not every timing:
//! - The global batch is split evenly: each engine computes on `global / N` tokens. Its compute time per layer
//!   comes from [`super`]'s mapping, so fewer tokens per engine means shorter AXPYs against the same partial-sum
//!   steps (Amdahl's law tightening as the cluster grows).
//! - Weights are broadcast, not divided: every engine receives the whole stream at MemoryX's bandwidth, and the
//!   reduced gradients leave at the same rate (reduction is built into the transport). Streaming and computing
//!   overlap because the next layer is prefetched, so a layer-pass costs `max(stream in, stream out, compute)`.
//! - The tree adds latency only to fill the broadcast and drain the reduction, once per step:
//!   `2 × depth × hop latency`, with `depth = ⌈log_fanout N⌉` (at least one hop).
//! - Left out: the optimizer's update in MemoryX (elementwise, sharded, overlapped), input data (separate
//!   MemoryX shards), attention's activation-by-activation products, and whether the batch fits the SRAM (the
//!   plan checks that for real jobs).

use plan::layout::ModelLayout;
use serde::Serialize;

use super::{GemmCycles, dense_gemm, elementwise_cycles, sample, sort_heaviest_first, sparse_gemm_sorted};
use plan::preset::{self, EngineModel};

/// One weight layer as the cost model needs it: its shape and, when masked, how its non-zeros spread over
/// the features each of its products deals to the mesh rows.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWork {
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// Whether the layer streams only a mask's non-zeros (and their indices).
    pub sparse: bool,
    /// Weights streamed and multiplied.
    pub nnz: u64,
    /// Whether the backward pass computes the input gradient (every layer but the first).
    pub input_grad: bool,
    /// Non-zeros per input feature, heaviest first: the rows of the forward product.
    input_counts: Vec<u32>,
    /// Non-zeros per output feature, heaviest first: the rows of the backward products.
    output_counts: Vec<u32>,
}

/// Cycles of one layer's passes on one engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LayerCycles {
    /// The forward product.
    pub forward_gemm: GemmCycles,
    /// The weight gradient (and, past the first layer, the input gradient) products.
    pub backward_gemm: GemmCycles,
    /// The activation after the forward product.
    pub forward_elementwise: u64,
    /// The activation's derivative in the backward pass.
    pub backward_elementwise: u64,
}

impl LayerCycles {
    /// Forward-pass cycles including the activation.
    pub fn forward(&self) -> u64 {
        self.forward_gemm.total() + self.forward_elementwise
    }

    /// Backward-pass cycles including the activation's derivative.
    pub fn backward(&self) -> u64 {
        self.backward_gemm.total() + self.backward_elementwise
    }

    /// Cycles of the products alone: what sparsity accelerates.
    pub fn gemm(&self) -> u64 {
        self.forward_gemm.total() + self.backward_gemm.total()
    }
}

impl LayerWork {
    /// A dense layer.
    pub fn dense(inputs: usize, outputs: usize, input_grad: bool) -> Self {
        LayerWork {
            inputs,
            outputs,
            sparse: false,
            nnz: (inputs * outputs) as u64,
            input_grad,
            input_counts: vec![outputs as u32; inputs],
            output_counts: vec![inputs as u32; outputs],
        }
    }

    /// A layer masked at `density` by a seeded random mask, its per-feature counts drawn from the mask's
    /// distribution (see [`sample`]) so even GPT-3-sized layers are costed from counts, not averages.
    pub fn sampled(inputs: usize, outputs: usize, density: f64, seed: u64, input_grad: bool) -> Self {
        let mut input_counts = sample::line_counts(inputs, outputs, density, seed);
        let mut output_counts = sample::line_counts(outputs, inputs, density, !seed);
        let nnz = ((density.clamp(0.0, 1.0)) * (inputs * outputs) as f64).round() as u64;
        sort_heaviest_first(&mut input_counts);
        sort_heaviest_first(&mut output_counts);
        LayerWork { inputs, outputs, sparse: true, nnz, input_grad, input_counts, output_counts }
    }

    /// Cycles of the layer's forward and backward passes over `tokens` tokens, as the engine program records
    /// them (see `runtime::engine`): forward product and activation; weight gradient; input gradient and the
    /// activation's derivative past the first layer.
    pub fn cycles(&self, engine: &EngineModel, tokens: usize) -> LayerCycles {
        let (i, o, t) = (self.inputs, self.outputs, tokens);
        let (forward_gemm, weight_grad, input_grad) = if self.sparse {
            let fwd = sparse_gemm_sorted(engine, o, &self.input_counts, t);
            let bwd = sparse_gemm_sorted(engine, i, &self.output_counts, t);
            (fwd, bwd, bwd)
        } else {
            (dense_gemm(engine, o, t, i), dense_gemm(engine, o, i, t), dense_gemm(engine, i, t, o))
        };
        let mut backward_gemm = weight_grad;
        let mut backward_elementwise = 0;
        if self.input_grad {
            backward_gemm = add(backward_gemm, input_grad);
            backward_elementwise = elementwise_cycles(engine, 2 * (i * t) as u64);
        }
        LayerCycles {
            forward_gemm,
            forward_elementwise: elementwise_cycles(engine, 2 * (o * t) as u64),
            backward_gemm,
            backward_elementwise,
        }
    }

    /// Bytes of the forward stream, in the runtime's wire format: 4-byte values, and for a mask a 4-byte index
    /// per value plus line ids and pointers; then the bias.
    pub fn forward_bytes(&self) -> u64 {
        let index = if self.sparse { 4 * self.nnz + 4 * (2 * self.outputs as u64 + 1) } else { 0 };
        4 * self.nnz + index + 4 * self.outputs as u64
    }

    /// Bytes of the backward stream: the mask by input column, and the values when the input gradient needs them.
    pub fn backward_bytes(&self) -> u64 {
        let index = if self.sparse { 4 * self.nnz + 4 * (2 * self.inputs as u64 + 1) } else { 0 };
        index + if self.input_grad { 4 * self.nnz } else { 0 }
    }

    /// Bytes of the gradients sent back: one per streamed weight, plus the bias gradient.
    pub fn gradient_bytes(&self) -> u64 {
        4 * self.nnz + 4 * self.outputs as u64
    }
}

fn add(a: GemmCycles, b: GemmCycles) -> GemmCycles {
    GemmCycles {
        axpy: a.axpy + b.axpy,
        mean_axpy: a.mean_axpy + b.mean_axpy,
        partial_sums: a.partial_sums + b.partial_sums,
    }
}

/// A model's step as the cluster runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// The weight layers of one repeated unit (the whole MLP, or one transformer block).
    pub layers: Vec<LayerWork>,
    /// How many times the unit repeats in the model.
    pub repeat: usize,
    /// Tokens per step over the whole cluster.
    pub global_tokens: usize,
    /// Tokens per sample, to report samples per second (1 for an MLP, the sequence length for a transformer).
    pub tokens_per_sample: usize,
    /// Classes of the softmax loss at the end of the forward pass (0: not costed).
    pub loss_classes: usize,
}

impl Workload {
    /// The step of a training job: its layers, masked as the job says, its global batch.
    pub fn from_spec(spec: &crds::TrainingJobSpec) -> Self {
        let layout = ModelLayout::from_spec(&spec.model);
        let density = 1.0 - layout.sparsity;
        let layers = layout
            .linears
            .iter()
            .enumerate()
            .map(|(l, s)| {
                if s.sparse {
                    let seed = spec.training.seed ^ (l as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut w = LayerWork::sampled(s.inputs, s.outputs, density, seed, l > 0);
                    // Stream the count MemoryX will actually send.
                    w.nnz = layout.expected_weights(l) as u64;
                    w
                } else {
                    LayerWork::dense(s.inputs, s.outputs, l > 0)
                }
            })
            .collect();
        Workload {
            layers,
            repeat: 1,
            global_tokens: spec.training.batch_size as usize,
            tokens_per_sample: 1,
            loss_classes: layout.outputs(),
        }
    }

    /// Weights the model streams per step forward (non-zeros when masked), over all repeats.
    pub fn weights(&self) -> u64 {
        self.repeat as u64 * self.layers.iter().map(|l| l.nnz).sum::<u64>()
    }
}

/// The appliance a workload runs on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Cluster {
    /// The engine every CS-2 carries.
    pub engine: EngineModel,
    /// CS-2 systems, one engine each.
    pub engines: u32,
    /// MemoryX bandwidth in bytes per second.
    pub memoryx_bandwidth: f64,
    /// Children per SwarmX node.
    pub swarmx_fanout: u32,
    /// Seconds per SwarmX hop.
    pub swarmx_hop_latency_s: f64,
}

/// What a step costs on a cluster: time, where it goes, and throughput.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The engine generation.
    pub engine: &'static str,
    /// Engines in the cluster.
    pub engines: u32,
    /// Tokens (samples for an MLP) each engine computes per step.
    pub tokens_per_engine: usize,
    /// Simulated seconds per training step.
    pub step_s: f64,
    /// Seconds the engines compute (products and element-wise work), the same on every engine.
    pub compute_s: f64,
    /// Seconds MemoryX's link is busy streaming weights in or gradients out.
    pub stream_s: f64,
    /// Seconds the engines wait on the stream because it outlasts the computation it overlaps.
    pub stream_wait_s: f64,
    /// Seconds of SwarmX tree fill and drain.
    pub fabric_latency_s: f64,
    /// Share of the step spent computing.
    pub compute_share: f64,
    /// Share of the step spent waiting on weights or gradients (stream wait plus tree latency).
    pub streaming_share: f64,
    /// Training samples per second over the cluster.
    pub samples_per_s: f64,
    /// Tokens per second over the cluster.
    pub tokens_per_s: f64,
}

impl Cluster {
    /// `engines` engines of `engine` with the seeds' MemoryX bandwidth and the assumed SwarmX tree.
    pub fn new(engine: EngineModel, engines: u32) -> Self {
        Cluster {
            engine,
            engines: engines.max(1),
            memoryx_bandwidth: preset::MEMORYX_BANDWIDTH,
            swarmx_fanout: crds::contract::DEFAULT_FAN_OUT,
            swarmx_hop_latency_s: preset::SWARMX_HOP_LATENCY_S,
        }
    }

    /// Hops from MemoryX to an engine: the depth of the very tree the plan lays out for this many engines.
    pub fn tree_depth(&self) -> u32 {
        crds::contract::SwarmxTree::new(self.engines, self.swarmx_fanout).depth()
    }

    /// Tokens each engine computes for a global batch of `global` tokens.
    pub fn tokens_per_engine(&self, global: usize) -> usize {
        (global / self.engines.max(1) as usize).max(1)
    }

    /// The step time of `work` on this cluster.
    pub fn step(&self, work: &Workload) -> Estimate {
        let e = &self.engine;
        let tokens = self.tokens_per_engine(work.global_tokens);
        let secs = |cycles: u64| cycles as f64 / e.clock_hz;
        let bw = self.memoryx_bandwidth;
        let (mut step, mut compute, mut stream, mut wait) = (0.0, 0.0, 0.0, 0.0);
        let mut pass = |c: f64, bytes_in: u64, bytes_out: u64| {
            let (s_in, s_out) = (bytes_in as f64 / bw, bytes_out as f64 / bw);
            let link = s_in.max(s_out);
            step += c.max(link);
            compute += c;
            stream += s_in + s_out;
            wait += (link - c).max(0.0);
        };
        for l in &work.layers {
            let c = l.cycles(e, tokens);
            pass(secs(c.forward()), l.forward_bytes(), 0);
            pass(secs(c.backward()), l.backward_bytes(), l.gradient_bytes());
        }
        let loss = secs(elementwise_cycles(e, 6 * (work.loss_classes * tokens) as u64));
        let repeat = work.repeat.max(1) as f64;
        let (unit_step, unit_compute) = (step * repeat, compute * repeat);
        let fabric = 2.0 * self.tree_depth() as f64 * self.swarmx_hop_latency_s;
        let step_s = unit_step + loss + fabric;
        let tokens_all = (tokens * self.engines as usize) as f64;
        Estimate {
            engine: e.name,
            engines: self.engines,
            tokens_per_engine: tokens,
            step_s,
            compute_s: unit_compute + loss,
            stream_s: stream * repeat,
            stream_wait_s: wait * repeat,
            fabric_latency_s: fabric,
            compute_share: (unit_compute + loss) / step_s,
            streaming_share: (wait * repeat + fabric) / step_s,
            samples_per_s: tokens_all / work.tokens_per_sample.max(1) as f64 / step_s,
            tokens_per_s: tokens_all / step_s,
        }
    }
}

/// Simulated step time and throughput of a training job on the appliance its spec asks for: the figure
/// `wsctl plan` and `summary.json` show beside the CPU's.
pub fn estimate(spec: &crds::TrainingJobSpec) -> Estimate {
    Cluster::new(preset::model(spec.engine.preset), spec.cs2).step(&Workload::from_spec(spec))
}
