//! The example jobs of the new data formats (#15) train in one process, through the same `data::load` the
//! input workers call: an MLP on the spirals arrays reaches a held-out accuracy no linear model can.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::Path;
use std::sync::Arc;

use data::{self, Sampler};
use plan::layout::ModelLayout;
use runtime::coordinator::train;
use runtime::engine::hw::CountingHw;
use runtime::engine::role::EngineRole;
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::store::MemoryX;
use runtime::swarmx::LocalSwarm;

fn example(name: &str) -> crds::TrainingJobSpec {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(repo.join("examples/jobs").join(name)).expect("the example exists");
    let mut spec = crds::parse_training_job(&text).expect("the example is valid").spec;
    spec.data.path = repo.join(&spec.data.path).to_string_lossy().into_owned();
    spec.data.held_out_path = spec.data.held_out_path.map(|p| repo.join(p).to_string_lossy().into_owned());
    spec.data.tokenizer = spec.data.tokenizer.map(|p| repo.join(p).to_string_lossy().into_owned());
    spec
}

/// Trains `steps` steps of `spec` on one engine and returns the held-out evaluation after them.
fn train(spec: &crds::TrainingJobSpec, steps: u64) -> (train::EvalReport, Option<f64>) {
    let (train_set, test_set) = data::load(spec, None).expect("the data loads");
    let layout = ModelLayout::from_spec(&spec.model);
    let seed = spec.training.seed;
    let store =
        MemoryX::new(layout.clone(), spec.training.optimizer.clone(), spec.training.schedule.clone(), steps, seed);
    let engines: Vec<Box<dyn EngineRole>> =
        vec![Box::new(Wse::new("engine-0", layout.clone(), CountingHw::new(1 << 30))) as Box<dyn EngineRole>];
    let test_samples = test_set.eval_samples();
    let unigram = test_set.unigram_loss(&train_set);
    let feed = LocalFeed::new(Arc::new(train_set.clone()), Arc::new(test_set));
    let mut swarm = LocalSwarm::new(engines, Arc::new(feed)).expect("engines");
    let sampler = Sampler::new(train_set.len(), spec.training.batch_size as usize, seed);
    let shape = train::StepShape::whole(&layout);
    for step in 0..steps {
        train::train_step(&store, &mut swarm, shape, sampler.batch(step), step).expect("step runs");
    }
    let eval = train::evaluate(&store, &mut swarm, shape, &test_samples, 16, steps).expect("evaluation runs");
    (eval, unigram)
}

#[test]
fn the_gpt_bpe_example_learns_past_its_unigram_bar() {
    let mut spec = example("gpt-bpe.yaml");
    // The example's vocabulary and tokenizer at a sixteenth of its compute, so the test runs in seconds.
    (spec.model.width, spec.model.blocks, spec.model.context_length) = (Some(64), Some(1), Some(32));
    spec.training.schedule.warmup_steps = 5;
    spec.training.optimizer.learning_rate = 0.01;
    let (eval, unigram) = train(&spec, 200);
    let unigram = unigram.expect("text has a unigram bar");
    // Uniform over 1024 tokens is ln 1024 = 6.93 nats; the BPE unigram bar is near 5.5.
    assert!(unigram > 4.5 && unigram < 6.5, "{unigram}");
    eprintln!("gpt-bpe: held-out loss {} against the unigram bar {unigram}", eval.loss);
    assert!(eval.loss < unigram - 0.1, "held-out loss {} not below the unigram bar {unigram}", eval.loss);
}

#[test]
fn the_mlp_arrays_example_learns_the_spirals() {
    let spec = example("mlp-arrays.yaml");
    let (train_set, test_set) = data::load(&spec, None).expect("the spirals load");
    assert_eq!((train_set.len(), test_set.len()), (3000, 600));
    let steps = train::total_steps(&spec.training, train_set.len()).expect("steps");
    let (eval, unigram) = train(&spec, steps);
    assert_eq!(unigram, None, "arrays are not language");
    // Three spirals: chance is 1/3 and a linear model gets about half; the MLP gets nearly all.
    eprintln!("mlp-arrays: held-out accuracy {} (loss {})", eval.accuracy, eval.loss);
    assert!(eval.accuracy > 0.95, "held-out accuracy {} (loss {})", eval.accuracy, eval.loss);
}
