//! MemoryX as the coordinator sees it: the model's masks, and its state spread over weight servers
//! ([`super::weight_server`]). A layer streams as the servers' slices put back together (and reordered by column for
//! a sparse layer's backward pass); a gradient is reordered, joined with a tied layer's, cut into the same
//! slices and handed to each server's optimizer. With one server in this process it is the whole MemoryX of
//! earlier versions, lending its weights to a pipelined replica without copying them.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crds::{OptimizerSpec, ScheduleSpec};

use super::checkpoint::{self, Tensors};
use super::manifest;
use super::slice::{LayerLengths, LayerTensors, SliceId};
use super::tied::TiedGrad;
use super::weight_server::{LocalSlice, Masking, WeightServer, layer_lengths, mask, random_mask};
use crate::optim::Recipe;
use crate::protocol::codec::chunk::Recycled;
use crate::protocol::{LayerGrad, LayerStream, Pass, WeightPayload};
use errors::{Error, Result};
use kernels::sparse::SparsePattern;
use plan::layout::ModelLayout;

/// What the training loop needs from MemoryX; a gRPC client implements it the same way as [`MemoryX`].
///
/// Methods take `&self` so the next layer can be streamed while the current one's gradient is applied.
pub trait WeightStore: Sync {
    /// Layer `layer`'s weights for the forward pass: non-zeros tagged by output row when sparse.
    fn forward_stream(&self, layer: usize) -> Result<LayerStream>;
    /// Layer `layer`'s weights for the backward pass, ordered by input column; the first layer sends only
    /// its mask (or nothing when dense), since no delta flows past it.
    fn backward_stream(&self, layer: usize) -> Result<LayerStream>;
    /// Runs the optimizer on layer `grad.layer` with the gradients summed over all engines for step `step`
    /// (0-based). A step's gradient is applied exactly once: a repeat or a skip is refused.
    fn apply(&self, grad: &LayerGrad, step: u64) -> Result<()>;
    /// Hands over layer `grad.layer`'s summed gradient of step `step` as soon as it arrives, to be applied
    /// with the rest of the step's by [`WeightStore::commit`]: nothing changes until then, so a step that fails
    /// midway leaves the state as it was, yet no one holds a whole step's gradients at once.
    fn stage(&self, grad: LayerGrad, step: u64) -> Result<()>;
    /// Makes every gradient staged for step `step` part of the state (one per layer, refused otherwise); each
    /// server applies a layer's when the layer is next read, beside the next step's forward pass.
    fn commit(&self, step: u64) -> Result<()>;
    /// The whole state (weights and optimizer moments) and its step, as a checkpoint file's bytes: what
    /// pipelined engines are primed with.
    fn state(&self, job: &str) -> Result<(u64, Vec<u8>)>;
    /// Takes back a state of the same model from pipelined engines; refused whole if it does not fit.
    fn set_state(&self, bytes: &[u8]) -> Result<u64>;
}

/// The static mask of a sparse layer in both orders, and the map between them.
#[derive(Debug)]
struct Masks {
    by_row: Arc<SparsePattern>,
    by_col: Arc<SparsePattern>,
    /// For each non-zero in column order, its position in row order.
    col_to_row: Vec<u32>,
}

/// MemoryX: the coordinator's view of the model's state over its weight servers. What the training loop, a
/// pipelined engine's replica and the sampler drive.
pub struct MemoryX {
    layout: ModelLayout,
    masks: Vec<Option<Masks>>,
    /// Each layer's whole tensors' lengths, in [`checkpoint::KINDS`] order.
    lengths: Vec<LayerLengths>,
    /// Slice `i` of every layer lives on `servers[i]`.
    servers: Vec<Arc<dyn WeightServer>>,
    /// Server 0 when it is in this process: it can lend its weights and report its tier.
    local: Option<Arc<LocalSlice>>,
    /// Updates applied to each layer, as the coordinator counts them: every fetch names it, so a server that
    /// restarted is refused rather than trusted.
    updates: Vec<AtomicU64>,
    /// A tied layer's weight gradient of the step in flight, waiting for the gradient of the layer whose weights
    /// it shares.
    tied_grad: TiedGrad,
}

impl std::fmt::Debug for MemoryX {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryX").field("layers", &self.lengths.len()).field("servers", &self.servers.len()).finish()
    }
}

/// Whether every value is finite. `x - x` is 0 for a finite `x` and NaN otherwise, so a block's sum of them is 0
/// exactly when the whole block is finite: a loop without early exits, which the compiler vectorises (the
/// check runs over every gradient of every step). Multiversioned so the loop runs sixteen lanes wide where the
/// CPU allows.
#[allow(clippy::eq_op)] // `x - x` is the test itself.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn all_finite(values: &[f32]) -> bool {
    values.chunks(4096).all(|block| {
        let mut acc = [0.0f32; 8];
        let (body, tail) = block.split_at(block.len() / 8 * 8);
        for group in body.chunks_exact(8) {
            for (a, &x) in acc.iter_mut().zip(group) {
                *a += x - x;
            }
        }
        acc.iter().all(|&a| a == 0.0) && tail.iter().all(|x| x.is_finite())
    })
}

/// [`all_finite`] on all cores for a slice worth splitting: the check reads every gradient of every step, the
/// size of the model, before any is applied.
fn finite(values: &[f32]) -> bool {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 16;
    if values.len() < 2 * PIECE {
        return all_finite(values);
    }
    values.par_chunks(PIECE).all(all_finite)
}

/// Runs `f` on every server, all at once when there are several (each may be a network round trip or a disk
/// read), and returns their results in server order.
fn on_each<T: Send>(
    servers: &[Arc<dyn WeightServer>],
    f: impl Fn(usize, &dyn WeightServer) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    on_each_with(servers, (0..servers.len()).collect(), |s, i| f(i, s))
}

/// [`on_each`], handing server `i` its own `inputs[i]` (a part of a buffer they fill together).
fn on_each_with<T: Send, I: Send>(
    servers: &[Arc<dyn WeightServer>],
    inputs: Vec<I>,
    f: impl Fn(&dyn WeightServer, I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if servers.len() != inputs.len() {
        return Err(Error::Protocol(format!("{} inputs for {} weight servers", inputs.len(), servers.len())));
    }
    if let ([only], [_]) = (servers, inputs.as_slice()) {
        let input =
            inputs.into_iter().next().ok_or_else(|| Error::Protocol("no input for the weight server".into()))?;
        return Ok(vec![f(only.as_ref(), input)?]);
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            servers.iter().zip(inputs).map(|(s, input)| scope.spawn(move || f(s.as_ref(), input))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Protocol("a weight server's call panicked".into()))))
            .collect()
    })
}

/// Each server's place in a layer's whole `weights` and `bias`, in server order: the slices' ranges, which
/// follow one another from the start to the end.
fn places<'a>(
    servers: &[Arc<dyn WeightServer>],
    weights: &'a mut [f32],
    bias: &'a mut [f32],
) -> Result<Vec<(&'a mut [f32], &'a mut [f32])>> {
    let (lens_w, lens_b) = (weights.len(), bias.len());
    let (mut rest_w, mut rest_b) = (weights, bias);
    let mut out = Vec::with_capacity(servers.len());
    for s in servers {
        let (rw, rb) = (s.slice().range(lens_w), s.slice().range(lens_b));
        if rw.start != lens_w - rest_w.len() || rb.start != lens_b - rest_b.len() {
            return Err(Error::Protocol(format!("{}'s slice does not follow the one before it", s.slice())));
        }
        let uncovered = || Error::Protocol(format!("{}'s slice runs past the layer's end", s.slice()));
        let (w, tail_w) = std::mem::take(&mut rest_w).split_at_mut_checked(rw.len()).ok_or_else(uncovered)?;
        let (b, tail_b) = std::mem::take(&mut rest_b).split_at_mut_checked(rb.len()).ok_or_else(uncovered)?;
        (rest_w, rest_b) = (tail_w, tail_b);
        out.push((w, b));
    }
    if !rest_w.is_empty() || !rest_b.is_empty() {
        return Err(Error::Protocol("the weight servers' slices do not cover the layer".into()));
    }
    Ok(out)
}

/// The whole of a tensor from its slices, in server order (the one slice itself when there is one).
fn join(mut parts: Vec<Vec<f32>>) -> Vec<f32> {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for p in parts {
        out.extend_from_slice(&p);
    }
    out
}

impl MemoryX {
    /// The whole model in this process, initialised from `seed`: masks drawn at the layout's sparsity, weights
    /// uniform with each layer's standard deviation, biases and moments at zero. A tied layer stores nothing of
    /// its own. What local runs, tests and every pipelined engine's replica use.
    pub fn new(
        layout: ModelLayout,
        optimizer: OptimizerSpec,
        schedule: ScheduleSpec,
        total_steps: u64,
        seed: u64,
    ) -> Self {
        let masking = Masking::Random(seed);
        let lengths = layer_lengths(&layout, &optimizer, &masking);
        let masks = (0..layout.linears.len()).map(|l| random_mask(&layout, seed, l)).collect();
        let recipe = Recipe { optimizer, schedule, total_steps, seed, from: None };
        let shard = Arc::new(LocalSlice::in_memory(&layout, &lengths, recipe, SliceId::WHOLE));
        Self::with_masks(layout, masks, lengths, vec![shard.clone()], Some(shard))
    }

    /// An empty replica of the model `recipe` trains, in memory, for an engine that holds the whole model
    /// (pipelined execution): its masks are the run's (chosen as [`Masking::of`] says), its values come with the
    /// state MemoryX primes it with.
    pub fn replica(layout: ModelLayout, recipe: &Recipe) -> Result<Self> {
        let masking = Masking::of(recipe);
        let lengths = layer_lengths(&layout, &recipe.optimizer, &masking);
        let masks = (0..layout.linears.len()).map(|l| mask(&layout, &masking, l)).collect::<Result<_>>()?;
        let shard = Arc::new(LocalSlice::in_memory(&layout, &lengths, recipe.clone(), SliceId::WHOLE));
        Ok(Self::with_masks(layout, masks, lengths, vec![shard.clone()], Some(shard)))
    }

    /// The model over `count` weight servers all in this process, each keeping its slice as `storage` says
    /// (its memory budget and disk tier, its checkpoint directory): an in-process run of a job with
    /// `spec.memoryx.servers`, and the way tests compare any number of servers with one.
    pub fn sharded(
        layout: ModelLayout,
        recipe: &Recipe,
        count: u32,
        storage: &dyn Fn(SliceId) -> super::weight_server::Storage,
    ) -> Result<Self> {
        let masking = Masking::of(recipe);
        let lengths = layer_lengths(&layout, &recipe.optimizer, &masking);
        let shards = (0..count.max(1))
            .map(|index| {
                let slice = SliceId { index, count: count.max(1) };
                LocalSlice::new(&layout, &lengths, recipe.clone(), slice, storage(slice)).map(Arc::new)
            })
            .collect::<Result<Vec<_>>>()?;
        let local = shards.first().cloned();
        let servers = shards.into_iter().map(|s| s as Arc<dyn WeightServer>).collect();
        Self::over(layout, &masking, lengths, servers, local)
    }

    /// The coordinator of a model `layout` (masked as `masking` says) whose layers, of whole `lengths`, are
    /// spread over `servers` (slice `i` on `servers[i]`); `local` is server 0 when it runs in this process.
    pub fn over(
        layout: ModelLayout,
        masking: &Masking,
        lengths: Vec<LayerLengths>,
        servers: Vec<Arc<dyn WeightServer>>,
        local: Option<Arc<LocalSlice>>,
    ) -> Result<Self> {
        let masks = (0..layout.linears.len()).map(|l| mask(&layout, masking, l)).collect::<Result<_>>()?;
        Ok(Self::with_masks(layout, masks, lengths, servers, local))
    }

    /// [`MemoryX::over`] with each layer's mask (by rows) already chosen: a SwarmX root's view of the servers,
    /// with the masks the coordinator chose (its `Mask` answers).
    pub fn with_masks(
        layout: ModelLayout,
        masks: Vec<Option<SparsePattern>>,
        lengths: Vec<LayerLengths>,
        servers: Vec<Arc<dyn WeightServer>>,
        local: Option<Arc<LocalSlice>>,
    ) -> Self {
        let masks = masks
            .into_iter()
            .map(|m| {
                m.map(|by_row| {
                    let (by_col, col_to_row) = by_row.transpose();
                    Masks { by_row: Arc::new(by_row), by_col: Arc::new(by_col), col_to_row }
                })
            })
            .collect();
        let updates = (0..lengths.len()).map(|_| AtomicU64::new(0)).collect();
        MemoryX { layout, masks, lengths, servers, local, updates, tied_grad: TiedGrad::default() }
    }

    /// Each layer's mask by output row (`None`: dense or tied): what the coordinator tells a SwarmX root that
    /// streams from the servers itself.
    pub fn masks(&self) -> Vec<Option<Arc<SparsePattern>>> {
        self.masks.iter().map(|m| m.as_ref().map(|m| m.by_row.clone())).collect()
    }

    /// Takes every layer to be at `step` (updates applied): the view of a SwarmX root, whose servers the
    /// coordinator commits. A server at another step refuses the fetches that name this one.
    pub fn expect_step(&self, step: u64) {
        for u in &self.updates {
            u.store(step, Ordering::SeqCst);
        }
    }

    /// How many weight servers hold the state.
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// Server 0, when it runs in this process.
    pub fn local(&self) -> Option<&Arc<LocalSlice>> {
        self.local.as_ref()
    }

    fn lengths(&self, layer: usize) -> Result<LayerLengths> {
        self.lengths
            .get(layer)
            .copied()
            .ok_or_else(|| Error::Protocol(format!("layer {layer} requested but the model has {}", self.lengths.len())))
    }

    fn at(&self, layer: usize) -> u64 {
        self.updates.get(layer).map_or(0, |u| u.load(Ordering::SeqCst))
    }

    /// Layer `layer`'s weights and bias, put back together from every server's slice: each server's part is
    /// written straight into its place in the whole, all servers at once.
    fn gather(&self, layer: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let [weights, bias, ..] = self.lengths(layer)?;
        let step = self.at(layer);
        if let [only] = self.servers.as_slice() {
            return only.fetch(layer, step);
        }
        // Zeroed first (each server writes its part in place).
        let (mut w, mut b) = (Recycled::layers().zeroed(weights), Recycled::layers().zeroed(bias));
        let places = places(&self.servers, &mut w, &mut b)?;
        on_each_with(&self.servers, places, |s, (w, b)| s.fetch_into(layer, step, w, b))?;
        Ok((w, b))
    }

    /// The first `n` weights of layer `target`: a tied layer's matrix.
    fn tied_values(&self, target: usize, n: usize) -> Result<Vec<f32>> {
        let (mut w, _) = self.gather(target)?;
        if w.len() < n {
            return Err(Error::Protocol(format!(
                "layer {target} has {} weights, fewer than the {n} a tied layer reads",
                w.len()
            )));
        }
        w.truncate(n);
        Ok(w)
    }

    /// Weights a gradient of layer `layer` carries: the whole matrix for a tied layer, else what it stores.
    fn grad_weights(&self, layer: usize) -> Result<usize> {
        let shape = self.layout.linears.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        Ok(if shape.tied_to.is_some() { shape.dense_weights() } else { self.lengths(layer)?[0] })
    }

    /// Refuses a gradient that does not fit layer `grad.layer` (wrong lengths, NaN or infinity).
    fn check_grad(&self, grad: &LayerGrad) -> Result<()> {
        let own_weights = self.grad_weights(grad.layer)?;
        let bias = self.lengths(grad.layer)?[1];
        if grad.weights.len() != own_weights || grad.bias.len() != bias {
            return Err(Error::Protocol(format!(
                "gradient for layer {} has {} weight and {} bias values; {} and {} expected",
                grad.layer,
                grad.weights.len(),
                grad.bias.len(),
                own_weights,
                bias
            )));
        }
        if !finite(&grad.weights) || !finite(&grad.bias) {
            return Err(Error::Protocol(format!(
                "gradient for layer {} holds NaN or infinity; lower the learning rate",
                grad.layer
            )));
        }
        Ok(())
    }

    /// Checks a step's gradients against the model (lengths, NaN, infinity) before any is applied, so a
    /// malformed one is refused with the state untouched.
    fn check_grads(&self, grads: &[LayerGrad]) -> Result<()> {
        grads.iter().try_for_each(|g| self.check_grad(g))
    }

    /// Optimizer steps applied so far (the step the next gradient must be for).
    pub fn step(&self) -> u64 {
        self.at(0)
    }

    /// Each server's own count of the steps it has applied (or why it could not say): what the driver checks
    /// after a failed step, to tell a server that restarted from one that was only slow.
    pub fn server_steps(&self) -> Vec<Result<u64>> {
        self.servers.iter().map(|s| s.step()).collect()
    }

    /// Runs `f` on layer `layer`'s stream for `pass`, lending it the stored weights instead of copying them
    /// when one server in this process holds them in memory and they travel in stored order (dense layers,
    /// and sparse ones forward), and putting them back after. For a pipelined engine's replica, whose layers
    /// never leave the engine. `f` must not use this store.
    pub fn with_stream<T>(&self, layer: usize, pass: Pass, f: impl FnOnce(&LayerStream) -> Result<T>) -> Result<T> {
        let shape = *self.layout.linears.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        let masks = self.masks.get(layer).and_then(Option::as_ref);
        let lendable = shape.tied_to.is_none() && (pass == Pass::Forward || (layer > 0 && masks.is_none()));
        let resident = |local: &LocalSlice| local.resident(layer);
        if let (true, [_], Some(local)) =
            (lendable, self.servers.as_slice(), self.local.as_ref().filter(|l| resident(l)))
        {
            let lent = local.lend(layer, |w, b| {
                let values = std::mem::take(w);
                let weights = match masks {
                    Some(m) => WeightPayload::Sparse { pattern: m.by_row.clone(), values },
                    None => WeightPayload::Dense(values),
                };
                let bias = if pass == Pass::Forward { std::mem::take(b) } else { Vec::new() };
                let stream = LayerStream { layer, pass, weights, bias };
                let out = f(&stream);
                let LayerStream { weights, bias, .. } = stream;
                if let WeightPayload::Dense(v) | WeightPayload::Sparse { values: v, .. } = weights {
                    *w = v;
                }
                if pass == Pass::Forward {
                    *b = bias;
                }
                out
            })?;
            if let Some(out) = lent {
                return out;
            }
            return Err(Error::Protocol(format!("layer {layer} could not be lent")));
        }
        let stream = match pass {
            Pass::Forward => self.forward_stream(layer)?,
            Pass::Backward => self.backward_stream(layer)?,
        };
        f(&stream)
    }

    /// The model it stores.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// Weights actually stored (non-zeros for sparse layers) plus biases.
    pub fn parameters(&self) -> usize {
        self.lengths.iter().map(|l| l[0] + l[1]).sum()
    }

    /// Each layer's weights as a dense row-major matrix, for tests and inspection.
    pub fn dense_weights(&self, layer: usize) -> Result<Vec<f32>> {
        let shape = *self.layout.linears.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        Ok(match (self.masks.get(layer).and_then(Option::as_ref), shape.tied_to) {
            (_, Some(target)) => self.tied_values(target, shape.dense_weights())?,
            (Some(m), None) => m.by_row.to_dense(&self.gather(layer)?.0).data,
            (None, None) => self.gather(layer)?.0,
        })
    }
}

impl WeightStore for MemoryX {
    fn forward_stream(&self, layer: usize) -> Result<LayerStream> {
        let shape = *self.layout.linears.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        let (values, bias) = self.gather(layer)?;
        let weights = match (self.masks.get(layer).and_then(Option::as_ref), shape.tied_to) {
            (_, Some(target)) => WeightPayload::Dense(self.tied_values(target, shape.dense_weights())?),
            (Some(m), None) => WeightPayload::Sparse { pattern: m.by_row.clone(), values },
            (None, None) => WeightPayload::Dense(values),
        };
        Ok(LayerStream { layer, pass: Pass::Forward, weights, bias })
    }

    fn backward_stream(&self, layer: usize) -> Result<LayerStream> {
        let shape = *self.layout.linears.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        let masks = self.masks.get(layer).and_then(Option::as_ref);
        let weights = match (masks, layer, shape.tied_to) {
            (_, l, Some(target)) if l > 0 => WeightPayload::Dense(self.tied_values(target, shape.dense_weights())?),
            (Some(m), 0, _) => WeightPayload::Mask(m.by_col.clone()),
            (Some(m), _, _) => {
                let (values, _) = self.gather(layer)?;
                WeightPayload::Sparse {
                    pattern: m.by_col.clone(),
                    values: m.col_to_row.iter().map(|&k| values[k as usize]).collect(),
                }
            }
            (None, 0, _) => WeightPayload::Nothing,
            (None, _, _) => WeightPayload::Dense(self.gather(layer)?.0),
        };
        Ok(LayerStream { layer, pass: Pass::Backward, weights, bias: Vec::new() })
    }

    fn apply(&self, grad: &LayerGrad, step: u64) -> Result<()> {
        self.update_with(grad, step, false)
    }

    fn stage(&self, grad: LayerGrad, step: u64) -> Result<()> {
        let reordered = self.prepare(&grad, step, false)?;
        if let [only] = self.servers.as_slice() {
            // One server holds the whole layer: it is handed the gradient's own buffer (a dense layer's) or the
            // reordered one to keep, with no copy.
            let own = matches!(&reordered, Cow::Borrowed(w) if std::ptr::eq(*w, &grad.weights[..]));
            let reordered = (!own).then(|| reordered.into_owned());
            let LayerGrad { layer, weights, bias } = grad;
            let weights = match reordered {
                Some(v) => {
                    Recycled::layers().give(weights);
                    v
                }
                None => weights,
            };
            return only.stage_owned(layer, step, weights, bias);
        }
        let staged = self.to_each_slice(&reordered, &grad.bias, |s, w, b| s.stage(grad.layer, step, w, b));
        // Each server has taken its slice (a copy, or on the wire): the buffer serves the next gradient.
        drop(reordered);
        Recycled::layers().give(grad.weights);
        staged
    }

    fn commit(&self, step: u64) -> Result<()> {
        on_each(&self.servers, |_, s| s.commit(step))?;
        for u in &self.updates {
            u.store(step + 1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn state(&self, job: &str) -> Result<(u64, Vec<u8>)> {
        let (step, tensors) = self.snapshot()?;
        Ok((step, checkpoint::to_bytes(step, &tensors, job)?))
    }

    fn set_state(&self, bytes: &[u8]) -> Result<u64> {
        let (step, tensors) = checkpoint::from_bytes(bytes, "the engines' replica")?;
        self.restore(step, &tensors)?;
        Ok(step)
    }
}

impl MemoryX {
    /// Applies a step's gradients, every layer's, checked first as a whole: a malformed one (wrong lengths, NaN
    /// or infinity) is refused before any layer is updated, and each is checked once. The engines' replicas take
    /// their steps this way.
    pub fn apply_step(&self, grads: &[LayerGrad], step: u64) -> Result<()> {
        self.check_grads(grads)?;
        grads.iter().try_for_each(|g| self.update_with(g, step, true))
    }

    /// [`WeightStore::apply`]; `checked` says [`MemoryX::check_grad`] has passed (lengths and values).
    fn update_with(&self, grad: &LayerGrad, step: u64, checked: bool) -> Result<()> {
        let reordered = self.prepare(grad, step, checked)?;
        self.to_each_slice(&reordered, &grad.bias, |s, w, b| s.update(grad.layer, step, w, b))?;
        self.updates[grad.layer].store(step + 1, Ordering::SeqCst);
        Ok(())
    }

    /// Hands each server its slice of a layer's prepared weight gradient and of its bias gradient: what staging
    /// and applying a gradient share.
    fn to_each_slice(
        &self,
        weights: &[f32],
        bias: &[f32],
        f: impl Fn(&dyn WeightServer, &[f32], &[f32]) -> Result<()> + Sync,
    ) -> Result<()> {
        let n = self.servers.len() as u32;
        on_each(&self.servers, |i, s| {
            let w = &weights[plan::memoryx::slice_range(weights.len(), i as u32, n)];
            let b = &bias[plan::memoryx::slice_range(bias.len(), i as u32, n)];
            f(s, w, b)
        })?;
        Ok(())
    }

    /// Checks layer `grad.layer`'s gradient of `step` (its step always; its lengths and values unless `checked`
    /// says [`MemoryX::check_grad`] has passed) and brings it into stored order (row order for a sparse layer), joined with a tied layer's: what is cut into
    /// the servers' slices. A dense layer's gradient is already in stored order and is borrowed, not copied (a
    /// step's gradients are the size of the model).
    fn prepare<'g>(&self, grad: &'g LayerGrad, step: u64, checked: bool) -> Result<Cow<'g, [f32]>> {
        let shape = *self.layout.linears.get(grad.layer).ok_or_else(|| {
            Error::Protocol(format!(
                "gradient for layer {} but the model has {} layers",
                grad.layer,
                self.lengths.len()
            ))
        })?;
        let at = self.at(grad.layer);
        if step != at {
            return Err(Error::Protocol(format!(
                "gradient of step {step} for layer {} refused: the layer expects step {at}",
                grad.layer
            )));
        }
        if !checked {
            self.check_grad(grad)?;
        }
        let mut reordered = match self.masks.get(grad.layer).and_then(Option::as_ref) {
            Some(m) => {
                let mut g = vec![0.0; grad.weights.len()];
                for (kc, &kr) in m.col_to_row.iter().enumerate() {
                    g[kr as usize] = grad.weights[kc];
                }
                Cow::Owned(g)
            }
            None if shape.tied_to.is_some() => Cow::Borrowed(&[][..]),
            None => Cow::Borrowed(&grad.weights[..]),
        };
        // The shared weights are updated once, with the target layer, from the sum of both gradients.
        self.tied_grad.exchange(grad, shape.tied_to, step, &mut reordered)?;
        Ok(reordered)
    }
}

impl MemoryX {
    /// Every weight, bias and optimizer moment as named tensors, with the steps applied so far, put back
    /// together from every server. Taken between steps, so all layers agree on the step.
    pub fn snapshot(&self) -> Result<(u64, Tensors)> {
        let mut out = Vec::new();
        let mut step = None;
        for l in 0..self.lengths.len() {
            let parts = on_each(&self.servers, |_, s| s.tensors(l))?;
            let mut kinds: [Vec<Vec<f32>>; 6] = Default::default();
            for (at, tensors) in parts {
                if *step.get_or_insert(at) != at {
                    return Err(Error::Protocol("a snapshot was taken in the middle of a step".into()));
                }
                for (k, t) in tensors.into_iter().enumerate() {
                    kinds[k].push(t);
                }
            }
            for (kind, parts) in checkpoint::KINDS.iter().zip(kinds) {
                let values = join(parts);
                if !values.is_empty() {
                    out.push((checkpoint::tensor_name(l, kind), values));
                }
            }
        }
        Ok((step.unwrap_or(0), out))
    }

    /// Puts back a snapshot taken of the same model (same layout, seed and optimizer), refusing one that does
    /// not fit before anything is changed.
    pub fn restore(&self, step: u64, tensors: &Tensors) -> Result<()> {
        let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let empty = Vec::new();
        let mut staged = Vec::new();
        for (l, want) in self.lengths.iter().enumerate() {
            let mut parts: [&Vec<f32>; 6] = [&empty; 6];
            for (k, kind) in checkpoint::KINDS.iter().enumerate() {
                let key = checkpoint::tensor_name(l, kind);
                parts[k] = match (find(&key), want[k]) {
                    (Some(v), n) if v.len() == n => v,
                    (None, 0) => &empty,
                    (found, n) => {
                        return Err(Error::Protocol(format!(
                            "checkpoint tensor {key} has {} values but this job's model needs {n}; the checkpoint \
                             belongs to another model, seed, sparsity or optimizer",
                            found.map_or(0, |v| v.len())
                        )));
                    }
                };
            }
            staged.push(parts);
        }
        let n = self.servers.len() as u32;
        for (l, parts) in staged.into_iter().enumerate() {
            on_each(&self.servers, |i, s| {
                let slice: LayerTensors = parts.map(|t| t[plan::memoryx::slice_range(t.len(), i as u32, n)].to_vec());
                s.put(l, step, slice)
            })?;
            self.updates[l].store(step, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Writes every server's slice of the state after `step` updates into [`manifest::slice_dir`]`(base, i)`,
    /// taking it from the server one layer at a time (the slices are written side by side, and none is ever held
    /// whole); returns their checksums, in server order, for the manifest.
    pub fn write_slices(&self, base: &Path, step: u64, job: &str) -> Result<Vec<u32>> {
        let count = self.servers.len() as u32;
        on_each(&self.servers, |i, s| {
            let slice = SliceId { index: i as u32, count };
            let mut w = manifest::SliceWriter::create(
                &manifest::slice_dir(base, slice.index),
                step,
                job,
                slice,
                manifest::slice_tensors(&self.lengths, slice),
            )?;
            for l in 0..self.lengths.len() {
                let (at, tensors) = s.tensors(l)?;
                if at != step {
                    return Err(Error::Protocol(format!(
                        "{slice} holds layer {l} after {at} updates, not {step}: no checkpoint of a step in flight"
                    )));
                }
                for t in tensors.iter().filter(|t| !t.is_empty()) {
                    w.push(t)?;
                }
            }
            w.finish()
        })
    }

    /// Puts back the sliced checkpoint of `step` whose slices (under `base`, laid out as [`MemoryX::write_slices`]
    /// writes them) have `checksums`, however many servers wrote it: each layer is joined from the slices and
    /// cut again for this store's servers, one layer at a time. Every slice is checked (at most `max_bytes`
    /// each) and every tensor's length against the model before anything is replaced.
    pub fn read_slices(&self, base: &Path, step: u64, checksums: &[u32], max_bytes: u64) -> Result<()> {
        let readers = manifest::open_slices(base, step, checksums, max_bytes)?;
        for (l, want) in self.lengths.iter().enumerate() {
            for (k, kind) in checkpoint::KINDS.iter().enumerate() {
                let name = checkpoint::tensor_name(l, kind);
                let have: usize = readers.iter().map(|r| r.len_of(&name).unwrap_or(0)).sum();
                if have != want[k] {
                    return Err(Error::Protocol(format!(
                        "the checkpoint of step {step} holds {have} values of {name} but this job's model needs {}; it \
                         belongs to another model, seed, sparsity or optimizer",
                        want[k]
                    )));
                }
            }
        }
        let n = self.servers.len() as u32;
        for l in 0..self.lengths.len() {
            let whole: Vec<Vec<f32>> = checkpoint::KINDS
                .iter()
                .map(|kind| manifest::join_tensor(&readers, &checkpoint::tensor_name(l, kind)))
                .collect::<Result<_>>()?;
            on_each(&self.servers, |i, s| {
                let mut slice: LayerTensors = Default::default();
                for (part, t) in slice.iter_mut().zip(&whole) {
                    *part = t[plan::memoryx::slice_range(t.len(), i as u32, n)].to_vec();
                }
                s.put(l, step, slice)
            })?;
            self.updates[l].store(step, Ordering::SeqCst);
        }
        Ok(())
    }

    /// What each server holds and has moved.
    pub fn usage(&self) -> Vec<Result<super::weight_server::ServerUsage>> {
        self.servers.iter().map(|s| s.usage()).collect()
    }
}

#[cfg(test)]
mod finite_tests {
    #[test]
    fn all_finite_finds_any_nan_or_infinity() {
        let mut v = vec![1.5f32; 10_000];
        assert!(super::all_finite(&v));
        for (at, bad) in [(0, f32::NAN), (5_000, f32::INFINITY), (9_999, f32::NEG_INFINITY), (8_197, f32::NAN)] {
            let keep = v[at];
            v[at] = bad;
            assert!(!super::all_finite(&v), "{bad} at {at}");
            v[at] = keep;
        }
    }
}
