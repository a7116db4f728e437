//! The in-process MemoryX: every layer's weights, mask and optimizer moments, streamed out per pass and
//! updated in place from the summed gradients. Each layer has its own lock, so the next layer can stream while
//! the current one's gradient is applied.

use std::sync::{Arc, RwLock};

use crds::{OptimizerSpec, ScheduleSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checkpoint::{self, Tensors};
use super::tied::TiedGrad;
use crate::error::{Error, Result};
use crate::kernels::sparse::SparsePattern;
use crate::model::{LinearShape, ModelLayout};
use crate::optim::{self, OptState};
use crate::protocol::{LayerGrad, LayerStream, Pass, WeightPayload};

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

/// One layer as MemoryX holds it: the values it streams, the optimizer state it updates them with, and the
/// count that keeps every step's gradient applied exactly once.
#[derive(Debug)]
struct LayerState {
    shape: LinearShape,
    /// Dense: row-major `outputs × inputs`. Sparse: non-zeros in row-pattern order.
    weights: Vec<f32>,
    bias: Vec<f32>,
    weights_opt: OptState,
    bias_opt: OptState,
    masks: Option<Masks>,
    /// Optimizer steps applied so far: the next gradient must be for exactly this step.
    updates: u64,
}

impl LayerState {
    /// The tensors a checkpoint holds of this layer, in [`checkpoint::KINDS`] order: naming them in one place
    /// keeps a snapshot and its restore in step.
    fn saved(&self) -> [&Vec<f32>; 6] {
        [&self.weights, &self.bias, &self.weights_opt.m, &self.weights_opt.v, &self.bias_opt.m, &self.bias_opt.v]
    }

    /// The same tensors, to be replaced by a restore.
    fn saved_mut(&mut self) -> [&mut Vec<f32>; 6] {
        let LayerState { weights, bias, weights_opt, bias_opt, .. } = self;
        [weights, bias, &mut weights_opt.m, &mut weights_opt.v, &mut bias_opt.m, &mut bias_opt.v]
    }
}

/// The in-process MemoryX: what a job's coordinator runs, and what a pipelined engine keeps its replica in.
#[derive(Debug)]
pub struct MemoryX {
    layout: ModelLayout,
    optimizer: OptimizerSpec,
    schedule: ScheduleSpec,
    total_steps: u64,
    layers: Vec<RwLock<LayerState>>,
    /// A tied layer's weight gradient of the step in flight, waiting for the gradient of the layer whose weights
    /// it shares.
    tied_grad: TiedGrad,
}

/// Whether every value is finite. `x - x` is 0 for a finite `x` and NaN otherwise, so a block's sum of them is 0
/// exactly when the whole block is finite: a loop without early exits, which the compiler vectorises (the
/// check runs over every gradient of every step).
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

/// Seed of layer `l`'s mask and initial values, derived from the job seed so layers differ.
fn layer_seed(seed: u64, l: usize, salt: u64) -> u64 {
    seed ^ (l as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt
}

/// The mask of layer `l` of `layout` initialised from `seed` (stored by output row), or `None` for a dense
/// layer. Public because a checkpoint stores only a sparse layer's non-zeros, in this mask's order: an export
/// draws the same mask again to put them back in place.
pub fn mask(layout: &ModelLayout, seed: u64, l: usize) -> Option<SparsePattern> {
    let shape = layout.linears.get(l)?;
    let density = 1.0 - if shape.sparse { layout.sparsity } else { 0.0 };
    shape.sparse.then(|| SparsePattern::random(shape.outputs, shape.inputs, density, layer_seed(seed, l, 0x3a5c)))
}

impl MemoryX {
    /// Initialises every layer from `seed`: masks drawn at the layout's sparsity, weights uniform with the
    /// layer's standard deviation (He-scaled over each output's actual fan-in unless the layout sets one),
    /// biases at zero. A tied layer stores nothing of its own.
    pub fn new(
        layout: ModelLayout,
        optimizer: OptimizerSpec,
        schedule: ScheduleSpec,
        total_steps: u64,
        seed: u64,
    ) -> Self {
        let layers = layout
            .linears
            .iter()
            .enumerate()
            .map(|(l, &shape)| {
                let mut rng = ChaCha8Rng::seed_from_u64(layer_seed(seed, l, 0x5eed));
                let density = 1.0 - if shape.sparse { layout.sparsity } else { 0.0 };
                let limit = match shape.init_std {
                    // uniform(-a, a) has standard deviation a / √3
                    Some(std) => std * 3f32.sqrt(),
                    // He: variance 2 / fan-in, over each output's actual fan-in
                    None => (6.0 / (shape.inputs as f64 * density).max(1.0)).sqrt() as f32,
                };
                let masks = mask(&layout, seed, l).map(|by_row| {
                    let (by_col, col_to_row) = by_row.transpose();
                    Masks { by_row: Arc::new(by_row), by_col: Arc::new(by_col), col_to_row }
                });
                let n = match (&masks, shape.tied_to) {
                    (_, Some(_)) => 0,
                    (Some(m), None) => m.by_row.nnz(),
                    (None, None) => shape.dense_weights(),
                };
                let weights = (0..n).map(|_| rng.random_range(-limit..limit)).collect();
                RwLock::new(LayerState {
                    shape,
                    weights,
                    bias: vec![0.0; shape.bias_len()],
                    weights_opt: OptState::new(optimizer.kind, n),
                    bias_opt: OptState::new(optimizer.kind, shape.bias_len()),
                    masks,
                    updates: 0,
                })
            })
            .collect();
        MemoryX { layout, optimizer, schedule, total_steps, layers, tied_grad: TiedGrad::default() }
    }

    /// Refuses a gradient that does not fit layer `grad.layer` (wrong lengths, NaN or infinity).
    fn check_grad(state: &LayerState, grad: &LayerGrad) -> Result<()> {
        let own_weights = if state.shape.tied_to.is_some() { state.shape.dense_weights() } else { state.weights.len() };
        if grad.weights.len() != own_weights || grad.bias.len() != state.shape.bias_len() {
            return Err(Error::Protocol(format!(
                "gradient for layer {} has {} weight and {} bias values; {} and {} expected",
                grad.layer,
                grad.weights.len(),
                grad.bias.len(),
                own_weights,
                state.shape.bias_len()
            )));
        }
        if !all_finite(&grad.weights) || !all_finite(&grad.bias) {
            return Err(Error::Protocol(format!(
                "gradient for layer {} holds NaN or infinity; lower the learning rate",
                grad.layer
            )));
        }
        Ok(())
    }

    /// Checks a step's gradients against the model before any is applied, so a bad one cannot leave the
    /// state half-updated.
    pub fn check_grads(&self, grads: &[LayerGrad]) -> Result<()> {
        grads.iter().try_for_each(|g| Self::check_grad(&*self.read(g.layer)?, g))
    }

    /// Optimizer steps applied so far (the step the next gradient must be for).
    pub fn step(&self) -> u64 {
        self.layers.first().and_then(|l| l.read().ok().map(|s| s.updates)).unwrap_or(0)
    }

    /// Runs `f` on layer `layer`'s stream for `pass`, lending it the stored weights instead of copying them
    /// when they travel in stored order (dense layers, and sparse ones forward), and putting them back after.
    /// For a pipelined engine's replica, whose layers never leave the engine. `f` must not use this store.
    pub fn with_stream<T>(&self, layer: usize, pass: Pass, f: impl FnOnce(&LayerStream) -> Result<T>) -> Result<T> {
        let lendable = {
            let s = self.read(layer)?;
            s.shape.tied_to.is_none() && (pass == Pass::Forward || (layer > 0 && s.masks.is_none()))
        };
        if !lendable {
            let stream = match pass {
                Pass::Forward => self.forward_stream(layer)?,
                Pass::Backward => self.backward_stream(layer)?,
            };
            return f(&stream);
        }
        let mut state = self.layers[layer]
            .write()
            .map_err(|_| Error::Protocol(format!("layer {layer}'s state was poisoned by a failed update")))?;
        let values = std::mem::take(&mut state.weights);
        let weights = match &state.masks {
            Some(m) => WeightPayload::Sparse { pattern: m.by_row.clone(), values },
            None => WeightPayload::Dense(values),
        };
        let bias = if pass == Pass::Forward { std::mem::take(&mut state.bias) } else { Vec::new() };
        let stream = LayerStream { layer, pass, weights, bias };
        let out = f(&stream);
        let LayerStream { weights, bias, .. } = stream;
        match weights {
            WeightPayload::Dense(v) | WeightPayload::Sparse { values: v, .. } => state.weights = v,
            WeightPayload::Mask(_) | WeightPayload::Nothing => {}
        }
        if pass == Pass::Forward {
            state.bias = bias;
        }
        out
    }

    /// The model it stores.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// Weights actually stored (non-zeros for sparse layers) plus biases.
    pub fn parameters(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|l| l.read().ok().map(|s| s.weights.len() + s.bias.len()))
            .sum()
    }

    /// Each layer's weights as a dense row-major matrix, for tests and inspection.
    pub fn dense_weights(&self, layer: usize) -> Result<Vec<f32>> {
        let state = self.read(layer)?;
        Ok(match (&state.masks, state.shape.tied_to) {
            (_, Some(target)) => self.tied_values(target, state.shape.dense_weights())?,
            (Some(m), None) => m.by_row.to_dense(&state.weights).data,
            (None, None) => state.weights.clone(),
        })
    }

    /// The first `n` weights of layer `target`: a tied layer's matrix.
    fn tied_values(&self, target: usize, n: usize) -> Result<Vec<f32>> {
        let t = self.read(target)?;
        t.weights.get(..n).map(<[f32]>::to_vec).ok_or_else(|| {
            Error::Protocol(format!("layer {target} has {} weights, fewer than the {n} a tied layer reads", t.weights.len()))
        })
    }

    fn read(&self, layer: usize) -> Result<std::sync::RwLockReadGuard<'_, LayerState>> {
        self.layers
            .get(layer)
            .ok_or_else(|| Error::Protocol(format!("layer {layer} requested but the model has {}", self.layers.len())))?
            .read()
            .map_err(|_| Error::Protocol(format!("layer {layer}'s state was poisoned by a failed update")))
    }
}

impl WeightStore for MemoryX {
    fn forward_stream(&self, layer: usize) -> Result<LayerStream> {
        let state = self.read(layer)?;
        let weights = match (&state.masks, state.shape.tied_to) {
            (_, Some(target)) => WeightPayload::Dense(self.tied_values(target, state.shape.dense_weights())?),
            (Some(m), None) => WeightPayload::Sparse { pattern: m.by_row.clone(), values: state.weights.clone() },
            (None, None) => WeightPayload::Dense(state.weights.clone()),
        };
        Ok(LayerStream { layer, pass: Pass::Forward, weights, bias: state.bias.clone() })
    }

    fn backward_stream(&self, layer: usize) -> Result<LayerStream> {
        let state = self.read(layer)?;
        let weights = match (&state.masks, layer) {
            (_, l) if l > 0 && state.shape.tied_to.is_some() => {
                WeightPayload::Dense(self.tied_values(state.shape.tied_to.unwrap_or(0), state.shape.dense_weights())?)
            }
            (Some(m), 0) => WeightPayload::Mask(m.by_col.clone()),
            (Some(m), _) => WeightPayload::Sparse {
                pattern: m.by_col.clone(),
                values: m.col_to_row.iter().map(|&k| state.weights[k as usize]).collect(),
            },
            (None, 0) => WeightPayload::Nothing,
            (None, _) => WeightPayload::Dense(state.weights.clone()),
        };
        Ok(LayerStream { layer, pass: Pass::Backward, weights, bias: Vec::new() })
    }

    fn apply(&self, grad: &LayerGrad, step: u64) -> Result<()> {
        let lock = self.layers.get(grad.layer).ok_or_else(|| {
            Error::Protocol(format!("gradient for layer {} but the model has {} layers", grad.layer, self.layers.len()))
        })?;
        let mut state =
            lock.write().map_err(|_| Error::Protocol(format!("layer {}'s state was poisoned", grad.layer)))?;
        if step != state.updates {
            return Err(Error::Protocol(format!(
                "gradient of step {step} for layer {} refused: the layer expects step {}",
                grad.layer, state.updates
            )));
        }
        Self::check_grad(&state, grad)?;
        let mut reordered = match &state.masks {
            Some(m) => {
                let mut g = vec![0.0; grad.weights.len()];
                for (kc, &kr) in m.col_to_row.iter().enumerate() {
                    g[kr as usize] = grad.weights[kc];
                }
                g
            }
            None if state.shape.tied_to.is_some() => Vec::new(),
            None => grad.weights.clone(),
        };
        // The shared weights are updated once, with the target layer, from the sum of both gradients.
        self.tied_grad.exchange(grad, state.shape.tied_to, step, &mut reordered)?;
        let weight_grads: &[f32] = &reordered;
        let lr = optim::learning_rate(&self.optimizer, &self.schedule, step, self.total_steps);
        let t = state.updates + 1;
        let LayerState { weights, bias, weights_opt, bias_opt, .. } = &mut *state;
        optim::update(&self.optimizer, weights, weight_grads, weights_opt, lr, t, true);
        optim::update(&self.optimizer, bias, &grad.bias, bias_opt, lr, t, false);
        state.updates += 1;
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
    /// Every weight, bias and optimizer moment as named tensors, with the steps applied so far. Taken between
    /// steps, so all layers agree on the step.
    pub fn snapshot(&self) -> Result<(u64, Tensors)> {
        let mut out = Vec::new();
        let mut step = None;
        for (l, lock) in self.layers.iter().enumerate() {
            let s = lock.read().map_err(|_| Error::Protocol(format!("layer {l}'s state was poisoned")))?;
            if *step.get_or_insert(s.updates) != s.updates {
                return Err(Error::Protocol("a snapshot was taken in the middle of a step".into()));
            }
            for (kind, values) in checkpoint::KINDS.iter().zip(s.saved()) {
                if !values.is_empty() {
                    out.push((checkpoint::tensor_name(l, kind), values.clone()));
                }
            }
        }
        Ok((step.unwrap_or(0), out))
    }

    /// Puts back a snapshot taken of the same model (same layout, seed and optimizer), refusing one that does
    /// not fit before anything is changed.
    pub fn restore(&self, step: u64, tensors: &Tensors) -> Result<()> {
        let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let mut staged = Vec::new();
        for (l, lock) in self.layers.iter().enumerate() {
            let s = lock.read().map_err(|_| Error::Protocol(format!("layer {l}'s state was poisoned")))?;
            let mut parts = Vec::new();
            for (kind, want) in checkpoint::KINDS.iter().zip(s.saved().map(Vec::len)) {
                let key = checkpoint::tensor_name(l, kind);
                let values = match (find(&key), want) {
                    (Some(v), n) if v.len() == n => v.clone(),
                    (None, 0) => Vec::new(),
                    (found, n) => {
                        return Err(Error::Protocol(format!(
                            "checkpoint tensor {key} has {} values but this job's model needs {n}; the checkpoint \
                             belongs to another model, seed, sparsity or optimizer",
                            found.map_or(0, Vec::len)
                        )));
                    }
                };
                parts.push(values);
            }
            staged.push(parts);
        }
        for (lock, parts) in self.layers.iter().zip(staged) {
            let mut s = lock.write().map_err(|_| Error::Protocol("layer state poisoned".into()))?;
            for (slot, values) in s.saved_mut().into_iter().zip(parts) {
                *slot = values;
            }
            s.updates = step;
        }
        Ok(())
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
