//! The engine program shared by every model family: step order, shape checks, the SRAM budget, the loss and
//! the counters. A family ([`super::mlp`], [`super::gpt`]) is only its layers, behind the [`Net`] trait, so
//! the rules a step must follow are written (and enforced) once.

use std::time::{Duration, Instant};

use super::hw::{EngineHw, Work};
use super::linear::StreamedLinear;
use super::net::Net;
use super::role::{EngineRole, EngineStats, ShardWork};
use super::{gpt, llama, mlp, program};
use crate::model::loss::{LossSum, softmax_cross_entropy};
use crate::protocol::reduce::Pairwise;
use crate::protocol::{LayerGrad, LayerStream, Pass, WeightPayload};
use data::shard::Shard;
use errors::{Error, Result};
use kernels::tensor::Mat;
use plan::layout::{Arch, ModelLayout};
use plan::program::Program;

/// Where the engine is within a step.
struct StepState {
    train: bool,
    scale: f32,
    /// The labels of each micro-batch, in order.
    labels: Vec<Vec<u32>>,
    /// The unit the forward pass computes next.
    next_forward: usize,
    /// Whether the loss has been computed.
    loss_done: bool,
    /// The unit the backward pass computes next.
    next_backward: Option<usize>,
}

/// The engine program: runs the model's stream units on streamed weights over resident activations.
///
/// A shard may run as several micro-batches: each streamed layer is used for every micro-batch before the next
/// layer arrives, each micro-batch keeps its own activations, and their gradients are summed on the engine
/// ([`Pairwise`]), so one layer's bytes serve the whole shard.
pub struct Wse<H: EngineHw> {
    name: String,
    hw: H,
    layout: ModelLayout,
    /// One model family's activations per micro-batch (at least one); those past the step's count stay empty.
    nets: Vec<Box<dyn Net>>,
    /// The logits of each micro-batch's last forward pass until the loss takes them. Kept here rather than in
    /// each family: every family ends in them and the loss is computed here.
    logits: Vec<Mat>,
    step: Option<StepState>,
    peak: u64,
    compute: Duration,
    resident: bool,
}

impl<H: EngineHw> Wse<H> {
    /// An engine named `name` (used in errors) that will run `layout` on `hw`.
    pub fn new(name: impl Into<String>, layout: ModelLayout, hw: H) -> Self {
        let net = net_of(&layout);
        Wse {
            name: name.into(),
            hw,
            layout,
            nets: vec![net],
            logits: Vec::new(),
            step: None,
            peak: 0,
            compute: Duration::ZERO,
            resident: false,
        }
    }

    /// The hardware model, for reports specific to it.
    pub fn hw(&self) -> &H {
        &self.hw
    }

    /// The logits of the last forward pass (its first micro-batch's), before the loss consumes them: what
    /// decoding samples from.
    pub fn logits(&self) -> Option<&Mat> {
        self.logits.first()
    }

    /// Bytes of activations held right now, the logits included.
    fn resident_bytes(&self) -> u64 {
        self.nets.iter().map(|n| n.resident_bytes()).sum::<u64>() + self.logits.iter().map(Mat::bytes).sum::<u64>()
    }

    /// The step's micro-batches.
    fn micro_batches(&self) -> usize {
        self.step.as_ref().map_or(1, |s| s.labels.len())
    }

    fn state(&mut self) -> Result<&mut StepState> {
        self.step.as_mut().ok_or_else(|| Error::Protocol("a layer arrived before the step began".into()))
    }

    /// Checks that holding `extra` more bytes beside what is resident fits the SRAM.
    fn reserve(&mut self, extra: u64, what: impl FnOnce() -> String) -> Result<()> {
        let needed = self.resident_bytes() + extra;
        let available = self.hw.sram_bytes();
        if needed > available {
            return Err(Error::OutOfSram { engine: self.name.clone(), what: what(), needed, available });
        }
        self.peak = self.peak.max(needed);
        Ok(())
    }

    /// Notes what is held now beside `extra` streamed bytes, for the measured peak.
    fn note_peak(&mut self, extra: u64) {
        self.peak = self.peak.max(self.resident_bytes() + extra);
    }

    fn end_step(&mut self) {
        self.step = None;
        self.logits.clear();
        for net in &mut self.nets {
            net.clear();
        }
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
        if let Some(p) = stream.weights.pattern()
            && (p.outer(), p.inner()) != (outer, inner)
        {
            return fail(format!("mask is {}x{}, {outer}x{inner} expected", p.outer(), p.inner()));
        }
        let need_values = stream.pass == Pass::Forward || l > 0;
        if need_values && stream.weights.weights().is_none() {
            return fail("weight values are missing".into());
        }
        if stream.pass == Pass::Forward && stream.bias.len() != shape.vector_len() {
            return fail(format!("{} bias values, {} expected", stream.bias.len(), shape.vector_len()));
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
    fn begin_step(&mut self, shard: Shard, work: ShardWork) -> Result<()> {
        let per_sample = self.layout.tokens_per_sample();
        if shard.inputs.rows != self.layout.inputs()
            || shard.inputs.cols != shard.labels.len()
            || !shard.inputs.cols.is_multiple_of(per_sample)
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
        let classes = self.layout.outputs();
        if let Some(bad) = shard.labels.iter().find(|&&l| l as usize >= classes) {
            return Err(Error::Data(format!(
                "label {bad} is beyond the model's {classes} outputs; widen the model's last layer (or \
                 spec.model.vocabSize) to the data's classes"
            )));
        }
        // A language model's inputs are token ids, looked up in an embedding of `classes` (the vocabulary) rows.
        if self.layout.is_language_model()
            && let Some(bad) =
                shard.inputs.data.iter().find(|&&t| !(t >= 0.0 && (t as usize) < classes && t.fract() == 0.0))
        {
            return Err(Error::Data(format!(
                "token id {bad} is beyond the vocabulary of {classes}; set spec.model.vocabSize to the tokenizer's"
            )));
        }
        self.end_step();
        let samples = shard.labels.len() / per_sample;
        let activations = self.layout.activation_bytes(samples);
        self.reserve(activations, || format!("the activations of a {samples}-sample shard"))?;
        let bytes = shard.inputs.bytes() + 4 * shard.labels.len() as u64;
        let parts = shard.micro_batches(work.micro_batch * per_sample);
        while self.nets.len() < parts.len() {
            self.nets.push(net_of(&self.layout));
        }
        let mut labels = Vec::with_capacity(parts.len());
        for (net, part) in self.nets.iter_mut().zip(parts) {
            net.begin(part.inputs)?;
            labels.push(part.labels);
        }
        self.hw.record(&Work::Received { bytes });
        self.step = Some(StepState {
            train: work.train,
            scale: work.grad_scale,
            labels,
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
            return Err(Error::Protocol(format!(
                "forward stream for layer {l} but the engine expects layer {expected}"
            )));
        }
        let tokens: usize = state.labels.iter().map(Vec::len).sum();
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
        let unit = StreamedLinear { layer: l, shape, stream };
        let micro = self.micro_batches();
        for net in &mut self.nets[..micro] {
            if let Some(logits) = net.forward(unit, &mut works)? {
                self.logits.push(logits);
            }
        }
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
        let logits = std::mem::take(&mut self.logits);
        let state = self.step.as_mut().ok_or_else(|| Error::Protocol("no step".into()))?;
        if logits.len() != state.labels.len() {
            return Err(Error::Protocol("loss requested before the forward pass reached the last layer".into()));
        }
        let mut sum = Pairwise::default();
        let mut ops = 0;
        for ((logits, labels), net) in logits.iter().zip(&state.labels).zip(&mut self.nets) {
            let (part, delta) = softmax_cross_entropy(logits, labels, state.scale);
            sum.push(part)?;
            ops += 6 * logits.data.len() as u64;
            if state.train {
                net.start_backward(delta);
            }
        }
        state.loss_done = true;
        if state.train {
            state.next_backward = units.checked_sub(1);
        } else {
            self.end_step();
        }
        let sum = sum.finish()?.unwrap_or_default();
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
        let unit = StreamedLinear { layer: l, shape, stream };
        let micro = self.micro_batches();
        let mut sum = Pairwise::default();
        for net in &mut self.nets[..micro] {
            let (weights, bias) = net.backward(unit, &mut works)?;
            sum.push(LayerGrad { layer: l, weights, bias })?;
        }
        let grad = sum.finish()?.ok_or_else(|| Error::Protocol("a step of no micro-batches".into()))?;
        self.compute += started.elapsed();
        self.record_all(&works);
        if l == 0 {
            self.end_step();
        } else {
            self.state()?.next_backward = Some(l - 1);
        }
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

/// An empty model family for `layout`: one micro-batch's activations.
fn net_of(layout: &ModelLayout) -> Box<dyn Net> {
    match layout.arch {
        Arch::Mlp => Box::new(mlp::MlpNet::new(layout)),
        Arch::Gpt(g) => Box::new(gpt::GptNet::new(g, layout)),
        Arch::Llama(g) => Box::new(llama::LlamaNet::new(g)),
        Arch::Program(_) => {
            let program = layout.program.clone().unwrap_or_else(|| std::sync::Arc::new(Program::default()));
            let constants = program::shared_constants(&program);
            Box::new(program::ProgramNet::new(program, constants))
        }
    }
}
