//! The engine side of a step: what a WSE does with the layers streamed to it. It keeps its shard's
//! activations resident from the forward pass to the backward pass, holds one layer's weights at a time (plus
//! room for the next, prefetched), and sends back weight gradients.
//!
//! The hardware it runs on is a small trait, [`EngineHw`]: an SRAM budget and a hook that sees every piece of
//! work, so a simulator can count bytes and FLOPs and charge time. `sim-wse` implements it; the tests here use
//! [`CountingHw`]. [`server`] puts an engine on the network.

mod gpt;
mod mlp;
pub mod server;

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::kernels::sparse::SparsePattern;
use crate::model::loss::{softmax_cross_entropy, LossSum};
use crate::model::{linear, Arch, LinearShape, ModelLayout};
use crate::protocol::{LayerGrad, LayerStream, Pass, WeightPayload};
use crate::tensor::Mat;

/// A piece of work the engine did, reported to the hardware model.
#[derive(Clone, Copy, Debug)]
pub enum Work<'a> {
    /// Bytes arrived from SwarmX (weights or data).
    Received {
        /// How many.
        bytes: u64,
    },
    /// Bytes sent towards SwarmX (gradients, losses).
    Sent {
        /// How many.
        bytes: u64,
    },
    /// A dense `m × k` by `k × n` product.
    Gemm {
        /// Rows of the result.
        m: usize,
        /// Columns of the result.
        n: usize,
        /// The summed dimension.
        k: usize,
    },
    /// One AXPY over `tokens` per non-zero of `pattern`.
    SparseAxpy {
        /// The mask, so a cost model can see how the non-zeros spread over lines.
        pattern: &'a SparsePattern,
        /// Length of every AXPY.
        tokens: usize,
    },
    /// One dot product over `tokens` per non-zero of `pattern`.
    SparseDot {
        /// The mask.
        pattern: &'a SparsePattern,
        /// Length of every dot product.
        tokens: usize,
    },
    /// Element-wise work (activations, loss), `ops` floating-point operations.
    Elementwise {
        /// Floating-point operations.
        ops: u64,
    },
}

impl Work<'_> {
    /// Floating-point operations actually performed.
    pub fn flops(&self) -> u64 {
        match *self {
            Work::Gemm { m, n, k } => 2 * (m * n * k) as u64,
            Work::SparseAxpy { pattern, tokens } | Work::SparseDot { pattern, tokens } => {
                2 * (pattern.nnz() * tokens) as u64
            }
            Work::Elementwise { ops } => ops,
            Work::Received { .. } | Work::Sent { .. } => 0,
        }
    }

    /// Floating-point operations the same work would take with dense weights.
    pub fn dense_flops(&self) -> u64 {
        match *self {
            Work::SparseAxpy { pattern, tokens } | Work::SparseDot { pattern, tokens } => {
                2 * (pattern.outer() * pattern.inner() * tokens) as u64
            }
            other => other.flops(),
        }
    }
}

/// What an engine has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct EngineCounters {
    /// Bytes received (weights streamed in, plus data).
    pub bytes_received: u64,
    /// Bytes sent (gradients and loss reports).
    pub bytes_sent: u64,
    /// FLOPs the work would take with dense weights.
    pub dense_equivalent_flops: u64,
    /// FLOPs actually done: zeros are skipped.
    pub flops: u64,
    /// Seconds a real wafer would have taken, when the hardware model has a cost model (0 otherwise).
    pub simulated_s: f64,
}

impl EngineCounters {
    /// Adds one piece of work: the accounting every hardware model shares.
    pub fn count(&mut self, work: &Work<'_>) {
        match *work {
            Work::Received { bytes } => self.bytes_received += bytes,
            Work::Sent { bytes } => self.bytes_sent += bytes,
            _ => {
                self.flops += work.flops();
                self.dense_equivalent_flops += work.dense_flops();
            }
        }
    }
}

/// The hardware an engine runs on.
pub trait EngineHw: Send {
    /// On-chip memory for activations and streamed weights, in bytes.
    fn sram_bytes(&self) -> u64;
    /// Sees every piece of work, to count it and charge its time.
    fn record(&mut self, work: &Work<'_>);
    /// Totals so far.
    fn counters(&self) -> EngineCounters;
}

/// The simplest hardware: a budget and counters, no cost model. For tests and the runtime's own use.
#[derive(Clone, Debug)]
pub struct CountingHw {
    sram: u64,
    counters: EngineCounters,
}

impl CountingHw {
    /// An engine with `sram` bytes of memory.
    pub fn new(sram: u64) -> Self {
        CountingHw { sram, counters: EngineCounters::default() }
    }
}

impl EngineHw for CountingHw {
    fn sram_bytes(&self) -> u64 {
        self.sram
    }
    fn record(&mut self, work: &Work<'_>) {
        self.counters.count(work);
    }
    fn counters(&self) -> EngineCounters {
        self.counters
    }
}

/// One engine's share of a step: its samples, features first.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// `inputs × samples` activations of the input layer.
    pub inputs: Mat,
    /// The class of each sample.
    pub labels: Vec<u8>,
}

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

/// The model-specific half of the engine program: the math of each stream unit over the activations the
/// engine keeps. [`Wse`] does everything the model families share — step order, shape checks, the SRAM
/// budget, the loss and the counters — so a family is only its layers.
trait Net: Send {
    /// Takes a new shard's input matrix, dropping whatever the previous step left.
    fn begin(&mut self, inputs: Mat) -> Result<()>;
    /// Runs unit `l` forward with `stream`'s weights and notes the work done.
    fn forward<'s>(&mut self, l: usize, stream: &'s LayerStream, works: &mut Vec<Work<'s>>) -> Result<()>;
    /// The logits once the last unit has run.
    fn logits(&self) -> Option<&Mat>;
    /// Hands over the logits for the loss.
    fn take_logits(&mut self) -> Option<Mat>;
    /// Starts the backward pass from the gradient of the loss with respect to the logits.
    fn start_backward(&mut self, d_logits: Mat);
    /// Runs unit `l` backward and returns its weight and bias gradients (in the stream's weight order).
    fn backward<'s>(
        &mut self,
        l: usize,
        shape: LinearShape,
        stream: &'s LayerStream,
        works: &mut Vec<Work<'s>>,
    ) -> Result<(Vec<f32>, Vec<f32>)>;
    /// Bytes of activations held right now.
    fn resident_bytes(&self) -> u64;
    /// Drops everything held.
    fn clear(&mut self);
}

/// Where the engine is within a step.
struct StepState {
    train: bool,
    scale: f32,
    labels: Vec<u8>,
    /// The unit the forward pass computes next.
    next_forward: usize,
    /// Whether the loss has been computed.
    loss_done: bool,
    /// The unit the backward pass computes next.
    next_backward: Option<usize>,
}

/// The engine program: runs the model's stream units on streamed weights over resident activations.
pub struct Wse<H: EngineHw> {
    name: String,
    hw: H,
    layout: ModelLayout,
    net: Box<dyn Net>,
    step: Option<StepState>,
    peak: u64,
    compute: Duration,
    resident: bool,
}

/// Forward through a linear unit with the stream's weights, noting the kernel it took.
fn linear_forward<'s>(stream: &'s LayerStream, x: &Mat, works: &mut Vec<Work<'s>>) -> Result<Mat> {
    let weights = stream.weights.weights().ok_or_else(|| Error::Protocol("weight values are missing".into()))?;
    let y = linear::forward(weights, &stream.bias, x);
    works.push(match &stream.weights {
        WeightPayload::Sparse { pattern, .. } => Work::SparseAxpy { pattern, tokens: x.cols },
        _ => Work::Gemm { m: y.rows, n: x.cols, k: x.rows },
    });
    Ok(y)
}

/// Backward through a linear unit whose input was `x`, given the gradient `dy` of its output: the weight
/// gradient (only at the mask's positions when sparse), the bias gradient when the unit has a bias, and —
/// when `need_dx` — the gradient of the input.
fn linear_backward<'s>(
    stream: &'s LayerStream,
    shape: LinearShape,
    x: &Mat,
    dy: &Mat,
    need_dx: bool,
    works: &mut Vec<Work<'s>>,
) -> Result<(Vec<f32>, Vec<f32>, Option<Mat>)> {
    let tokens = x.cols;
    let weights = match stream.weights.pattern() {
        Some(pattern) => {
            works.push(Work::SparseDot { pattern, tokens });
            linear::weight_grad_sparse(pattern, x, dy)
        }
        None => {
            works.push(Work::Gemm { m: shape.outputs, n: shape.inputs, k: tokens });
            linear::weight_grad_dense(dy, x)
        }
    };
    let bias = if shape.bias { linear::bias_grad(dy) } else { Vec::new() };
    let dx = if need_dx {
        let w = stream.weights.weights().ok_or_else(|| Error::Protocol("weight values are missing".into()))?;
        works.push(match &stream.weights {
            WeightPayload::Sparse { pattern, .. } => Work::SparseAxpy { pattern, tokens },
            _ => Work::Gemm { m: shape.inputs, n: tokens, k: shape.outputs },
        });
        Some(linear::backward_input(w, shape.inputs, dy))
    } else {
        None
    };
    Ok((weights, bias, dx))
}

impl<H: EngineHw> Wse<H> {
    /// An engine named `name` (used in errors) that will run `layout` on `hw`.
    pub fn new(name: impl Into<String>, layout: ModelLayout, hw: H) -> Self {
        let net: Box<dyn Net> = match layout.arch {
            Arch::Mlp => Box::new(mlp::MlpNet::new(&layout)),
            Arch::Gpt(g) => Box::new(gpt::GptNet::new(g)),
        };
        Wse { name: name.into(), hw, layout, net, step: None, peak: 0, compute: Duration::ZERO, resident: false }
    }

    /// The hardware model, for reports specific to it.
    pub fn hw(&self) -> &H {
        &self.hw
    }

    /// The logits of the last forward pass, before the loss consumes them: what decoding samples from.
    pub fn logits(&self) -> Option<&Mat> {
        self.net.logits()
    }

    fn state(&mut self) -> Result<&mut StepState> {
        self.step.as_mut().ok_or_else(|| Error::Protocol("a layer arrived before the step began".into()))
    }

    /// Checks that holding `extra` more bytes beside what is resident fits the SRAM.
    fn reserve(&mut self, extra: u64, what: impl FnOnce() -> String) -> Result<()> {
        let needed = self.net.resident_bytes() + extra;
        let available = self.hw.sram_bytes();
        if needed > available {
            return Err(Error::OutOfSram { engine: self.name.clone(), what: what(), needed, available });
        }
        self.peak = self.peak.max(needed);
        Ok(())
    }

    /// Notes what is held now beside `extra` streamed bytes, for the measured peak.
    fn note_peak(&mut self, extra: u64) {
        self.peak = self.peak.max(self.net.resident_bytes() + extra);
    }

    fn end_step(&mut self) {
        self.step = None;
        self.net.clear();
    }

    fn check_shape(&self, stream: &LayerStream) -> Result<()> {
        let l = stream.layer;
        let shape = self.layout.linears[l];
        let fail = |msg: String| Err(Error::Protocol(format!("layer {l} ({:?} pass): {msg}", stream.pass)));
        if shape.sparse != matches!(stream.weights, WeightPayload::Sparse { .. } | WeightPayload::Mask(_))
            && !matches!(stream.weights, WeightPayload::Nothing)
        {
            return fail(format!("expected {} weights", if shape.sparse { "sparse" } else { "dense" }));
        }
        // Forward patterns are stored by output row, backward patterns by input column.
        let (outer, inner) = match stream.pass {
            Pass::Forward => (shape.outputs, shape.inputs),
            Pass::Backward => (shape.inputs, shape.outputs),
        };
        match &stream.weights {
            WeightPayload::Dense(v) if v.len() != shape.dense_weights() => {
                return fail(format!("{} dense weights, {} expected", v.len(), shape.dense_weights()));
            }
            WeightPayload::Sparse { pattern, values } if values.len() != pattern.nnz() => {
                return fail(format!("{} values for {} non-zeros", values.len(), pattern.nnz()));
            }
            _ => {}
        }
        if let Some(p) = stream.weights.pattern() {
            if (p.outer(), p.inner()) != (outer, inner) {
                return fail(format!("mask is {}x{}, {outer}x{inner} expected", p.outer(), p.inner()));
            }
        }
        let need_values = stream.pass == Pass::Forward || l > 0;
        if need_values && stream.weights.weights().is_none() {
            return fail("weight values are missing".into());
        }
        if stream.pass == Pass::Forward && stream.bias.len() != shape.bias_len() {
            return fail(format!("{} bias values, {} expected", stream.bias.len(), shape.bias_len()));
        }
        Ok(())
    }

    fn layer_of(&self, stream: &LayerStream) -> Result<usize> {
        if stream.layer >= self.layout.linears.len() {
            return Err(Error::Protocol(format!(
                "stream for layer {} but the model has {} layers",
                stream.layer,
                self.layout.linears.len()
            )));
        }
        Ok(stream.layer)
    }

    fn record_all(&mut self, works: &[Work<'_>]) {
        for w in works {
            self.hw.record(w);
        }
    }
}

impl<H: EngineHw> EngineRole for Wse<H> {
    fn begin_step(&mut self, shard: Shard, grad_scale: f32, train: bool) -> Result<()> {
        let per_sample = self.layout.tokens_per_sample();
        if shard.inputs.rows != self.layout.inputs()
            || shard.inputs.cols != shard.labels.len()
            || shard.inputs.cols % per_sample != 0
        {
            return Err(Error::Protocol(format!(
                "shard of {}x{} inputs with {} labels does not fit a model of {} input rows and {per_sample} \
                 tokens per sample",
                shard.inputs.rows,
                shard.inputs.cols,
                shard.labels.len(),
                self.layout.inputs()
            )));
        }
        self.end_step();
        let samples = shard.labels.len() / per_sample;
        let activations = self.layout.activation_bytes(samples);
        self.reserve(activations, || format!("the activations of a {samples}-sample shard"))?;
        let bytes = shard.inputs.bytes() + shard.labels.len() as u64;
        self.net.begin(shard.inputs)?;
        self.hw.record(&Work::Received { bytes });
        self.step = Some(StepState {
            train,
            scale: grad_scale,
            labels: shard.labels,
            next_forward: 0,
            loss_done: false,
            next_backward: None,
        });
        Ok(())
    }

    fn forward(&mut self, stream: &LayerStream) -> Result<()> {
        let l = self.layer_of(stream)?;
        let last = l + 1 == self.layout.linears.len();
        let state = self.state()?;
        let expected = state.next_forward;
        if stream.pass != Pass::Forward || l != expected || state.loss_done {
            return Err(Error::Protocol(format!("forward stream for layer {l} but the engine expects layer {expected}")));
        }
        let tokens = state.labels.len();
        self.check_shape(stream)?;
        let prefetch = if last { 0 } else { self.layout.forward_stream_bytes(l + 1) };
        let shape = self.layout.linears[l];
        let out_bytes = 4 * (shape.outputs * tokens) as u64 * if last { 1 } else { 2 };
        self.reserve(stream.wire_bytes() + prefetch + out_bytes, || {
            format!("layer {l}'s weights beside the resident activations and the next layer's prefetch")
        })?;
        if !self.resident {
            self.hw.record(&Work::Received { bytes: stream.wire_bytes() });
        }

        let started = Instant::now();
        let mut works = Vec::with_capacity(4);
        self.net.forward(l, stream, &mut works)?;
        self.compute += started.elapsed();
        self.note_peak(stream.wire_bytes() + prefetch);
        self.record_all(&works);
        self.state()?.next_forward += 1;
        Ok(())
    }

    fn loss(&mut self) -> Result<LossSum> {
        let units = self.layout.linears.len();
        let state = self.state()?;
        if state.next_forward != units || state.loss_done {
            return Err(Error::Protocol("loss requested before the forward pass reached the last layer".into()));
        }
        let started = Instant::now();
        let logits = self
            .net
            .take_logits()
            .ok_or_else(|| Error::Protocol("loss requested before the forward pass reached the last layer".into()))?;
        let state = self.step.as_mut().ok_or_else(|| Error::Protocol("no step".into()))?;
        let (sum, delta) = softmax_cross_entropy(&logits, &state.labels, state.scale);
        let ops = 6 * logits.data.len() as u64;
        state.loss_done = true;
        if state.train {
            state.next_backward = units.checked_sub(1);
            self.net.start_backward(delta);
        } else {
            self.end_step();
        }
        self.compute += started.elapsed();
        self.hw.record(&Work::Elementwise { ops });
        self.hw.record(&Work::Sent { bytes: 24 });
        Ok(sum)
    }

    fn backward(&mut self, stream: &LayerStream) -> Result<LayerGrad> {
        let l = self.layer_of(stream)?;
        let state = self.state()?;
        if !state.train {
            return Err(Error::Protocol("backward stream during an evaluation step".into()));
        }
        let expected = state.next_backward;
        if stream.pass != Pass::Backward || expected != Some(l) {
            return Err(Error::Protocol(format!(
                "backward stream for layer {l} but the engine expects {}",
                expected.map_or("no backward stream".to_string(), |e| format!("layer {e}"))
            )));
        }
        self.check_shape(stream)?;
        self.reserve(stream.wire_bytes(), || format!("layer {l}'s backward stream beside the resident activations"))?;
        if !self.resident {
            self.hw.record(&Work::Received { bytes: stream.wire_bytes() });
        }

        let started = Instant::now();
        let shape = self.layout.linears[l];
        let mut works = Vec::with_capacity(4);
        let (weights, bias) = self.net.backward(l, shape, stream, &mut works)?;
        self.compute += started.elapsed();
        self.record_all(&works);
        if l == 0 {
            self.end_step();
        } else {
            self.state()?.next_backward = Some(l - 1);
        }
        let grad = LayerGrad { layer: l, weights, bias };
        self.hw.record(&Work::Sent { bytes: grad.wire_bytes() });
        Ok(grad)
    }

    fn set_resident(&mut self, resident: bool) {
        self.resident = resident;
    }

    fn stats(&self) -> EngineStats {
        EngineStats {
            counters: self.hw.counters(),
            peak_sram_bytes: self.peak,
            sram_bytes: self.hw.sram_bytes(),
            compute_s: self.compute.as_secs_f64(),
        }
    }
}
