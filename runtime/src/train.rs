//! The training loop: the coordinator's side of weight streaming. Each step streams the layers forward from
//! MemoryX through SwarmX to the engines, collects the loss, streams them again in reverse, and hands the
//! summed gradients to MemoryX. The next layer is always being fetched while the engines compute the current
//! one, and never more than that one.
//!
//! It is written against the [`WeightStore`] and [`Swarm`] traits only, so the same loop drives roles in one
//! process or across the network.

use std::sync::mpsc;
use std::time::Instant;

use serde::Serialize;

use crate::data::{split_even, Dataset, Sampler};
use crate::engine::EngineStats;
use crate::error::{Error, Result};
use crate::memoryx::WeightStore;
use crate::model::loss::LossSum;
use crate::protocol::LayerStream;
use crate::swarmx::Swarm;

/// What one training step reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Steps completed, 1-based.
    pub step: u64,
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Training throughput of this step.
    pub samples_per_s: f64,
    /// Bytes moved between MemoryX and the fabric in this step.
    pub bytes_streamed: u64,
    /// Learning rate used for this step's update.
    pub learning_rate: f64,
}

/// Held-out results.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EvalReport {
    /// Mean loss.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Samples evaluated.
    pub samples: u64,
}

/// The result of a whole run, written as `summary.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Optimizer steps run.
    pub steps: u64,
    /// Mean loss of the last step.
    pub final_loss: f64,
    /// Held-out evaluation after training.
    pub eval: EvalReport,
    /// Wall time of the training steps (evaluation excluded).
    pub wall_s: f64,
    /// Training samples per second over the run.
    pub samples_per_s: f64,
    /// Bytes moved between MemoryX and the fabric over all training steps.
    pub bytes_streamed: u64,
    /// The same for the dense model.
    pub dense_equivalent_bytes: u64,
    /// CS-2 systems (engines) used.
    pub cs2: u32,
    /// Per-engine counters.
    pub engines: Vec<EngineStats>,
}

/// Streams one pass's layers in the given order on a helper thread, one ahead of the consumer: the
/// rendezvous channel means MemoryX prepares layer `l + 1` while the engines compute layer `l`, and no more.
fn with_prefetch<T>(
    store: &dyn WeightStore,
    order: Vec<(usize, bool)>,
    consume: impl FnOnce(&mut dyn FnMut() -> Result<LayerStream>) -> Result<T>,
) -> Result<T> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<Result<LayerStream>>(0);
        scope.spawn(move || {
            for (layer, forward) in order {
                let stream = if forward { store.forward_stream(layer) } else { store.backward_stream(layer) };
                let failed = stream.is_err();
                if tx.send(stream).is_err() || failed {
                    return;
                }
            }
        });
        let mut next = || rx.recv().map_err(|_| Error::Protocol("MemoryX stopped streaming mid-step".into()))?;
        consume(&mut next)
    })
}

/// Runs one training step over `shards` (one per engine) and returns the loss sums and bytes moved.
pub fn train_step(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    layers: usize,
    shards: Vec<crate::engine::Shard>,
    grad_scale: f32,
    step: u64,
) -> Result<(LossSum, u64)> {
    swarm.begin_step(shards, grad_scale, true)?;
    let order = (0..layers).map(|l| (l, true)).chain((0..layers).rev().map(|l| (l, false))).collect();
    with_prefetch(store, order, |next| {
        let mut bytes = 0;
        for _ in 0..layers {
            let stream = next()?;
            bytes += stream.wire_bytes();
            swarm.forward(&stream)?;
        }
        let loss = swarm.loss()?;
        for _ in 0..layers {
            let stream = next()?;
            bytes += stream.wire_bytes();
            let grad = swarm.backward(&stream)?;
            bytes += grad.wire_bytes();
            store.apply(&grad, step)?;
        }
        Ok((loss, bytes))
    })
}

/// Forward passes over all of `data` in batches of `batch`, split over the engines like training batches.
pub fn evaluate(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    layers: usize,
    data: &Dataset,
    batch: usize,
) -> Result<EvalReport> {
    let mut total = LossSum::default();
    let all: Vec<u32> = (0..data.len() as u32).collect();
    for chunk in all.chunks(batch.max(1)) {
        let shards = split_even(chunk, swarm.engines()).into_iter().map(|s| data.shard(s)).collect();
        swarm.begin_step(shards, 0.0, false)?;
        let order = (0..layers).map(|l| (l, true)).collect();
        let sum = with_prefetch(store, order, |next| {
            for _ in 0..layers {
                swarm.forward(&next()?)?;
            }
            swarm.loss()
        })?;
        total.add(&sum);
    }
    let n = total.samples.max(1) as f64;
    Ok(EvalReport { loss: total.loss / n, accuracy: total.correct as f64 / n, samples: total.samples })
}

/// The length of a run in optimizer steps, from the spec's `steps` or `epochs` over `samples` examples.
pub fn total_steps(training: &crds::TrainingSpec, samples: usize) -> Result<u64> {
    let per_epoch = Sampler::new(samples, training.batch_size as usize, 0).steps_per_epoch();
    if per_epoch == 0 {
        return Err(Error::Data(format!(
            "the training set has {samples} samples, fewer than one batch of {}; lower spec.training.batchSize",
            training.batch_size
        )));
    }
    Ok(training.steps.unwrap_or_else(|| per_epoch * u64::from(training.epochs.unwrap_or(1))))
}

/// Trains for `total` steps from `start` and evaluates; `on_step` sees every step's metrics as it finishes.
#[allow(clippy::too_many_arguments)]
pub fn run(
    spec: &crds::TrainingJobSpec,
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    layers: usize,
    train: &Dataset,
    test: &Dataset,
    total: u64,
    on_step: &mut dyn FnMut(&StepMetrics),
) -> Result<Summary> {
    let batch = spec.training.batch_size as usize;
    let sampler = Sampler::new(train.len(), batch, spec.training.seed);
    let layout = crate::model::ModelLayout::from_spec(&spec.model);
    let dense_step = crate::plan::step_bytes(&layout, true);
    let started = Instant::now();
    let (mut bytes, mut final_loss) = (0u64, f64::NAN);
    for step in 0..total {
        let step_started = Instant::now();
        let indices = sampler.batch(step);
        let shards = split_even(&indices, swarm.engines()).into_iter().map(|s| train.shard(s)).collect();
        let (loss, step_bytes) = train_step(store, swarm, layers, shards, 1.0 / batch as f32, step)?;
        final_loss = loss.loss / loss.samples.max(1) as f64;
        if !final_loss.is_finite() {
            return Err(Error::Protocol(format!(
                "the loss became {final_loss} at step {}; lower spec.training.optimizer.learningRate",
                step + 1
            )));
        }
        bytes += step_bytes;
        on_step(&StepMetrics {
            step: step + 1,
            loss: final_loss,
            samples_per_s: batch as f64 / step_started.elapsed().as_secs_f64().max(1e-9),
            bytes_streamed: step_bytes,
            learning_rate: crate::optim::learning_rate(&spec.training.optimizer, &spec.training.schedule, step, total),
        });
    }
    let wall_s = started.elapsed().as_secs_f64();
    let eval_batch = batch.max(swarm.engines());
    let eval = evaluate(store, swarm, layers, test, eval_batch)?;
    Ok(Summary {
        steps: total,
        final_loss,
        eval,
        wall_s,
        samples_per_s: (total as usize * batch) as f64 / wall_s.max(1e-9),
        bytes_streamed: bytes,
        dense_equivalent_bytes: dense_step * total,
        cs2: spec.cs2,
        engines: swarm.stats(),
    })
}
