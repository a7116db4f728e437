//! The cluster model against the rest of the appliance: the bytes it streams are the plan's, its estimate of a
//! job agrees with what a simulated engine charges for a real step, and more engines or more sparsity help.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use data::shard::Shard;
use kernels::tensor::Mat;
use plan::layout::ModelLayout;
use plan::preset::WSE2;
use runtime::engine::role::{EngineRole, ShardWork};
use runtime::memoryx::store::{MemoryX, WeightStore};
use sim_wse::cost::{Cluster, Workload, estimate};

fn spec(layers: &[u32], sparsity: f64, batch: u32, cs2: u32) -> crds::TrainingJobSpec {
    serde_json::from_value(serde_json::json!({
        "cs2": cs2,
        "model": { "kind": "mlp", "layers": layers, "activation": "relu", "sparsity": sparsity },
        "data": { "kind": "mnist", "path": "unused" },
        "training": { "batchSize": batch, "steps": 1, "seed": 7, "optimizer": { "kind": "sgd", "learningRate": 0.01 } }
    }))
    .unwrap()
}

#[test]
fn streamed_bytes_are_the_plans() {
    for sparsity in [0.0, 0.9] {
        let s = spec(&[784, 512, 512, 10], sparsity, 128, 1);
        let work = Workload::from_spec(&s);
        let ours: u64 = work.layers.iter().map(|l| l.forward_bytes() + l.backward_bytes() + l.gradient_bytes()).sum();
        let layout = ModelLayout::from_spec(&s.model);
        assert_eq!(ours, plan::appliance::step_bytes(&layout, false), "sparsity {sparsity}");
    }
}

#[test]
fn estimate_gives_step_time_and_throughput() {
    let one = estimate(&spec(&[4096, 4096, 4096, 10], 0.0, 4096, 1));
    assert!(one.step_s > 0.0 && one.compute_s > 0.0);
    assert!((one.samples_per_s - 4096.0 / one.step_s).abs() < 1e-6 * one.samples_per_s);
    assert!(one.compute_share > 0.0 && one.compute_share + one.streaming_share <= 1.0 + 1e-9);
    let four = estimate(&spec(&[4096, 4096, 4096, 10], 0.0, 4096, 4));
    assert_eq!(four.tokens_per_engine, 1024);
    assert!(four.step_s < one.step_s && four.samples_per_s > one.samples_per_s);
    // Sparsity pays more the more tokens each AXPY covers: with few, the fixed partial sums dominate.
    let gain = |batch: u32| {
        estimate(&spec(&[4096, 4096, 4096, 10], 0.0, batch, 1)).step_s
            / estimate(&spec(&[4096, 4096, 4096, 10], 0.9, batch, 1)).step_s
    };
    let (small, large) = (gain(4096), gain(65536));
    assert!(small > 1.0 && large > 1.5 * small, "90% sparsity: {small}× at 4096 samples, {large}× at 65536");
}

#[test]
fn streaming_bounds_the_step_when_compute_is_short() {
    // A wide layer with a single token per engine computes in far less time than its weights take to stream.
    let s = spec(&[16384, 16384, 10], 0.0, 16, 16);
    let e = estimate(&s);
    assert!(e.stream_wait_s > 0.0 && e.streaming_share > 0.5, "{e:?}");
    let stream_in = 4.0 * (16384.0 * 16384.0 + 16384.0) / plan::preset::MEMORYX_BANDWIDTH;
    assert!(e.step_s > stream_in, "the forward stream alone takes {stream_in}s");
    // And a cluster whose MemoryX is twice as fast finishes sooner.
    let mut fast = Cluster::new(WSE2, 16);
    fast.memoryx_bandwidth *= 2.0;
    assert!(fast.step(&Workload::from_spec(&s)).step_s < e.step_s);
}

#[test]
fn a_simulated_engine_charges_what_the_estimate_predicts() {
    for sparsity in [0.0, 0.9] {
        let s = spec(&[784, 512, 512, 10], sparsity, 256, 1);
        let layout = ModelLayout::from_spec(&s.model);
        let store = MemoryX::new(layout.clone(), s.training.optimizer.clone(), s.training.schedule.clone(), 1, 7);
        let mut engine = sim_wse::engine("engine-0", layout.clone(), &s.engine);
        let samples = 256;
        let inputs = Mat::from_vec(784, samples, (0..784 * samples).map(|i| ((i * 37) % 101) as f32 / 101.0).collect());
        let labels = (0..samples).map(|i| (i % 10) as u32).collect();
        // One training step driven by hand, as SwarmX drives each engine: every layer forward, the loss, every
        // layer backward.
        engine.begin_step(Shard { inputs, labels }, ShardWork::train(1.0 / samples as f32, 0)).unwrap();
        let layers = layout.linears.len();
        for l in 0..layers {
            engine.forward(&store.forward_stream(l).unwrap()).unwrap();
        }
        engine.loss().unwrap();
        for l in (0..layers).rev() {
            engine.backward(&store.backward_stream(l).unwrap()).unwrap();
        }
        let charged = engine.stats().counters.simulated_s;
        // The engine sees its own time; the tree's fill and drain are the cluster's.
        let e = estimate(&s);
        let predicted = e.step_s - e.fabric_latency_s;
        let ratio = charged / predicted;
        // Dense: the same products on the same mapping. Sparse: the estimate draws counts from the mask's
        // distribution, the engine sees the real mask, so they differ by the sampling only.
        let tolerance = if sparsity == 0.0 { 1e-9 } else { 0.03 };
        assert!(
            (ratio - 1.0).abs() <= tolerance,
            "sparsity {sparsity}: engine charged {charged}s, estimate {predicted}s"
        );
    }
}
