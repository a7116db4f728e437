//! The transformer through the real roles: gradients of every parameter against finite differences (through
//! MemoryX's own update, so tied embeddings and sparse masks are covered), and one engine against four.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

#[path = "support/decoder.rs"]
mod decoder;
use decoder::{assert_step_is_the_gradient, constant, curve, curve_in, optimizer, randomise, text};

use crds::{ModelKind, ModelSpec, OptimizerKind};
use plan::layout::ModelLayout;
use rand::Rng;
use runtime::memoryx::store::MemoryX;

fn gpt(width: u32, heads: u32, blocks: u32, context: u32, sparsity: f64, tied: bool) -> ModelLayout {
    let mut spec = ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, sparsity);
    spec.kind = ModelKind::Gpt;
    (spec.width, spec.heads, spec.blocks, spec.context_length) =
        (Some(width), Some(heads), Some(blocks), Some(context));
    spec.tied_embeddings = tied;
    ModelLayout::from_spec(&spec)
}

#[test]
fn every_gpt_parameter_gets_the_gradient_of_finite_differences() {
    // At 50% the masks run dense (see `sparse::DENSE_ABOVE`); at 85% they take the sparse kernels, and the MLP's
    // hidden layer and the layer norms QKV and MLP-up read go through them in tiles, with a tile's padding past
    // the step's 8 tokens; two blocks, so a norm in tiles also comes from the residual stream.
    for (sparsity, tied, blocks) in [(0.5, true, 1), (0.85, true, 2), (0.0, false, 1)] {
        let layout = gpt(8, 2, blocks, 4, sparsity, tied);
        let data = text(4);
        // SGD with rate 1 and no decay: one step moves every stored weight by exactly its gradient.
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Sgd, 1.0), constant(), 1, 5);
        let start = randomise(&store, 3, |rng| rng.random_range(-0.5..0.5));
        let (checked, _) = assert_step_is_the_gradient(
            &store,
            &layout,
            &data,
            &[0, 3],
            &start,
            &format!("sparsity {sparsity}, tied {tied}"),
        );
        assert!(checked > 500, "only {checked} parameters probed");
    }
}

#[test]
fn one_and_four_engines_train_the_same_gpt() {
    let layout = gpt(16, 2, 2, 8, 0.5, true);
    let data = text(8);
    let (one, four) = (curve(&layout, &data, 1, (8, 6)), curve(&layout, &data, 4, (8, 6)));
    for (a, b) in one.iter().zip(&four) {
        assert!((a - b).abs() < 1e-4, "1 engine {one:?} vs 4 engines {four:?}");
    }
    assert!(one[5] < one[0] - 0.2, "the loss falls: {one:?}");
}

/// A job that goes on with fewer engines runs the full job's shards as micro-batches: its curve is the full job's
/// bit for bit, since each micro-batch is computed as its engine computed it and the sums group the same way.
/// Micro-batches of one engine's own shard give its curve to within rounding.
#[test]
fn fewer_engines_with_the_full_jobs_shards_as_micro_batches_train_bit_for_bit_the_same_gpt() {
    let layout = gpt(16, 2, 2, 8, 0.5, true);
    let data = text(8);
    let four = curve(&layout, &data, 4, (8, 6));
    assert_eq!(curve_in(&layout, &data, 2, (8, 6), 2), four, "2 engines, 2 micro-batches each");
    assert_eq!(curve_in(&layout, &data, 1, (8, 6), 2), four, "1 engine, 4 micro-batches");
    let whole = curve(&layout, &data, 2, (8, 6));
    assert_ne!(whole, four, "the shards' arithmetic differs unless run as micro-batches");
    for (a, b) in whole.iter().zip(&four) {
        assert!(((a - b) / b).abs() < 1e-6, "micro-batched {four:?} vs whole shards {whole:?}");
    }
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
