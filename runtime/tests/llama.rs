//! The Llama-family decoder through the real roles: gradients of every parameter (RMSNorm gains, the rotary
//! path, SwiGLU, grouped-query attention) against finite differences, through MemoryX's own update, dense and
//! sparse, tied and untied; and one engine against four.

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

/// A Llama of `width` features, `heads` query heads over `kv_heads` key/value heads, `blocks` blocks.
fn llama((width, heads, kv_heads): (u32, u32, u32), blocks: u32, context: u32, sparsity: f64, tied: bool) -> ModelLayout {
    let mut spec = ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, sparsity);
    spec.kind = ModelKind::Llama;
    (spec.width, spec.heads, spec.blocks, spec.context_length) = (Some(width), Some(heads), Some(blocks), Some(context));
    (spec.kv_heads, spec.intermediate_size, spec.rope_theta) = (Some(kv_heads), Some(2 * width + 4), Some(100.0));
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
fn every_llama_parameter_gets_the_gradient_of_finite_differences() {
    // Dense and untied; at 50% (masks run dense) tied; at 85% the sparse kernels, two blocks. Grouped-query
    // attention (4 query heads over 2 key/value heads) in all three, heads of 4 features (two rotary pairs).
    for (sparsity, tied, blocks) in [(0.0, false, 1), (0.5, true, 1), (0.85, false, 2)] {
        let layout = llama((16, 4, 2), blocks, 4, sparsity, tied);
        let data = text(4);
        let samples = vec![0u32, 3];
        // SGD with rate 1 and no decay: one step moves every stored weight by exactly its gradient.
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Sgd, 1.0), constant(), 1, 5);
        // Larger weights than the initialisation, so gradients stand well above rounding; gains around 1.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (_, mut start) = store.snapshot().unwrap();
        for (name, values) in start.iter_mut() {
            let gain = name.ends_with("bias");
            values.iter_mut().for_each(|v| *v = if gain { rng.random_range(0.5..1.5) } else { rng.random_range(-0.5..0.5) });
        }
        store.restore(0, &start).unwrap();
        let mut engines = swarm(&layout, 1, &data);
        train::train_step(&store, &mut engines, layout.linears.len(), 4, samples.clone(), 0).unwrap();
        let (_, after) = store.snapshot().unwrap();

        let mut probe: Tensors = start.clone();
        let (mut checked, mut gains) = (0, 0);
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
                gains += usize::from(name.ends_with("bias"));
            }
        }
        assert!(checked > 500 && gains >= 16 * (2 * blocks as usize + 1), "only {checked} parameters probed, {gains} gains");
    }
}

#[test]
fn one_and_four_engines_train_the_same_llama() {
    for sparsity in [0.0, 0.85] {
        let layout = llama((16, 4, 2), 2, 8, sparsity, true);
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
            assert!((a - b).abs() < 1e-4, "sparsity {sparsity}: 1 engine {one:?} vs 4 engines {four:?}");
        }
        assert!(one[5] < one[0] - 0.2, "the loss falls: {one:?}");
    }
}

#[test]
fn gains_start_at_one_and_a_tied_head_keeps_its_own_gain() {
    let tied = llama((16, 4, 2), 1, 4, 0.0, true);
    let store = MemoryX::new(tied.clone(), optimizer(OptimizerKind::Adam, 0.01), constant(), 1, 1);
    let (_, tensors) = store.snapshot().unwrap();
    let gains: Vec<&(String, Vec<f32>)> = tensors.iter().filter(|(n, _)| n.ends_with("bias")).collect();
    assert_eq!(gains.len(), 3, "attention, MLP and final norm: {:?}", tensors.iter().map(|t| &t.0).collect::<Vec<_>>());
    assert!(gains.iter().all(|(_, g)| g.len() == 16 && g.iter().all(|&v| v == 1.0)));
    let head = tied.linears.len() - 1;
    assert_eq!(store.dense_weights(head).unwrap(), store.dense_weights(0).unwrap());
}
