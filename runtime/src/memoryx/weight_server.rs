//! A weight server: the part of MemoryX that owns one slice of every layer — its weights, its bias and the
//! optimizer's moments of both — streams that slice, and runs the optimizer on the matching slice of the summed
//! gradient. The coordinator ([`super::store::MemoryX`]) cuts every tensor the same way ([`plan::memoryx::slice_range`])
//! and never holds more than the layer in flight; the update is elementwise, so N servers train exactly the
//! same model as one.
//!
//! [`WeightServer`] is what the coordinator drives; [`LocalSlice`] is a server in this process (server 0, a
//! pipelined engine's replica, every server in an in-process run), and [`super::remote::RemoteServer`] one on
//! the network.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crds::{OptimizerSpec, ScheduleSpec};
use kernels::sparse::SparsePattern;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::huggingface::Folder;
use super::slice::{LayerLengths, LayerTensors, SliceId};
use super::tier::{Tier, TierLayout};
use crate::optim::{self, OptState, Recipe};
use crate::protocol::codec::chunk::Recycled;
use errors::{Error, Result};
use plan::layout::ModelLayout;

/// What a weight server holds and has moved, and its process's memory: how its budget is judged.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerUsage {
    /// Its place among the servers.
    pub index: u32,
    /// Bytes of its slice kept in memory.
    pub memory_bytes: u64,
    /// Bytes of its slice in its disk tier.
    pub disk_bytes: u64,
    /// Its memory budget (`spec.memoryx.memoryBytes`), if it has one.
    pub budget_bytes: Option<u64>,
    /// Its slice of the largest layer: what streams through it at once.
    pub largest_layer_bytes: u64,
    /// Bytes its disk tier has read.
    pub tier_read_bytes: u64,
    /// Bytes its disk tier has written.
    pub tier_written_bytes: u64,
    /// Its process's resident memory before the slice was built (the program, its runtime, TLS, the data's
    /// description): the overhead beside the state.
    pub baseline_rss_bytes: u64,
    /// Its process's peak resident memory (VmHWM).
    pub peak_rss_bytes: u64,
}

/// Refuses to fill `weights` and `bias` with a slice of layer `layer` whose lengths are `slice_lengths`
/// unless they are exactly its room: what every [`WeightServer::fetch_into`] checks first.
pub(super) fn check_room(
    slice: SliceId,
    layer: usize,
    slice_lengths: (usize, usize),
    weights: &[f32],
    bias: &[f32],
) -> Result<()> {
    if slice_lengths != (weights.len(), bias.len()) {
        return Err(Error::Protocol(format!("{slice}: layer {layer}'s slice does not fit the room given for it")));
    }
    Ok(())
}

/// What the coordinator needs of a weight server. Every call names the step the coordinator believes the
/// layer is at, so a server that restarted (and so holds another step) is refused at once rather than
/// streaming stale weights.
pub trait WeightServer: Send + Sync {
    /// The slice it owns.
    fn slice(&self) -> SliceId;
    /// Its slice of layer `layer`'s weights and bias, which must have had `step` updates.
    fn fetch(&self, layer: usize, step: u64) -> Result<(Vec<f32>, Vec<f32>)>;
    /// The same slice written into `weights` and `bias`, which must be its lengths: the coordinator gathers a
    /// layer from several servers straight into its place in the whole, with no copy to join it.
    fn fetch_into(&self, layer: usize, step: u64, weights: &mut [f32], bias: &mut [f32]) -> Result<()> {
        let (w, b) = self.fetch(layer, step)?;
        check_room(self.slice(), layer, (w.len(), b.len()), weights, bias)?;
        weights.copy_from_slice(&w);
        bias.copy_from_slice(&b);
        Ok(())
    }
    /// Runs the optimizer on its slice of layer `layer` with the matching slices of the summed gradient of
    /// step `step` (0-based), which must be the next one the layer expects.
    fn update(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()>;
    /// Holds the matching slices of layer `layer`'s summed gradient of step `step` until [`WeightServer::commit`]
    /// (a rerun step's replaces them): in memory for a layer in memory, in the disk tier for one on disk.
    fn stage(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()>;
    /// [`WeightServer::stage`] of buffers the server may keep: one in this process holds a layer in memory's
    /// gradient as given instead of copying it (a step's gradients are the size of the model).
    fn stage_owned(&self, layer: usize, step: u64, weights: Vec<f32>, bias: Vec<f32>) -> Result<()> {
        let staged = self.stage(layer, step, &weights, &bias);
        Recycled::layers().give(weights);
        staged
    }
    /// Makes every gradient staged for `step` part of the state (refused unless every layer's is): each is
    /// applied before its layer is next read, so the optimizer of a layer runs beside the engines' next forward
    /// pass, when that layer is fetched, instead of all layers' in a pause between the steps.
    fn commit(&self, step: u64) -> Result<()>;
    /// Steps committed so far to every layer (all layers agree between steps), their gradients applied or
    /// pending.
    fn step(&self) -> Result<u64>;
    /// Its slice of layer `layer`'s every tensor, with the layer's step: snapshots and pipelined replicas.
    fn tensors(&self, layer: usize) -> Result<(u64, LayerTensors)>;
    /// Replaces its slice of layer `layer` (lengths checked) and sets the layer's step.
    fn put(&self, layer: usize, step: u64, tensors: LayerTensors) -> Result<()>;
    /// What it holds and has moved, and its process's memory.
    fn usage(&self) -> Result<ServerUsage>;
}

/// Gradients staged for one step: per layer, in arrival order, the values (or `None` when they wait in the disk
/// tier).
#[derive(Debug, Default)]
struct Staged {
    step: u64,
    layers: Vec<(usize, Option<StagedGradient>)>,
}

/// A layer slice's staged gradient: its weights' and its vector's.
type StagedGradient = (Vec<f32>, Vec<f32>);

/// A layer as a [`LocalSlice`] holds it: its slice of each tensor and the updates applied.
#[derive(Debug)]
struct Slot {
    /// `None` while the layer lives in the disk tier.
    tensors: Option<LayerTensors>,
    updates: u64,
    /// A committed gradient of step `updates` not applied yet: applied the next time the layer is read
    /// ([`LocalSlice::settle`]), which for a training run is its fetch for the next step's forward pass.
    pending: Option<Pending>,
}

impl Slot {
    fn new(tensors: Option<LayerTensors>) -> Slot {
        Slot { tensors, updates: 0, pending: None }
    }

    /// The updates the layer has had once its committed gradient is applied.
    fn committed(&self) -> u64 {
        self.updates + u64::from(self.pending.is_some())
    }
}

/// Where a committed, not yet applied gradient waits: beside a layer in memory, or in the disk tier's
/// gradient file of a layer on disk.
#[derive(Debug)]
enum Pending {
    InMemory(Vec<f32>, Vec<f32>),
    OnDisk,
}

/// A weight server in this process.
pub struct LocalSlice {
    slice: SliceId,
    optimizer: OptimizerSpec,
    schedule: ScheduleSpec,
    total_steps: u64,
    /// Each layer's slice lengths.
    lengths: Vec<LayerLengths>,
    layers: Vec<Mutex<Slot>>,
    /// Where the part beyond the memory budget lives; `None`: all in memory.
    tier: Option<Arc<Tier>>,
    /// Its memory budget, if any.
    budget: Option<u64>,
    /// The gradients staged for the step in flight.
    staged: Mutex<Staged>,
    /// The process's resident memory before the slice was built.
    baseline_rss: u64,
}

impl std::fmt::Debug for LocalSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSlice").field("slice", &self.slice).field("layers", &self.layers.len()).finish()
    }
}

/// Where a [`LocalSlice`] keeps what does not fit its memory budget.
#[derive(Clone, Debug, Default)]
pub struct Storage {
    /// Bytes of state it may keep in memory; `None`: everything.
    pub memory_bytes: Option<u64>,
    /// The disk tier's directory (required when the budget is below the slice).
    pub tier_dir: Option<PathBuf>,
}

/// Seed of layer `l`'s mask and initial values, derived from the job seed so layers differ.
pub(super) fn layer_seed(seed: u64, l: usize, salt: u64) -> u64 {
    seed ^ (l as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt
}

/// The stored lengths of every layer of `layout` masked as `masking` says, whole: weights (non-zeros of a sparse
/// layer, none of a tied one), bias, and the optimizer's moments of each.
pub fn layer_lengths(layout: &ModelLayout, optimizer: &OptimizerSpec, masking: &Masking) -> Vec<LayerLengths> {
    let moments = plan::memoryx::optimizer_values(optimizer.kind) as usize;
    (0..layout.linears.len())
        .map(|l| {
            let shape = layout.linears[l];
            let n = match (shape.tied_to, masking) {
                (Some(_), _) => 0,
                (None, _) if !shape.sparse => shape.dense_weights(),
                // A magnitude mask keeps exactly the expected share, so its size is known without reading it.
                (None, Masking::Magnitude(_)) => magnitude_keeps(layout, l).iter().sum(),
                (None, Masking::Random(seed)) => {
                    random_mask(layout, *seed, l).map_or(shape.dense_weights(), |m| m.nnz())
                }
            };
            let b = shape.vector_len();
            let (m1, m2) = (if moments >= 1 { n } else { 0 }, if moments >= 2 { n } else { 0 });
            let (b1, b2) = (if moments >= 1 { b } else { 0 }, if moments >= 2 { b } else { 0 });
            [n, b, m1, m2, b1, b2]
        })
        .collect()
}

/// Slice `slice` of layer `l`'s initial tensors read from a pretrained folder: the unit's matrices (pruned to
/// their largest magnitudes when sparse, [`Masking::Magnitude`]) and its vector, the moments at zero. Only this layer is read, so the whole model
/// never sits in one process.
fn pretrained(
    folder: &Folder,
    layout: &ModelLayout,
    lengths: &[LayerLengths],
    slice: SliceId,
    l: usize,
) -> Result<LayerTensors> {
    let shape = layout.linears[l];
    let (dense, vector) = folder.unit(layout, l)?;
    let weights = match shape.tied_to {
        Some(_) => Vec::new(),
        None if shape.sparse => magnitude_mask(layout, l, &dense).values_of(&dense),
        None => dense,
    };
    let whole = lengths[l];
    if weights.len() != whole[0] || vector.len() != whole[1] {
        return Err(Error::Protocol(format!(
            "layer {l}: {} weights and {} vector values read, {} and {} stored",
            weights.len(),
            vector.len(),
            whole[0],
            whole[1]
        )));
    }
    let s = whole.map(|len| slice.range(len).len());
    let (w, v) = (weights[slice.range(whole[0])].to_vec(), vector[slice.range(whole[1])].to_vec());
    Ok([w, v, vec![0.0; s[2]], vec![0.0; s[3]], vec![0.0; s[4]], vec![0.0; s[5]]])
}

/// Slice `slice` of layer `l`'s initial tensors, exactly as the whole model's would be: the layer's values are
/// drawn in full, in order, and the slice keeps its range, so any number of servers starts from the same
/// weights. Weights uniform with the layer's standard deviation (He-scaled over each output's actual fan-in
/// unless the layout sets one), biases and moments at zero, gains at one.
fn initial(layout: &ModelLayout, lengths: &[LayerLengths], seed: u64, slice: SliceId, l: usize) -> LayerTensors {
    let shape = layout.linears[l];
    let whole = lengths[l];
    let mut rng = ChaCha8Rng::seed_from_u64(layer_seed(seed, l, 0x5eed));
    let density = 1.0 - if shape.sparse { layout.sparsity } else { 0.0 };
    let limit = match shape.init_std {
        // uniform(-a, a) has standard deviation a / √3
        Some(std) => std * 3f32.sqrt(),
        // He: variance 2 / fan-in, over each output's actual fan-in
        None => (6.0 / (shape.inputs as f64 * density).max(1.0)).sqrt() as f32,
    };
    let range = slice.range(whole[0]);
    for _ in 0..range.start {
        let _: f32 = rng.random_range(-limit..limit);
    }
    let weights: Vec<f32> = range.map(|_| rng.random_range(-limit..limit)).collect();
    let s = whole.map(|len| slice.range(len).len());
    let vector = shape.initial_vector()[slice.range(whole[1])].to_vec();
    [weights, vector, vec![0.0; s[2]], vec![0.0; s[3]], vec![0.0; s[4]], vec![0.0; s[5]]]
}

/// How a sparse layer's mask is chosen, once for the whole run: drawn at random from the job's seed, or — a
/// pretrained model fine-tuned sparse — the largest magnitudes of each pretrained matrix, so the model is
/// pruned once where it loses least and then trained on that mask.
#[derive(Clone, Debug, PartialEq)]
pub enum Masking {
    /// Each weight kept with probability `1 − sparsity`, from this seed.
    Random(u64),
    /// The `1 − sparsity` share of each matrix with the largest |w| in this Hugging Face folder.
    Magnitude(PathBuf),
}

impl Masking {
    /// The masking of a run: by magnitude when it starts from a pretrained model, else random.
    pub fn of(recipe: &Recipe) -> Masking {
        match &recipe.from {
            Some(dir) => Masking::Magnitude(dir.clone()),
            None => Masking::Random(recipe.seed),
        }
    }
}

/// The mask of layer `l` of `layout` (stored by output row), or `None` for a dense layer. Public because a
/// checkpoint stores only a sparse layer's non-zeros, in this mask's order: an export chooses the same mask
/// again to put them back in place.
pub fn mask(layout: &ModelLayout, masking: &Masking, l: usize) -> Result<Option<SparsePattern>> {
    match masking {
        Masking::Random(seed) => Ok(random_mask(layout, *seed, l)),
        Masking::Magnitude(dir) => {
            if !layout.linears.get(l).is_some_and(|s| s.sparse) {
                return Ok(None);
            }
            let (dense, _) = Folder::open(dir)?.unit(layout, l)?;
            Ok(Some(magnitude_mask(layout, l, &dense)))
        }
    }
}

/// [`mask`] drawn at random from `seed`.
pub(super) fn random_mask(layout: &ModelLayout, seed: u64, l: usize) -> Option<SparsePattern> {
    let shape = layout.linears.get(l)?;
    let density = 1.0 - if shape.sparse { layout.sparsity } else { 0.0 };
    shape.sparse.then(|| SparsePattern::random(shape.outputs, shape.inputs, density, layer_seed(seed, l, 0x3a5c)))
}

/// How many weights a magnitude mask keeps of each Hugging Face matrix stacked in unit `l` (queries, keys and
/// values; gate and up): the `1 − sparsity` share of each, so every matrix is pruned alike.
fn magnitude_keeps(layout: &ModelLayout, l: usize) -> Vec<usize> {
    let cols = layout.linears[l].inputs;
    let density = 1.0 - layout.sparsity;
    super::huggingface::unit_rows(layout, l)
        .iter()
        .map(|rows| (density * (rows * cols) as f64).round() as usize)
        .collect()
}

/// The mask of sparse unit `l` chosen from its pretrained weights `dense` (`outputs × inputs`, row-major): in
/// each matrix stacked in the unit, the share [`magnitude_keeps`] gives with the largest |w| (ties to the lower
/// index), stored by rows.
pub fn magnitude_mask(layout: &ModelLayout, l: usize, dense: &[f32]) -> SparsePattern {
    let (rows, cols) = (layout.linears[l].outputs, layout.linears[l].inputs.max(1));
    let mut lines = vec![Vec::new(); rows];
    let mut first_row = 0;
    for (block_rows, keep) in super::huggingface::unit_rows(layout, l).into_iter().zip(magnitude_keeps(layout, l)) {
        let block = &dense[first_row * cols..(first_row + block_rows) * cols];
        let keep = keep.min(block.len());
        let mut order: Vec<u32> = (0..block.len() as u32).collect();
        let larger = |a: &u32, b: &u32| block[*b as usize].abs().total_cmp(&block[*a as usize].abs()).then(a.cmp(b));
        if keep > 0 && keep < order.len() {
            order.select_nth_unstable_by(keep - 1, larger);
        }
        for &i in &order[..keep] {
            lines[first_row + i as usize / cols].push((i as usize % cols) as u32);
        }
        first_row += block_rows;
    }
    SparsePattern::from_lines(rows, cols, lines)
}

impl LocalSlice {
    /// Slice `slice` of a model `layout` initialised from `seed` ([`initial`]), keeping what does not fit
    /// `storage.memory_bytes` in the disk tier. `lengths` are the whole layers' (from [`layer_lengths`]).
    pub fn new(
        layout: &ModelLayout,
        lengths: &[LayerLengths],
        recipe: Recipe,
        slice: SliceId,
        storage: Storage,
    ) -> Result<LocalSlice> {
        let Recipe { optimizer, schedule, total_steps, seed, from } = recipe;
        let folder = match &from {
            Some(dir) => {
                let folder = Folder::open(dir)?;
                folder.check(layout)?;
                Some(folder)
            }
            None => None,
        };
        let baseline_rss = crate::process::rss_bytes();
        let sliced: Vec<LayerLengths> = slice.lengths(lengths);
        let tier = match storage.memory_bytes {
            Some(budget) => {
                // A layer in memory also holds its staged gradient (weights and bias) during a step.
                let bytes: Vec<u64> =
                    sliced.iter().map(|s| 4 * (s.iter().sum::<usize>() + s[0] + s[1]) as u64).collect();
                let plan = TierLayout::new(&bytes, budget)?;
                if plan.on_disk.iter().any(|&d| d) {
                    let dir = storage.tier_dir.clone().ok_or_else(|| {
                        Error::Plan(format!(
                            "{slice} keeps part of its slice on disk but has no tier directory (--tier-dir)"
                        ))
                    })?;
                    Some(Arc::new(Tier::create(dir, &sliced, plan)?))
                } else {
                    None
                }
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(lengths.len());
        for l in 0..lengths.len() {
            let tensors = match &folder {
                Some(folder) => pretrained(folder, layout, lengths, slice, l)?,
                None => initial(layout, lengths, seed, slice, l),
            };
            let slot = match &tier {
                Some(t) if t.on_disk(l) => {
                    t.write(l, &tensors)?;
                    Slot::new(None)
                }
                _ => Slot::new(Some(tensors)),
            };
            layers.push(Mutex::new(slot));
        }
        Ok(LocalSlice {
            slice,
            optimizer,
            schedule,
            total_steps,
            lengths: sliced,
            layers,
            tier,
            budget: storage.memory_bytes,
            staged: Mutex::default(),
            baseline_rss,
        })
    }

    /// Slice `slice` of the model, all in memory, with no checkpoint directory: a pipelined engine's replica,
    /// the in-process MemoryX of tests and local runs.
    pub fn in_memory(layout: &ModelLayout, lengths: &[LayerLengths], recipe: Recipe, slice: SliceId) -> LocalSlice {
        // Random values whatever the recipe's `from`: a replica's values come from MemoryX, and a pretrained
        // start goes through [`LocalSlice::new`], which can fail.
        let Recipe { optimizer, schedule, total_steps, seed, from: _ } = recipe;
        let baseline_rss = crate::process::rss_bytes();
        let layers =
            (0..lengths.len()).map(|l| Mutex::new(Slot::new(Some(initial(layout, lengths, seed, slice, l))))).collect();
        LocalSlice {
            slice,
            optimizer,
            schedule,
            total_steps,
            lengths: slice.lengths(lengths),
            layers,
            tier: None,
            budget: None,
            staged: Mutex::default(),
            baseline_rss,
        }
    }

    fn lock(&self, layer: usize) -> Result<std::sync::MutexGuard<'_, Slot>> {
        self.layers
            .get(layer)
            .ok_or_else(|| Error::Protocol(format!("layer {layer} requested but the model has {}", self.layers.len())))?
            .lock()
            .map_err(|_| {
                Error::Protocol(format!("{}: layer {layer}'s state was poisoned by a failed update", self.slice))
            })
    }

    /// Refuses a gradient slice whose lengths are not this server's slice of layer `layer`.
    fn check_grad_slice(&self, layer: usize, weights: &[f32], bias: &[f32]) -> Result<()> {
        let want = self
            .lengths
            .get(layer)
            .map(|s| (s[0], s[1]))
            .ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        if (weights.len(), bias.len()) != want {
            return Err(Error::Protocol(format!(
                "{}: gradient slice for layer {layer} has {} weight and {} bias values; {} and {} expected",
                self.slice,
                weights.len(),
                bias.len(),
                want.0,
                want.1
            )));
        }
        Ok(())
    }

    fn check_step(&self, layer: usize, have: u64, want: u64) -> Result<()> {
        if have != want {
            return Err(Error::Protocol(format!(
                "{}: layer {layer} has had {have} updates but the coordinator is at step {want}; the server restarted \
                 or missed a step, so the job resumes from its last complete checkpoint",
                self.slice
            )));
        }
        Ok(())
    }

    /// Runs `f` on layer `layer`'s tensors, reading them from the disk tier (and writing them back when
    /// `write`) if they live there, its committed gradient applied first.
    fn with_layer<T>(
        &self,
        layer: usize,
        write: bool,
        f: impl FnOnce(&mut Slot, &mut LayerTensors) -> Result<T>,
    ) -> Result<T> {
        self.with_layer_parts(layer, write, true, f)
    }

    /// [`LocalSlice::with_layer`], reading only the weights and bias from the disk tier unless `all` (they are all
    /// a stream needs; the moments stay on disk). A layer on disk with a committed gradient is read whole,
    /// updated and written back once, and what `f` reads (the next forward pass's weights) comes from that
    /// read, not a second one.
    fn with_layer_parts<T>(
        &self,
        layer: usize,
        write: bool,
        all: bool,
        f: impl FnOnce(&mut Slot, &mut LayerTensors) -> Result<T>,
    ) -> Result<T> {
        let mut slot = self.lock(layer)?;
        if let Some(mut t) = slot.tensors.take() {
            let out = self.settle(layer, &mut slot, &mut t).and_then(|()| f(&mut slot, &mut t));
            slot.tensors = Some(t);
            return out;
        }
        let tier = self.tier.as_ref().ok_or_else(|| Error::Protocol(format!("layer {layer} has no tensors")))?;
        let settling = slot.pending.is_some();
        let mut t = tier.read(layer, all || write || settling)?;
        // What the file holds: the count goes back to it if the layer cannot be written back.
        let on_file = slot.updates;
        self.settle(layer, &mut slot, &mut t)?;
        let out = f(&mut slot, &mut t);
        // A settled gradient is written back even when `f` fails (a fetch refused for naming another step).
        if (settling || (write && out.is_ok()))
            && let Err(e) = tier.write(layer, &t)
        {
            slot.updates = on_file;
            return Err(e);
        }
        tier.recycle(t);
        out
    }

    /// Applies layer `layer`'s committed gradient, if it has one, to its tensors `t` (all six, read whole).
    /// Taken out first: a gradient that fails to apply (its file unreadable) is not applied twice, and the
    /// layer stays at its step, which the coordinator's next call then refuses.
    fn settle(&self, layer: usize, slot: &mut Slot, t: &mut LayerTensors) -> Result<()> {
        match slot.pending.take() {
            None => Ok(()),
            Some(Pending::InMemory(w, b)) => {
                let applied = self.apply_grad(layer, slot.updates, slot, t, &w, &b);
                Recycled::layers().give(w);
                applied
            }
            Some(Pending::OnDisk) => {
                let tier = self
                    .tier
                    .as_ref()
                    .ok_or_else(|| Error::Protocol(format!("layer {layer}'s gradient is in no disk tier")))?;
                let (w, b) = tier.read_grad(layer)?;
                let applied = self.apply_grad(layer, slot.updates, slot, t, &w, &b);
                tier.recycle([w, b]);
                applied
            }
        }
    }

    /// Applies layer `layer`'s committed gradient now, if it still has one: before another gradient of the layer
    /// is staged in its place or committed. A guard rather than a path: the coordinator reads every layer between
    /// two steps' gradients, which applies them.
    fn settle_now(&self, layer: usize) -> Result<()> {
        if self.lock(layer)?.pending.is_some() {
            self.with_layer(layer, true, |_, _| Ok(()))?;
        }
        Ok(())
    }

    /// Runs the optimizer on layer `layer`'s tensors `t` with its gradient of step `step`, which must be the
    /// next one the layer expects.
    fn apply_grad(
        &self,
        layer: usize,
        step: u64,
        slot: &mut Slot,
        t: &mut LayerTensors,
        weights: &[f32],
        bias: &[f32],
    ) -> Result<()> {
        if step != slot.updates {
            return Err(Error::Protocol(format!(
                "{}: gradient of step {step} for layer {layer} refused: the layer expects step {}",
                self.slice, slot.updates
            )));
        }
        let lr = optim::learning_rate(&self.optimizer, &self.schedule, step, self.total_steps);
        let tt = slot.updates + 1;
        let [w, b, wm, wv, bm, bv] = t;
        let mut wopt = OptState { m: std::mem::take(wm), v: std::mem::take(wv) };
        let mut bopt = OptState { m: std::mem::take(bm), v: std::mem::take(bv) };
        optim::update(&self.optimizer, w, weights, &mut wopt, lr, tt, true);
        optim::update(&self.optimizer, b, bias, &mut bopt, lr, tt, false);
        (*wm, *wv, *bm, *bv) = (wopt.m, wopt.v, bopt.m, bopt.v);
        slot.updates += 1;
        Ok(())
    }

    /// Bytes of state this server keeps in memory (its resident layers), and on disk.
    pub fn bytes(&self) -> (u64, u64) {
        let total: u64 = self.lengths.iter().map(|s| 4 * s.iter().sum::<usize>() as u64).sum();
        let disk = self.tier.as_ref().map_or(0, |t| t.disk_bytes());
        (total - disk, disk)
    }

    /// The disk tier's traffic so far: bytes read and written.
    pub fn tier_traffic(&self) -> (u64, u64) {
        self.tier.as_ref().map_or((0, 0), |t| t.traffic())
    }

    /// Whether layer `layer` is held in memory (not in the disk tier).
    pub fn resident(&self, layer: usize) -> bool {
        self.lock(layer).is_ok_and(|s| s.tensors.is_some())
    }

    /// Lends layer `layer`'s weights and bias to `f` without copying them, when the layer is in memory.
    /// Returns `None` (and does not call `f`) when it lives on disk.
    pub fn lend<T>(&self, layer: usize, f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> T) -> Result<Option<T>> {
        let mut slot = self.lock(layer)?;
        let Some(mut t) = slot.tensors.take() else { return Ok(None) };
        let settled = self.settle(layer, &mut slot, &mut t);
        let out = settled.map(|()| {
            let [w, b, ..] = &mut t;
            f(w, b)
        });
        slot.tensors = Some(t);
        out.map(Some)
    }

    /// Holds a gradient slice of `step` until the commit: a layer in memory's as given, or a copy of one lent; a
    /// layer on disk's in its file (a given buffer then goes back to the pool).
    fn stage_grad(&self, layer: usize, step: u64, grad: GradSlice<'_>) -> Result<()> {
        let (weights, bias) = grad.parts();
        self.check_grad_slice(layer, weights, bias)?;
        let on_disk = self.tier.as_ref().filter(|t| t.on_disk(layer));
        if on_disk.is_some() {
            // The layer's committed gradient may wait in the file this one is about to take: applied first.
            self.settle_now(layer)?;
        }
        let mut staged =
            self.staged.lock().map_err(|_| Error::Protocol("the staged gradients were poisoned".into()))?;
        if staged.step != step {
            *staged = Staged { step, layers: Vec::new() };
        }
        staged.layers.retain(|(l, _)| *l != layer);
        match on_disk {
            Some(tier) => {
                tier.write_grad(layer, weights, bias)?;
                staged.layers.push((layer, None));
                grad.release();
            }
            None => staged.layers.push((layer, Some(grad.into_owned()))),
        }
        Ok(())
    }

    /// Hints that layer `layer` is wanted next, so the disk tier reads it ahead.
    pub fn prefetch(&self, layer: usize) {
        if let Some(t) = &self.tier {
            t.prefetch(layer, true);
        }
    }
}

/// A gradient slice handed to [`LocalSlice::stage_grad`]: lent by the caller (copied if kept), or given to keep.
enum GradSlice<'a> {
    /// Weights and bias the caller keeps: the coordinator's own slice of a gradient it cuts for several servers.
    Lent(&'a [f32], &'a [f32]),
    /// Weights and bias the server may keep: the whole gradient of a one-server MemoryX, or one received.
    Given(Vec<f32>, Vec<f32>),
}

impl GradSlice<'_> {
    /// The weights and bias.
    fn parts(&self) -> (&[f32], &[f32]) {
        match self {
            GradSlice::Lent(w, b) => (w, b),
            GradSlice::Given(w, b) => (w, b),
        }
    }

    /// Buffers to keep: the given ones, or copies of the lent ones.
    fn into_owned(self) -> (Vec<f32>, Vec<f32>) {
        match self {
            GradSlice::Lent(w, b) => (Recycled::layers().copy_of(w), Recycled::layers().copy_of(b)),
            GradSlice::Given(w, b) => (w, b),
        }
    }

    /// Done with: a given weight buffer goes back to the pool.
    fn release(self) {
        if let GradSlice::Given(w, _) = self {
            Recycled::layers().give(w);
        }
    }
}

impl WeightServer for LocalSlice {
    fn slice(&self) -> SliceId {
        self.slice
    }

    fn fetch(&self, layer: usize, step: u64) -> Result<(Vec<f32>, Vec<f32>)> {
        self.with_layer_parts(layer, false, false, |slot, t| {
            self.check_step(layer, slot.updates, step)?;
            Ok((Recycled::layers().copy_of(&t[0]), Recycled::layers().copy_of(&t[1])))
        })
    }

    fn fetch_into(&self, layer: usize, step: u64, weights: &mut [f32], bias: &mut [f32]) -> Result<()> {
        self.with_layer_parts(layer, false, false, |slot, t| {
            self.check_step(layer, slot.updates, step)?;
            check_room(self.slice, layer, (t[0].len(), t[1].len()), weights, bias)?;
            weights.copy_from_slice(&t[0]);
            bias.copy_from_slice(&t[1]);
            Ok(())
        })
    }

    fn update(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()> {
        self.check_grad_slice(layer, weights, bias)?;
        self.with_layer(layer, true, |slot, t| self.apply_grad(layer, step, slot, t, weights, bias))
    }

    fn stage(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()> {
        self.stage_grad(layer, step, GradSlice::Lent(weights, bias))
    }

    fn stage_owned(&self, layer: usize, step: u64, weights: Vec<f32>, bias: Vec<f32>) -> Result<()> {
        self.stage_grad(layer, step, GradSlice::Given(weights, bias))
    }

    fn commit(&self, step: u64) -> Result<()> {
        let staged = std::mem::take(
            &mut *self.staged.lock().map_err(|_| Error::Protocol("the staged gradients were poisoned".into()))?,
        );
        if staged.step != step || staged.layers.len() != self.layers.len() {
            return Err(Error::Protocol(format!(
                "{}: step {step} cannot be applied: {} of its {} layers' gradients were staged",
                self.slice,
                if staged.step == step { staged.layers.len() } else { 0 },
                self.layers.len()
            )));
        }
        // Every layer must be at `step` before any is marked: a refused commit changes nothing. An earlier
        // step's gradient still pending is applied first, in this pass.
        for (layer, _) in &staged.layers {
            self.settle_now(*layer)?;
            let slot = self.lock(*layer)?;
            if slot.updates != step {
                return Err(Error::Protocol(format!(
                    "{}: step {step} cannot be applied: layer {layer} has had {} updates",
                    self.slice, slot.updates
                )));
            }
        }
        for (layer, values) in staged.layers {
            self.lock(layer)?.pending = Some(match values {
                Some((w, b)) => Pending::InMemory(w, b),
                None => Pending::OnDisk,
            });
        }
        Ok(())
    }

    fn step(&self) -> Result<u64> {
        Ok(self.lock(0).map(|s| s.committed()).unwrap_or(0))
    }

    fn tensors(&self, layer: usize) -> Result<(u64, LayerTensors)> {
        self.with_layer(layer, false, |slot, t| Ok((slot.updates, t.clone())))
    }

    fn put(&self, layer: usize, step: u64, tensors: LayerTensors) -> Result<()> {
        let want = *self.lengths.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        let have = tensors.each_ref().map(Vec::len);
        if have != want {
            return Err(Error::Protocol(format!(
                "{}: layer {layer}'s tensors have {have:?} values but this job's model needs {want:?}; the state belongs \
                 to another model, seed, sparsity or optimizer",
                self.slice
            )));
        }
        let mut slot = self.lock(layer)?;
        match &self.tier {
            Some(tier) if slot.tensors.is_none() => tier.write(layer, &tensors)?,
            _ => slot.tensors = Some(tensors),
        }
        // A committed gradient not yet applied belonged to the state these tensors replace.
        if let Some(Pending::InMemory(w, _)) = slot.pending.take() {
            Recycled::layers().give(w);
        }
        slot.updates = step;
        Ok(())
    }

    fn usage(&self) -> Result<ServerUsage> {
        let (memory_bytes, disk_bytes) = self.bytes();
        let (tier_read_bytes, tier_written_bytes) = self.tier_traffic();
        Ok(ServerUsage {
            index: self.slice.index,
            memory_bytes,
            disk_bytes,
            budget_bytes: self.budget,
            largest_layer_bytes: self.lengths.iter().map(|s| 4 * s.iter().sum::<usize>() as u64).max().unwrap_or(0),
            tier_read_bytes,
            tier_written_bytes,
            baseline_rss_bytes: self.baseline_rss,
            peak_rss_bytes: crate::process::peak_rss_bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{Activation, OptimizerKind};
    use plan::layout::{Arch, LinearShape};

    /// Four layers; with a disk tier, a budget that keeps the first in memory and the others on disk.
    fn slice(tier_dir: Option<PathBuf>) -> LocalSlice {
        let layout = ModelLayout {
            linears: vec![
                LinearShape::new(8, 16, false),
                LinearShape::new(16, 16, false),
                LinearShape::new(16, 32, false),
                LinearShape::new(32, 10, false),
            ],
            arch: Arch::Mlp,
            activation: Activation::Relu,
            sparsity: 0.0,
            program: None,
        };
        let optimizer = OptimizerSpec {
            kind: OptimizerKind::Adamw,
            learning_rate: 0.01,
            weight_decay: 0.01,
            momentum: 0.9,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        };
        let recipe = Recipe {
            optimizer: optimizer.clone(),
            schedule: ScheduleSpec::default(),
            total_steps: 10,
            seed: 3,
            from: None,
        };
        let lengths = layer_lengths(&layout, &optimizer, &Masking::of(&recipe));
        let storage = Storage { memory_bytes: tier_dir.as_ref().map(|_| 20_000), tier_dir };
        LocalSlice::new(&layout, &lengths, recipe, SliceId { index: 0, count: 1 }, storage).unwrap()
    }

    fn grad(s: &LocalSlice, l: usize, step: u64) -> (Vec<f32>, Vec<f32>) {
        let [w, b, ..] = s.lengths[l];
        let v = |n: usize, k: u64| {
            (0..n).map(|i| ((i as u64 * 31 + k * 7 + step * 13) % 17) as f32 / 17.0 - 0.5).collect::<Vec<_>>()
        };
        (v(w, 1), v(b, 2))
    }

    /// A committed step's gradients are applied when each layer is next read, in memory and on disk alike:
    /// what is read (a fetch, a checkpoint's tensors) equals a server that applied each gradient at once, to the
    /// last bit, even after a refused fetch applied one; the server counts the step as applied from the commit
    /// on; a commit short of a layer changes nothing; and state put in its place drops a gradient not applied
    /// yet.
    #[test]
    fn a_committed_step_is_applied_as_each_layer_is_next_read() {
        let dir = std::env::temp_dir().join(format!("ws-commit-{}", std::process::id()));
        let (lazy, eager) = (slice(Some(dir.clone())), slice(None));
        assert_eq!(
            (0..4).map(|l| lazy.resident(l)).collect::<Vec<_>>(),
            [true, false, false, false],
            "in memory and on disk"
        );
        let layers = lazy.lengths.len();
        for step in 0..2 {
            for l in (0..layers).rev() {
                let (w, b) = grad(&lazy, l, step);
                lazy.stage(l, step, &w, &b).unwrap();
                eager.update(l, step, &w, &b).unwrap();
            }
            if step == 0 {
                let refused = slice(None);
                let (w, b) = grad(&refused, 1, 0);
                refused.stage(1, 0, &w, &b).unwrap();
                assert!(refused.commit(0).unwrap_err().to_string().contains("1 of its 4 layers"));
                assert_eq!(
                    (refused.step().unwrap(), refused.tensors(1).unwrap().1),
                    (0, slice(None).tensors(1).unwrap().1),
                    "unchanged"
                );
            }
            lazy.commit(step).unwrap();
            assert_eq!(lazy.step().unwrap(), step + 1, "counted from the commit");
            if step == 0 {
                // A fetch that names the old step is refused, but the gradient it applied on the way is kept:
                // written back to the layer's file, not lost.
                let refused = lazy.fetch(3, 0).unwrap_err().to_string();
                assert!(refused.contains("has had 1 updates"), "{refused}");
            }
            // Step 0's gradients are applied by the fetches of step 1's forward pass; step 1's by the
            // checkpoint's reads.
            for l in 0..layers {
                if step == 0 {
                    assert_eq!(
                        lazy.fetch(l, step + 1).unwrap(),
                        eager.fetch(l, step + 1).unwrap(),
                        "layer {l} fetched"
                    );
                } else {
                    assert_eq!(lazy.tensors(l).unwrap(), eager.tensors(l).unwrap(), "layer {l}'s tensors");
                }
            }
        }
        // A commit then a put: the gradient not applied yet goes with the state the put replaces.
        for l in (0..layers).rev() {
            let (w, b) = grad(&lazy, l, 2);
            lazy.stage(l, 2, &w, &b).unwrap();
        }
        lazy.commit(2).unwrap();
        for l in 0..layers {
            let (step, tensors) = eager.tensors(l).unwrap();
            lazy.put(l, step, tensors).unwrap();
        }
        assert_eq!(lazy.step().unwrap(), 2);
        for l in 0..layers {
            assert_eq!(lazy.tensors(l).unwrap(), eager.tensors(l).unwrap(), "layer {l} as put");
        }
        drop(lazy);
        std::fs::remove_dir_all(&dir).ok();
    }
}
