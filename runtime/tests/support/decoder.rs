//! What the decoder tests (GPT and Llama) share: their optimizers and text, a swarm of engines over it, the
//! forward-only loss, and the check that one training step moves every parameter by its gradient.
#![allow(dead_code)]

use std::sync::Arc;

use crds::{Decay, OptimizerKind, OptimizerSpec, ScheduleSpec};
use data::text::{TextWindows, Tokens};
use data::{Dataset, Sampler};
use plan::layout::ModelLayout;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use runtime::coordinator::train;
use runtime::engine::hw::CountingHw;
use runtime::engine::role::{EngineRole, ShardWork};
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::checkpoint::Tensors;
use runtime::memoryx::store::{MemoryX, WeightStore};
use runtime::swarmx::LocalSwarm;

/// `kind` with no weight decay.
pub fn optimizer(kind: OptimizerKind, learning_rate: f64) -> OptimizerSpec {
    OptimizerSpec { kind, learning_rate, weight_decay: 0.0, momentum: 0.9, beta1: 0.9, beta2: 0.99, epsilon: 1e-8 }
}

/// A constant learning rate.
pub fn constant() -> ScheduleSpec {
    ScheduleSpec { warmup_steps: 0, decay: Decay::Constant, min_learning_rate: 0.0 }
}

/// A short text as bytes, in windows of `context`.
pub fn text(context: usize) -> Arc<Dataset> {
    let bytes =
        b"Call me Ishmael. Some years ago, never mind how long precisely, having little money in my purse.".repeat(3);
    Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Bytes(bytes), vocab: 256, context }))
}

/// `engines` simulated engines running `layout`, fed from `data`.
pub fn swarm(layout: &ModelLayout, engines: usize, data: &Arc<Dataset>) -> LocalSwarm {
    let engines: Vec<Box<dyn EngineRole>> = (0..engines)
        .map(|i| {
            Box::new(Wse::new(format!("engine-{i}"), layout.clone(), CountingHw::new(1 << 30))) as Box<dyn EngineRole>
        })
        .collect();
    LocalSwarm::new(engines, Arc::new(LocalFeed::new(data.clone(), data.clone()))).expect("engines")
}

/// Mean loss per token of windows `samples`, forward only.
pub fn mean_loss(store: &MemoryX, layout: &ModelLayout, data: &Dataset, samples: &[u32]) -> f64 {
    let shard = data.shard(samples);
    let tokens = shard.labels.len() as f64;
    let mut e = Wse::new("fd", layout.clone(), CountingHw::new(1 << 30));
    e.begin_step(shard, ShardWork::eval()).unwrap();
    for l in 0..layout.linears.len() {
        e.forward(&store.forward_stream(l).unwrap()).unwrap();
    }
    e.loss().unwrap().loss / tokens
}

/// Sets every stored value of `store` at random (weights in ±0.5, so gradients stand well above rounding;
/// vectors — biases or gains — as `vector` draws them) and returns them.
pub fn randomise(store: &MemoryX, seed: u64, vector: impl Fn(&mut ChaCha8Rng) -> f32) -> Tensors {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (_, mut start) = store.snapshot().unwrap();
    for (name, values) in start.iter_mut() {
        let is_vector = name.ends_with("bias");
        values.iter_mut().for_each(|v| *v = if is_vector { vector(&mut rng) } else { rng.random_range(-0.5..0.5) });
    }
    store.restore(0, &start).unwrap();
    start
}

/// One SGD step at rate 1 (the store's optimizer) from `start` on windows `samples`, then every parameter the
/// step moved (and a sample of those it did not) probed by central differences of the mean loss: the move must
/// be the gradient. Returns the parameters probed and how many of them were vectors.
pub fn assert_step_is_the_gradient(
    store: &MemoryX,
    layout: &ModelLayout,
    data: &Arc<Dataset>,
    samples: &[u32],
    start: &Tensors,
    what: &str,
) -> (usize, usize) {
    let mut engines = swarm(layout, 1, data);
    train::train_step(store, &mut engines, train::StepShape::whole(layout), samples.to_vec(), 0).unwrap();
    let (_, after) = store.snapshot().unwrap();
    let mut probe: Tensors = start.clone();
    let (mut checked, mut vectors) = (0, 0);
    for t in 0..start.len() {
        let name = start[t].0.clone();
        for k in 0..start[t].1.len() {
            let grad = (start[t].1[k] - after[t].1[k]) as f64;
            // Embedding rows of bytes the text never holds have no gradient; probe a sample of them.
            if grad == 0.0 && k % 7 != 0 {
                continue;
            }
            let h = 1e-2f32;
            probe[t].1[k] = start[t].1[k] + h;
            store.restore(0, &probe).unwrap();
            let up = mean_loss(store, layout, data, samples);
            probe[t].1[k] = start[t].1[k] - h;
            store.restore(0, &probe).unwrap();
            let down = mean_loss(store, layout, data, samples);
            probe[t].1[k] = start[t].1[k];
            let fd = (up - down) / (2.0 * h as f64);
            assert!((fd - grad).abs() < 2e-3 + 0.03 * fd.abs(), "{what}: {name}[{k}]: analytic {grad} vs numeric {fd}");
            checked += 1;
            vectors += usize::from(name.ends_with("bias"));
        }
    }
    (checked, vectors)
}

/// The per-token loss of the first `steps` steps of batches of `batch` windows, on `engines` engines.
pub fn curve(layout: &ModelLayout, data: &Arc<Dataset>, engines: usize, run: (usize, u64)) -> Vec<f64> {
    curve_in(layout, data, engines, run, 0)
}

/// [`curve`] with each engine's shard run as micro-batches of `micro_batch` windows (0: whole).
pub fn curve_in(
    layout: &ModelLayout,
    data: &Arc<Dataset>,
    engines: usize,
    (batch, steps): (usize, u64),
    micro_batch: usize,
) -> Vec<f64> {
    let shape = train::StepShape { micro_batch, ..train::StepShape::whole(layout) };
    let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Adamw, 0.01), constant(), steps, 11);
    let mut s = swarm(layout, engines, data);
    let sampler = Sampler::new(data.len(), batch, 11);
    (0..steps)
        .map(|step| {
            let (loss, _) = train::train_step(&store, &mut s, shape, sampler.batch(step), step).unwrap();
            loss.loss / loss.samples as f64
        })
        .collect()
}
