//! The Llama-family decoder through the real roles: gradients of every parameter (RMSNorm gains, the rotary
//! path, SwiGLU, grouped-query attention) against finite differences, through MemoryX's own update, dense and
//! sparse, tied and untied; and one engine against four, and four against two running their shards as
//! micro-batches.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

#[path = "support/decoder.rs"]
mod decoder;
use decoder::{assert_step_is_the_gradient, constant, curve, curve_in, optimizer, randomise, text};

use crds::{ModelKind, ModelSpec, OptimizerKind};
use plan::layout::ModelLayout;
use rand::Rng;
use runtime::memoryx::store::MemoryX;

/// A Llama of `width` features, `heads` query heads over `kv_heads` key/value heads, `blocks` blocks.
fn llama(
    (width, heads, kv_heads): (u32, u32, u32),
    blocks: u32,
    context: u32,
    sparsity: f64,
    tied: bool,
) -> ModelLayout {
    let mut spec = ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, sparsity);
    spec.kind = ModelKind::Llama;
    (spec.width, spec.heads, spec.blocks, spec.context_length) =
        (Some(width), Some(heads), Some(blocks), Some(context));
    (spec.kv_heads, spec.intermediate_size, spec.rope_theta) = (Some(kv_heads), Some(2 * width + 4), Some(100.0));
    spec.tied_embeddings = tied;
    ModelLayout::from_spec(&spec)
}

#[test]
fn every_llama_parameter_gets_the_gradient_of_finite_differences() {
    // Dense and untied; at 50% (masks run dense) tied; at 85% the sparse kernels, two blocks. Grouped-query
    // attention (4 query heads over 2 key/value heads) in all three, heads of 4 features (two rotary pairs).
    for (sparsity, tied, blocks) in [(0.0, false, 1), (0.5, true, 1), (0.85, false, 2)] {
        let layout = llama((16, 4, 2), blocks, 4, sparsity, tied);
        let data = text(4);
        // SGD with rate 1 and no decay: one step moves every stored weight by exactly its gradient.
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Sgd, 1.0), constant(), 1, 5);
        // Gains around 1.
        let start = randomise(&store, 3, |rng| rng.random_range(0.5..1.5));
        let (checked, gains) = assert_step_is_the_gradient(
            &store,
            &layout,
            &data,
            &[0, 3],
            &start,
            &format!("sparsity {sparsity}, tied {tied}"),
        );
        assert!(
            checked > 500 && gains >= 16 * (2 * blocks as usize + 1),
            "only {checked} parameters probed, {gains} gains"
        );
    }
}

#[test]
fn one_and_four_engines_train_the_same_llama() {
    for sparsity in [0.0, 0.85] {
        let layout = llama((16, 4, 2), 2, 8, sparsity, true);
        let data = text(8);
        let (one, four) = (curve(&layout, &data, 1, (8, 6)), curve(&layout, &data, 4, (8, 6)));
        for (a, b) in one.iter().zip(&four) {
            assert!((a - b).abs() < 1e-4, "sparsity {sparsity}: 1 engine {one:?} vs 4 engines {four:?}");
        }
        assert!(one[5] < one[0] - 0.2, "the loss falls: {one:?}");
        // Fewer engines running the 4-engine shards as micro-batches: the 4-engine curve, bit for bit.
        assert_eq!(
            curve_in(&layout, &data, 2, (8, 6), 2),
            four,
            "sparsity {sparsity}: 2 engines, 2 micro-batches each"
        );
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
