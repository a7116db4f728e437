//! The transformer through the real roles: gradients of every parameter against finite differences (through
//! MemoryX's own update, so tied embeddings and sparse masks are covered), and one engine against four.

use std::sync::Arc;

use crds::{Decay, ModelKind, ModelSpec, OptimizerKind, OptimizerSpec, ScheduleSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use runtime::input::LocalFeed;
use data::text::{TextWindows, Tokens};
use data::{Dataset, Sampler};
use runtime::engine::hw::CountingHw;
use runtime::engine::role::EngineRole;
use runtime::engine::wse::Wse;
use runtime::memoryx::checkpoint::Tensors;
use runtime::memoryx::store::{MemoryX, WeightStore};
use plan::layout::ModelLayout;
use runtime::swarmx::LocalSwarm;
use runtime::coordinator::train;

fn gpt(width: u32, heads: u32, blocks: u32, context: u32, sparsity: f64, tied: bool) -> ModelLayout {
    let mut spec = ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, sparsity);
    spec.kind = ModelKind::Gpt;
    (spec.width, spec.heads, spec.blocks, spec.context_length) = (Some(width), Some(heads), Some(blocks), Some(context));
    spec.tied_embeddings = tied;
    ModelLayout::from_spec(&spec)
}

fn optimizer(kind: OptimizerKind, learning_rate: f64) -> OptimizerSpec {
    OptimizerSpec { kind, learning_rate, weight_decay: 0.0, momentum: 0.9, beta1: 0.9, beta2: 0.99, epsilon: 1e-8 }
}

fn constant() -> ScheduleSpec {
    ScheduleSpec { warmup_steps: 0, decay: Decay::Constant, min_learning_rate: 0.0 }
}

fn text(context: usize) -> Arc<Dataset> {
    let bytes = b"Call me Ishmael. Some years ago, never mind how long precisely, having little money in my purse."
        .repeat(3);
    Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Bytes(bytes), vocab: 256, context }))
}

fn swarm(layout: &ModelLayout, engines: usize, data: &Arc<Dataset>) -> LocalSwarm {
    let engines: Vec<Box<dyn EngineRole>> = (0..engines)
        .map(|i| Box::new(Wse::new(format!("engine-{i}"), layout.clone(), CountingHw::new(1 << 30))) as Box<dyn EngineRole>)
        .collect();
    LocalSwarm::new(engines, Arc::new(LocalFeed::new(data.clone(), data.clone()))).expect("engines")
}

/// Mean loss per token of windows `samples`, forward only.
fn mean_loss(store: &MemoryX, layout: &ModelLayout, data: &Dataset, samples: &[u32]) -> f64 {
    let shard = data.shard(samples);
    let tokens = shard.labels.len() as f64;
    let mut e = Wse::new("fd", layout.clone(), CountingHw::new(1 << 30));
    e.begin_step(shard, 1.0, false).unwrap();
    for l in 0..layout.linears.len() {
        e.forward(&store.forward_stream(l).unwrap()).unwrap();
    }
    e.loss().unwrap().loss / tokens
}

#[test]
fn every_gpt_parameter_gets_the_gradient_of_finite_differences() {
    // At 50% the masks run dense (see `sparse::DENSE_ABOVE`); at 85% they take the sparse kernels, and the MLP's
    // hidden layer and the layer norms QKV and MLP-up read go through them in tiles, with a tile's padding past
    // the step's 8 tokens; two blocks, so a norm in tiles also comes from the residual stream.
    for (sparsity, tied, blocks) in [(0.5, true, 1), (0.85, true, 2), (0.0, false, 1)] {
        let layout = gpt(8, 2, blocks, 4, sparsity, tied);
        let data = text(4);
        let samples = vec![0u32, 3];
        // SGD with rate 1 and no decay: one step moves every stored weight by exactly its gradient.
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Sgd, 1.0), constant(), 1, 5);
        // Larger weights than the initialisation, so gradients stand well above rounding.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (_, mut start) = store.snapshot().unwrap();
        for (_, values) in start.iter_mut() {
            values.iter_mut().for_each(|v| *v = rng.random_range(-0.5..0.5));
        }
        store.restore(0, &start).unwrap();
        let mut engines = swarm(&layout, 1, &data);
        train::train_step(&store, &mut engines, layout.linears.len(), 4, samples.clone(), 0).unwrap();
        let (_, after) = store.snapshot().unwrap();

        let mut probe: Tensors = start.clone();
        let mut checked = 0;
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
                let up = mean_loss(&store, &layout, &data, &samples);
                probe[t].1[k] = start[t].1[k] - h;
                store.restore(0, &probe).unwrap();
                let down = mean_loss(&store, &layout, &data, &samples);
                probe[t].1[k] = start[t].1[k];
                let fd = (up - down) / (2.0 * h as f64);
                assert!(
                    (fd - grad).abs() < 2e-3 + 0.03 * fd.abs(),
                    "sparsity {sparsity}, tied {tied}: {name}[{k}]: analytic {grad} vs numeric {fd}"
                );
                checked += 1;
            }
        }
        assert!(checked > 500, "only {checked} parameters probed");
    }
}

#[test]
fn one_and_four_engines_train_the_same_gpt() {
    let layout = gpt(16, 2, 2, 8, 0.5, true);
    let data = text(8);
    let curve = |engines: usize| -> Vec<f64> {
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Adamw, 0.01), constant(), 6, 11);
        let mut s = swarm(&layout, engines, &data);
        let sampler = Sampler::new(data.len(), 8, 11);
        (0..6)
            .map(|step| {
                let (loss, _) =
                    train::train_step(&store, &mut s, layout.linears.len(), 8, sampler.batch(step), step).unwrap();
                loss.loss / loss.samples as f64
            })
            .collect()
    };
    let (one, four) = (curve(1), curve(4));
    for (a, b) in one.iter().zip(&four) {
        assert!((a - b).abs() < 1e-4, "1 engine {one:?} vs 4 engines {four:?}");
    }
    assert!(one[5] < one[0] - 0.2, "the loss falls: {one:?}");
}

#[test]
fn a_tied_head_streams_the_embedding_and_stores_nothing() {
    let tied = gpt(8, 2, 1, 4, 0.0, true);
    let untied = gpt(8, 2, 1, 4, 0.0, false);
    let a = MemoryX::new(tied.clone(), optimizer(OptimizerKind::Adam, 0.01), constant(), 1, 1);
    let b = MemoryX::new(untied.clone(), optimizer(OptimizerKind::Adam, 0.01), constant(), 1, 1);
    assert_eq!(b.parameters() - a.parameters(), 256 * 8, "the head's own matrix is gone");
    let head = tied.linears.len() - 1;
    assert_eq!(a.dense_weights(head).unwrap(), a.dense_weights(0).unwrap()[..256 * 8].to_vec());
}
