//! The engine side of a step: what a WSE does with the layers streamed to it. It keeps its shard's
//! activations resident from the forward pass to the backward pass, holds one layer's weights at a time (plus
//! room for the next, prefetched), and sends back weight gradients.
//!
//! The hardware it runs on is a small trait, [`EngineHw`]: an SRAM budget and a hook that sees every piece of
//! work, so a simulator can count bytes and FLOPs and charge time. `sim-wse` implements it; the tests here use
//! [`CountingHw`]. [`server`] puts an engine on the network.

pub mod server;

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::kernels::sparse::SparsePattern;
use crate::model::loss::{softmax_cross_entropy, LossSum};
use crate::model::{activation, linear, ModelLayout};
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
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
#[derive(Clone, Copy, Debug, Default, Serialize)]
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
}

struct StepState {
    train: bool,
    scale: f32,
    labels: Vec<u8>,
    /// Input to each layer computed so far: `x[0]` is the shard, `x[l]` the activation after layer `l − 1`.
    x: Vec<Mat>,
    /// Pre-activation of each hidden layer, kept for the activation's derivative.
    z: Vec<Mat>,
    logits: Option<Mat>,
    /// The delta of the layer the backward pass reaches next.
    delta: Option<Mat>,
}

/// The engine program: runs the model's layers on streamed weights over resident activations.
pub struct Wse<H: EngineHw> {
    name: String,
    hw: H,
    layout: ModelLayout,
    step: Option<StepState>,
    resident: u64,
    peak: u64,
    compute: Duration,
}

impl<H: EngineHw> Wse<H> {
    /// An engine named `name` (used in errors) that will run `layout` on `hw`.
    pub fn new(name: impl Into<String>, layout: ModelLayout, hw: H) -> Self {
        Wse { name: name.into(), hw, layout, step: None, resident: 0, peak: 0, compute: Duration::ZERO }
    }

    /// The hardware model, for reports specific to it.
    pub fn hw(&self) -> &H {
        &self.hw
    }

    fn state(&mut self) -> Result<&mut StepState> {
        self.step.as_mut().ok_or_else(|| Error::Protocol("a layer arrived before the step began".into()))
    }

    /// Checks that holding `extra` more bytes beside what is resident fits the SRAM.
    fn reserve(&mut self, extra: u64, what: impl FnOnce() -> String) -> Result<()> {
        let needed = self.resident + extra;
        let available = self.hw.sram_bytes();
        if needed > available {
            return Err(Error::OutOfSram { engine: self.name.clone(), what: what(), needed, available });
        }
        self.peak = self.peak.max(needed);
        Ok(())
    }

    fn check_shape(&self, stream: &LayerStream) -> Result<()> {
        let l = stream.layer;
        let shape = self.layout.linears[l];
        let fail = |msg: String| Err(Error::Protocol(format!("layer {l} ({:?} pass): {msg}", stream.pass)));
        if shape.sparse != matches!(stream.weights, WeightPayload::Sparse { .. } | WeightPayload::Mask(_)) {
            if !matches!(stream.weights, WeightPayload::Nothing) {
                return fail(format!("expected {} weights", if shape.sparse { "sparse" } else { "dense" }));
            }
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
        if stream.pass == Pass::Forward && stream.bias.len() != shape.outputs {
            return fail(format!("{} bias values, {} expected", stream.bias.len(), shape.outputs));
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
}

impl<H: EngineHw> EngineRole for Wse<H> {
    fn begin_step(&mut self, shard: Shard, grad_scale: f32, train: bool) -> Result<()> {
        if shard.inputs.rows != self.layout.inputs() || shard.inputs.cols != shard.labels.len() {
            return Err(Error::Protocol(format!(
                "shard of {}x{} inputs with {} labels does not fit a model of {} inputs",
                shard.inputs.rows,
                shard.inputs.cols,
                shard.labels.len(),
                self.layout.inputs()
            )));
        }
        self.step = None;
        self.resident = 0;
        let samples = shard.labels.len();
        let activations = self.layout.activation_bytes(samples);
        self.reserve(activations, || format!("the activations of a {samples}-sample shard"))?;
        self.resident = shard.inputs.bytes();
        self.hw.record(&Work::Received { bytes: shard.inputs.bytes() + samples as u64 });
        self.step = Some(StepState {
            train,
            scale: grad_scale,
            labels: shard.labels,
            x: vec![shard.inputs],
            z: Vec::new(),
            logits: None,
            delta: None,
        });
        Ok(())
    }

    fn forward(&mut self, stream: &LayerStream) -> Result<()> {
        let l = self.layer_of(stream)?;
        let last = l + 1 == self.layout.linears.len();
        let expected = self.state()?.x.len() - 1;
        if stream.pass != Pass::Forward || l != expected || self.state()?.logits.is_some() {
            return Err(Error::Protocol(format!("forward stream for layer {l} but the engine expects layer {expected}")));
        }
        self.check_shape(stream)?;
        let prefetch = if last { 0 } else { self.layout.forward_stream_bytes(l + 1) };
        let shape = self.layout.linears[l];
        let tokens = self.state()?.labels.len();
        let out_bytes = 4 * (shape.outputs * tokens) as u64 * if last { 1 } else { 2 };
        self.reserve(stream.wire_bytes() + prefetch + out_bytes, || {
            format!("layer {l}'s weights beside the resident activations and the next layer's prefetch")
        })?;
        self.hw.record(&Work::Received { bytes: stream.wire_bytes() });

        let started = Instant::now();
        let weights = stream.weights.weights().ok_or_else(|| Error::Protocol("weights missing".into()))?;
        let activation = self.layout.activation;
        let state = self.step.as_mut().ok_or_else(|| Error::Protocol("no step".into()))?;
        let x = &state.x[l];
        let z = linear::forward(weights, &stream.bias, x);
        let work = match &stream.weights {
            WeightPayload::Sparse { pattern, .. } => Work::SparseAxpy { pattern, tokens },
            _ => Work::Gemm { m: shape.outputs, n: tokens, k: shape.inputs },
        };
        self.resident += z.bytes();
        if last {
            state.logits = Some(z);
        } else {
            let mut a = Mat::zeros(z.rows, z.cols);
            activation::forward(activation, &z.data, &mut a.data);
            self.resident += a.bytes();
            state.z.push(z);
            state.x.push(a);
        }
        self.compute += started.elapsed();
        self.hw.record(&work);
        self.hw.record(&Work::Elementwise { ops: 2 * (shape.outputs * tokens) as u64 });
        Ok(())
    }

    fn loss(&mut self) -> Result<LossSum> {
        let started = Instant::now();
        let state = self.state()?;
        let logits = state
            .logits
            .take()
            .ok_or_else(|| Error::Protocol("loss requested before the forward pass reached the last layer".into()))?;
        let (sum, delta) = softmax_cross_entropy(&logits, &state.labels, state.scale);
        let ops = 6 * logits.data.len() as u64;
        if state.train {
            state.delta = Some(delta);
        } else {
            self.step = None;
            self.resident = 0;
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
        let expected = state.x.len().checked_sub(1);
        if stream.pass != Pass::Backward || state.delta.is_none() || expected != Some(l) {
            return Err(Error::Protocol(format!(
                "backward stream for layer {l} but the engine expects {}",
                expected.map_or("no backward stream".to_string(), |e| format!("layer {e}"))
            )));
        }
        self.check_shape(stream)?;
        self.reserve(stream.wire_bytes(), || format!("layer {l}'s backward stream beside the resident activations"))?;
        self.hw.record(&Work::Received { bytes: stream.wire_bytes() });

        let started = Instant::now();
        let shape = self.layout.linears[l];
        let activation = self.layout.activation;
        let state = self.step.as_mut().ok_or_else(|| Error::Protocol("no step".into()))?;
        let delta = state.delta.take().ok_or_else(|| Error::Protocol("no delta".into()))?;
        let x = state.x.pop().ok_or_else(|| Error::Protocol("no activation".into()))?;
        let tokens = x.cols;
        let mut works: Vec<Work<'_>> = Vec::with_capacity(3);
        let weights = match stream.weights.pattern() {
            Some(pattern) => {
                works.push(Work::SparseDot { pattern, tokens });
                linear::weight_grad_sparse(pattern, &x, &delta)
            }
            None => {
                works.push(Work::Gemm { m: shape.outputs, n: shape.inputs, k: tokens });
                linear::weight_grad_dense(&delta, &x)
            }
        };
        let bias = linear::bias_grad(&delta);
        let mut freed = x.bytes() + delta.bytes();
        if l > 0 {
            let w = stream.weights.weights().ok_or_else(|| Error::Protocol("weights missing".into()))?;
            let mut dx = linear::backward_input(w, shape.inputs, &delta);
            works.push(match &stream.weights {
                WeightPayload::Sparse { pattern, .. } => Work::SparseAxpy { pattern, tokens },
                _ => Work::Gemm { m: shape.inputs, n: tokens, k: shape.outputs },
            });
            let z = state.z.pop().ok_or_else(|| Error::Protocol("no pre-activation".into()))?;
            activation::backward(activation, &z.data, &mut dx.data);
            works.push(Work::Elementwise { ops: 2 * dx.data.len() as u64 });
            freed += z.bytes();
            // dx replaces the freed activation of the same shape.
            freed = freed.saturating_sub(dx.bytes());
            state.delta = Some(dx);
        } else {
            self.step = None;
        }
        self.resident = self.resident.saturating_sub(freed);
        if self.step.is_none() {
            self.resident = 0;
        }
        self.compute += started.elapsed();
        for w in &works {
            self.hw.record(w);
        }
        let grad = LayerGrad { layer: l, weights, bias };
        self.hw.record(&Work::Sent { bytes: grad.wire_bytes() });
        Ok(grad)
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
