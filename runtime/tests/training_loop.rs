//! The training loop end to end in one process: MemoryX, SwarmX and engines on real MNIST digits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::Path;
use std::sync::Arc;

use crds::{Activation, ModelSpec, OptimizerKind, OptimizerSpec, ScheduleSpec};
use data::{Dataset, Sampler, mnist};
use errors::Error;
use kernels::sparse::SparsePattern;
use kernels::tensor::Mat;
use plan::layout::ModelLayout;
use runtime::coordinator::train;
use runtime::engine::hw::CountingHw;
use runtime::engine::role::{EngineRole, ShardWork};
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::store::{MemoryX, WeightStore};
use runtime::protocol::{LayerGrad, LayerStream, Pass, WeightPayload};
use runtime::swarmx::LocalSwarm;

fn layout(widths: &[u32], sparsity: f64, activation: Activation) -> ModelLayout {
    ModelLayout::from_spec(&ModelSpec::mlp(widths.to_vec(), activation, sparsity))
}

fn adam() -> OptimizerSpec {
    OptimizerSpec {
        kind: OptimizerKind::Adam,
        learning_rate: 0.002,
        weight_decay: 0.0,
        momentum: 0.9,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    }
}

fn train_set() -> Dataset {
    Dataset::Images(
        mnist::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/mnist"), mnist::Split::Train)
            .expect("the shipped digits load"),
    )
}

fn engines(layout: &ModelLayout, n: usize, data: &Arc<Dataset>) -> LocalSwarm {
    let engines: Vec<Box<dyn EngineRole>> = (0..n)
        .map(|i| {
            Box::new(Wse::new(format!("engine-{i}"), layout.clone(), CountingHw::new(1 << 30))) as Box<dyn EngineRole>
        })
        .collect();
    LocalSwarm::new(engines, Arc::new(LocalFeed::new(data.clone(), data.clone()))).expect("engines")
}

/// Trains `steps` steps of 64 samples on `n` engines and returns the loss curve and the bytes per step.
fn curve(layout: &ModelLayout, n: usize, steps: u64, seed: u64) -> (Vec<f64>, Vec<u64>) {
    let data = Arc::new(train_set());
    let store = MemoryX::new(layout.clone(), adam(), ScheduleSpec::default(), steps, seed);
    let mut swarm = engines(layout, n, &data);
    let sampler = Sampler::new(data.len(), 64, seed);
    let mut losses = Vec::new();
    let mut bytes = Vec::new();
    for step in 0..steps {
        let (loss, b) =
            train::train_step(&store, &mut swarm, train::StepShape::whole(layout), sampler.batch(step), step)
                .expect("step runs");
        losses.push(loss.loss / loss.samples as f64);
        bytes.push(b);
    }
    (losses, bytes)
}

#[test]
fn a_seeded_run_is_reproducible_and_learns() {
    let l = layout(&[784, 64, 10], 0.5, Activation::Relu);
    let (a, _) = curve(&l, 1, 40, 9);
    let (b, _) = curve(&l, 1, 40, 9);
    assert_eq!(a, b, "same seed, same loss curve");
    let (c, _) = curve(&l, 1, 40, 10);
    assert_ne!(a, c, "another seed, another curve");
    let first: f64 = a[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = a[35..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.5 * first, "the loss falls: {first} -> {last}");
}

#[test]
fn more_engines_give_the_same_curve() {
    for sparsity in [0.0, 0.8] {
        let l = layout(&[784, 48, 32, 10], sparsity, Activation::Gelu);
        let (one, _) = curve(&l, 1, 15, 3);
        for n in [2, 4] {
            let (many, _) = curve(&l, n, 15, 3);
            for (step, (a, b)) in one.iter().zip(&many).enumerate() {
                assert!(
                    (a - b).abs() < 1e-3 * (1.0 + a.abs()),
                    "sparsity {sparsity}, {n} engines, step {step}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn sparse_streams_carry_a_fifth_of_the_dense_bytes() {
    let l = layout(&[784, 512, 512, 10], 0.9, Activation::Relu);
    let (_, bytes) = curve(&l, 1, 2, 1);
    let dense = plan::appliance::step_bytes(&l, true);
    for b in bytes {
        assert!((b as f64) <= 0.2 * dense as f64, "{b} bytes streamed per step vs {dense} dense");
    }
    let plan_estimate = plan::appliance::step_bytes(&l, false) as f64;
    assert!((plan_estimate - dense as f64 * 0.1).abs() < dense as f64 * 0.1, "the plan's estimate is in range");
}

/// Whole-model gradient check through the engine program: the weight gradients an engine returns match central
/// differences of the loss it computes, for a sparse GELU network.
#[test]
fn engine_gradients_match_finite_differences() {
    let l = layout(&[6, 5, 4, 3], 0.4, Activation::Gelu);
    let patterns: Vec<Arc<SparsePattern>> = l
        .linears
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(SparsePattern::random(s.outputs, s.inputs, 0.6, 40 + i as u64)))
        .collect();
    let mut values: Vec<Vec<f32>> = patterns
        .iter()
        .enumerate()
        .map(|(i, p)| (0..p.nnz()).map(|k| ((k * 7 + i * 3) % 11) as f32 / 5.5 - 1.0).collect())
        .collect();
    let biases: Vec<Vec<f32>> =
        l.linears.iter().map(|s| (0..s.outputs).map(|o| 0.1 * o as f32 - 0.1).collect()).collect();
    let inputs = Mat::from_vec(6, 4, (0..24).map(|i| ((i * 5) % 9) as f32 / 4.0 - 1.0).collect());
    let labels = vec![0u32, 2, 1, 2];

    let run = |values: &[Vec<f32>], train: bool| -> (f64, Vec<LayerGrad>) {
        let mut e = Wse::new("fd", l.clone(), CountingHw::new(1 << 20));
        e.begin_step(
            data::shard::Shard { inputs: inputs.clone(), labels: labels.clone() },
            ShardWork { grad_scale: 1.0, train, micro_batch: 0 },
        )
        .unwrap();
        for (i, p) in patterns.iter().enumerate() {
            let s = LayerStream {
                layer: i,
                pass: Pass::Forward,
                weights: WeightPayload::Sparse { pattern: p.clone(), values: values[i].clone() },
                bias: biases[i].clone(),
            };
            e.forward(&s).unwrap();
        }
        let loss = e.loss().unwrap().loss;
        let mut grads = Vec::new();
        if train {
            for (i, p) in patterns.iter().enumerate().rev() {
                let (t, perm) = p.transpose();
                let tv: Vec<f32> = perm.iter().map(|&k| values[i][k as usize]).collect();
                let w = if i == 0 {
                    WeightPayload::Mask(Arc::new(t.clone()))
                } else {
                    WeightPayload::Sparse { pattern: Arc::new(t.clone()), values: tv }
                };
                let g = e.backward(&LayerStream { layer: i, pass: Pass::Backward, weights: w, bias: vec![] }).unwrap();
                // Back to row order for comparison.
                let mut row = vec![0.0; p.nnz()];
                for (kt, &k) in perm.iter().enumerate() {
                    row[k as usize] = g.weights[kt];
                }
                grads.push(LayerGrad { layer: i, weights: row, bias: g.bias });
            }
            grads.reverse();
        }
        (loss, grads)
    };
    let (_, grads) = run(&values, true);
    for i in 0..values.len() {
        for k in 0..values[i].len() {
            let h = 1e-2f32;
            let orig = values[i][k];
            values[i][k] = orig + h;
            let up = run(&values, false).0;
            values[i][k] = orig - h;
            let down = run(&values, false).0;
            values[i][k] = orig;
            let fd = (up - down) / (2.0 * h as f64);
            let got = grads[i].weights[k] as f64;
            assert!((fd - got).abs() < 2e-3 * (1.0 + fd.abs()), "layer {i} weight {k}: analytic {got} vs numeric {fd}");
        }
    }
}

#[test]
fn an_engine_too_small_for_its_shard_says_what_it_needs() {
    let l = layout(&[784, 512, 512, 10], 0.0, Activation::Relu);
    let data = train_set();
    let mut e = Wse::new("engine-0", l.clone(), CountingHw::new(1 << 20));
    let idx: Vec<u32> = (0..256).collect();
    let err = e.begin_step(data.shard(&idx), ShardWork::train(1.0, 0)).unwrap_err();
    assert!(matches!(err, Error::OutOfSram { .. }));
    let msg = err.to_string();
    assert!(msg.contains("engine-0") && msg.contains("256-sample shard") && msg.contains("1.0 MiB"), "{msg}");
}

#[test]
fn bad_messages_are_refused_without_touching_state() {
    let l = layout(&[784, 16, 10], 0.5, Activation::Relu);
    let store = MemoryX::new(l.clone(), adam(), ScheduleSpec::default(), 10, 1);
    let before = store.dense_weights(0).unwrap();
    // A layer that does not exist.
    assert!(store.forward_stream(5).is_err());
    let bad = LayerGrad { layer: 7, weights: vec![], bias: vec![] };
    assert!(store.apply(&bad, 0).unwrap_err().to_string().contains("layer 7"));
    // A gradient of the wrong shape.
    let wrong = LayerGrad { layer: 0, weights: vec![0.0; 3], bias: vec![0.0; 16] };
    assert!(store.apply(&wrong, 0).is_err());
    // A gradient from the future, and NaN.
    let stream = store.backward_stream(0).unwrap();
    let n = stream.weights.pattern().unwrap().nnz();
    let ok = LayerGrad { layer: 0, weights: vec![0.0; n], bias: vec![0.0; 16] };
    assert!(store.apply(&ok, 3).unwrap_err().to_string().contains("expects step 0"));
    let nan = LayerGrad { layer: 0, weights: vec![f32::NAN; n], bias: vec![0.0; 16] };
    assert!(store.apply(&nan, 0).is_err());
    assert_eq!(store.dense_weights(0).unwrap(), before, "refused messages change nothing");
    // The same step twice: the second is refused.
    store.apply(&ok, 0).unwrap();
    assert!(store.apply(&ok, 0).unwrap_err().to_string().contains("expects step 1"));

    // Engines refuse streams out of order or of the wrong shape.
    let data = train_set();
    let mut e = Wse::new("engine-0", l.clone(), CountingHw::new(1 << 30));
    let fwd1 = store.forward_stream(1).unwrap();
    assert!(e.forward(&fwd1).is_err(), "no step begun");
    e.begin_step(data.shard(&[0, 1, 2, 3]), ShardWork::train(0.25, 0)).unwrap();
    assert!(e.forward(&fwd1).unwrap_err().to_string().contains("expects layer 0"));
    let mut short = store.forward_stream(0).unwrap();
    short.bias.pop();
    assert!(e.forward(&short).unwrap_err().to_string().contains("bias"));
    let dense_for_sparse = LayerStream {
        layer: 0,
        pass: Pass::Forward,
        weights: WeightPayload::Dense(vec![0.0; 784 * 16]),
        bias: vec![0.0; 16],
    };
    assert!(e.forward(&dense_for_sparse).is_err());
    e.forward(&store.forward_stream(0).unwrap()).unwrap();
}
