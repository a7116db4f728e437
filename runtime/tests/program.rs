//! Model programs through the real roles: the decoders captured from PyTorch (`plan/tests/programs`) take, for
//! every parameter, the gradient of finite differences through MemoryX's own update, dense and sparse (the
//! masked units on the sparse kernels); and one engine trains them as four do, and four as two running their
//! shards as micro-batches.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

#[path = "support/decoder.rs"]
mod decoder;
use decoder::{assert_step_is_the_gradient, constant, curve, curve_in, optimizer, randomise};

use std::path::PathBuf;
use std::sync::Arc;

use crds::{ModelKind, ModelSpec, OptimizerKind};
use data::Dataset;
use data::text::{TextWindows, Tokens};
use plan::layout::ModelLayout;
use rand::Rng;
use runtime::memoryx::store::MemoryX;

/// The captured example `name` (vocabulary 32, context 8) laid out at `sparsity`.
fn program(name: &str, sparsity: f64) -> ModelLayout {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plan/tests/programs").join(name);
    let mut spec = ModelSpec::mlp(Vec::new(), crds::Activation::Relu, sparsity);
    (spec.kind, spec.vocab_size, spec.context_length) = (ModelKind::Program, 32, Some(8));
    spec.from = Some(folder.display().to_string());
    let layout = ModelLayout::from_spec(&spec);
    assert!(!layout.linears.is_empty(), "{name} is read");
    layout
}

/// A short text as ids below 32, in windows of `context`.
fn text(context: usize) -> Arc<Dataset> {
    let bytes: Vec<u8> = b"Call me Ishmael. Some years ago, never mind how long precisely, having little money."
        .repeat(3)
        .iter()
        .map(|b| b % 32)
        .collect();
    Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Bytes(bytes), vocab: 32, context }))
}

#[test]
fn every_program_parameter_gets_the_gradient_of_finite_differences() {
    for (name, sparsity) in [("qwen", 0.0), ("gptj", 0.0), ("gpt2", 0.85), ("qwen", 0.85)] {
        let layout = program(name, sparsity);
        let data = text(8);
        let store = MemoryX::new(layout.clone(), optimizer(OptimizerKind::Sgd, 1.0), constant(), 1, 5);
        let start = randomise(&store, 3, |rng| rng.random_range(0.5..1.5));
        let (checked, vectors) =
            assert_step_is_the_gradient(&store, &layout, &data, &[0, 3], &start, &format!("{name} at {sparsity}"));
        assert!(checked > 300 && vectors > 16, "{name}: only {checked} parameters probed, {vectors} vector values");
    }
}

#[test]
fn one_and_four_engines_train_the_same_program() {
    for (name, sparsity) in [("qwen", 0.0), ("gpt2", 0.85)] {
        let layout = program(name, sparsity);
        let data = text(8);
        let (one, four) = (curve(&layout, &data, 1, (8, 6)), curve(&layout, &data, 4, (8, 6)));
        for (a, b) in one.iter().zip(&four) {
            assert!((a - b).abs() < 1e-4, "{name} at {sparsity}: 1 engine {one:?} vs 4 engines {four:?}");
        }
        assert!(one[5] < one[0], "the loss falls: {one:?}");
        assert_eq!(curve_in(&layout, &data, 2, (8, 6), 2), four, "{name}: 2 engines, 2 micro-batches each");
    }
}
