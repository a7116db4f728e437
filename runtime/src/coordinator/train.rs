//! The training loop: the coordinator's side of weight streaming. Each step streams the layers forward from
//! MemoryX through SwarmX to the engines, collects the loss, streams them again in reverse, and hands the
//! summed gradients to MemoryX ([`crate::swarmx::stream`]); when MemoryX is spread over weight servers, the
//! SwarmX root does that streaming straight from them and the loop sends only the batch. It commits each step.
//!
//! It is written against the [`WeightStore`] and [`Swarm`] traits only, so the same loop drives roles in one
//! process or across the network.

use std::time::Instant;

use crds::contract::ProgressReport;
use serde::{Deserialize, Serialize};

use crate::engine::role::EngineStats;
use crate::input::DataInfo;
use crate::memoryx::store::WeightStore;
use crate::model::loss::LossSum;
use crate::swarmx::{StepRequest, Swarm, stream};
use data::Sampler;
use data::shard::Split;
use errors::{Error, Result};

/// Held-out results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Mean loss per prediction (per sample for an MLP, per token for a GPT).
    pub loss: f64,
    /// Fraction of predictions correct (the class, or the next byte).
    pub accuracy: f64,
    /// Predictions evaluated (samples, or tokens).
    pub samples: u64,
    /// `exp(loss)`, for language models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// The held-out loss of the best context-free guess (the training text's byte frequencies): what a
    /// language model has to beat to have learned anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unigram_loss: Option<f64>,
}

/// The result of a whole run, written as `summary.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// Optimizer steps run.
    pub steps: u64,
    /// Mean loss of the last step (NaN, written as `null`, when a resumed run had no step left to run).
    #[serde(deserialize_with = "nan_if_null")]
    pub final_loss: f64,
    /// Held-out evaluation after training.
    pub eval: EvalReport,
    /// Wall time of the training steps (evaluation excluded).
    pub wall_s: f64,
    /// Training samples per second over the run.
    pub samples_per_s: f64,
    /// Training tokens per second over the run (samples × context length for a GPT).
    pub tokens_per_s: f64,
    /// Bytes of the model's weights as stored (values, indices, biases): compare with the engines'
    /// `sram_bytes` and `peak_sram_bytes` to see that weight streaming ran a model larger than the engine.
    pub model_weight_bytes: u64,
    /// Bytes moved between MemoryX and the fabric over all training steps.
    pub bytes_streamed: u64,
    /// The same for the dense model.
    pub dense_equivalent_bytes: u64,
    /// CS-2 systems (engines) used.
    pub cs2: u32,
    /// How the steps ran: `pipelined` (the model resident on the engines) or `weightStreaming`.
    pub execution_mode: crds::ExecutionMode,
    /// Per-engine counters at the end of training (before evaluation).
    pub engines: Vec<EngineStats>,
    /// Fraction of the training wall time the engines spent computing (mean over engines).
    pub wse_utilization: f64,
    /// Seconds per step a real wafer would take, from the engines' cost model (slowest engine).
    pub simulated_step_s: f64,
    /// Lines of text decoded from the trained model (`--sample N`, language models only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<String>,
    /// What MemoryX's coordinator held: its servers, its slice in memory and on disk, its disk tier's traffic
    /// and its peak resident memory.
    #[serde(default)]
    pub memoryx: MemoryxUsage,
}

/// What MemoryX held and moved, measured at the end of training: what `spec.memoryx` is judged by.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryxUsage {
    /// Each weight server's slice in memory and on disk, its disk tier's traffic and its process's memory
    /// (server 0 is the coordinator's process).
    pub servers: Vec<crate::memoryx::weight_server::ServerUsage>,
    /// The coordinator process's peak resident memory (VmHWM), in bytes; 0 where the system does not say.
    pub peak_rss_bytes: u64,
}

impl MemoryxUsage {
    /// The usage of `store`'s servers (those that answer) and of this process now.
    pub fn of(store: &crate::memoryx::store::MemoryX) -> MemoryxUsage {
        MemoryxUsage {
            servers: store.usage().into_iter().flatten().collect(),
            peak_rss_bytes: crate::process::peak_rss_bytes(),
        }
    }
}

/// JSON has no NaN: serde_json writes it as `null`, and this reads it back.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// What every step of a run shares: the model's stream length and how a batch of samples becomes the engines'
/// work. Travels as one, from the plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepShape {
    /// Weight layers streamed each pass.
    pub layers: usize,
    /// Tokens per sample: what turns a batch into the count the gradient is averaged over.
    pub tokens_per_sample: usize,
    /// Samples per micro-batch on an engine ([`plan::appliance::Plan::micro_batch`]); 0 runs each shard whole.
    pub micro_batch: usize,
}

impl StepShape {
    /// The shape of `plan`'s steps.
    pub fn of(plan: &plan::appliance::Plan, layout: &plan::layout::ModelLayout) -> Self {
        StepShape {
            layers: layout.linears.len(),
            tokens_per_sample: layout.tokens_per_sample(),
            micro_batch: plan.micro_batch,
        }
    }

    /// Steps of `layout` with every shard run whole.
    pub fn whole(layout: &plan::layout::ModelLayout) -> Self {
        StepShape { layers: layout.linears.len(), tokens_per_sample: layout.tokens_per_sample(), micro_batch: 0 }
    }

    /// The request for training step `step` over `samples`.
    fn train(&self, step: u64, samples: Vec<u32>) -> StepRequest {
        let grad_scale = 1.0 / (samples.len() * self.tokens_per_sample).max(1) as f32;
        StepRequest { step, samples, split: Split::Train, grad_scale, micro_batch: self.micro_batch }
    }

    /// The request for an evaluation pass over `samples` after step `step` (the forward pass only).
    fn eval(&self, step: u64, samples: Vec<u32>) -> StepRequest {
        StepRequest { step, samples, split: Split::Test, grad_scale: 0.0, micro_batch: self.micro_batch }
    }
}

/// Runs one training step over the global batch `samples` and returns the loss sums and bytes moved: streamed
/// through the fabric from `store`, or, when the fabric's root streams from the weight servers itself, by it.
///
/// Each layer's gradient is staged with MemoryX as it arrives and the step is committed only once every layer's
/// has, so a step that fails midway (an engine lost, a bad message) leaves MemoryX exactly as it was and can
/// simply be run again, and no one holds a whole step's gradients at once.
pub fn train_step(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    shape: StepShape,
    samples: Vec<u32>,
    step: u64,
) -> Result<(LossSum, u64)> {
    let request = shape.train(step, samples);
    let streamed = match swarm.streamer() {
        Some(root) => root.train(&request)?,
        None => stream::train_passes(store, swarm, shape.layers, &request)?,
    };
    store.commit(step)?;
    Ok(streamed)
}

/// Forward passes over the held-out `samples` in batches of `batch`, split over the engines like training
/// batches.
pub fn evaluate(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    shape: StepShape,
    samples: &[u32],
    batch: usize,
    step: u64,
) -> Result<EvalReport> {
    let mut total = LossSum::default();
    for chunk in samples.chunks(batch.max(1)) {
        let request = shape.eval(step, chunk.to_vec());
        let sum = match swarm.streamer() {
            Some(root) => root.evaluate(&request)?,
            None => stream::eval_pass(store, swarm, shape.layers, &request)?,
        };
        total.add(&sum);
    }
    let n = total.samples.max(1) as f64;
    Ok(EvalReport {
        loss: total.loss / n,
        accuracy: total.correct as f64 / n,
        samples: total.samples,
        ..EvalReport::default()
    })
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

/// How a run reacts to a component that drops out mid-step: one budget of time for the whole recovery of a
/// step (every rerun, every take-back of the replicas, every return to MemoryX's copy and the steps rerun from
/// it), after which the run fails with what did not answer. A frozen peer is found by a call's deadline, so the
/// run ends within the budget plus one call's deadline.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// The most a step's recovery may take, from its first failure (`--retry-seconds`).
    pub budget: std::time::Duration,
    /// Pause between attempts, while the lost component comes back.
    pub pause: std::time::Duration,
}

/// A recovery in progress: the step that first failed and when, which every later attempt draws on (a return
/// to MemoryX's copy does not start a new one), until a step past it succeeds.
#[derive(Clone, Copy, Debug)]
pub struct Recovery {
    /// The step that failed first.
    pub step: u64,
    /// When.
    pub since: Instant,
    /// Attempts so far.
    pub attempts: u32,
}

impl RetryPolicy {
    /// Runs `attempt` (work on `step`) until it succeeds, fails with anything but [`Error::Unavailable`], or the
    /// budget of `recovery` runs out (started at the first unavailable attempt, if no recovery is under way).
    /// After each unavailable attempt it pauses, then asks `recover` whether to go on (`Ok(false)` returns
    /// `Ok(None)`: the caller falls back, and its recovery goes on). `what` names the work in the log and in
    /// the error that ends the run, with the last failure (which names the component and its address).
    ///
    /// Both `attempt` and `recover` are handed `state` in turn (the fabric they both drive).
    pub fn retry<S: ?Sized, T>(
        &self,
        what: &str,
        step: u64,
        recovery: &mut Option<Recovery>,
        state: &mut S,
        mut attempt: impl FnMut(&mut S) -> Result<T>,
        mut recover: impl FnMut(&mut S) -> Result<bool>,
    ) -> Result<Option<T>> {
        loop {
            match attempt(state) {
                Err(Error::Unavailable(why)) => {
                    let r = recovery.get_or_insert_with(|| Recovery { step, since: Instant::now(), attempts: 0 });
                    r.attempts += 1;
                    let spent = r.since.elapsed();
                    if spent >= self.budget {
                        return Err(Error::Unavailable(format!(
                            "{what} {step} could not be completed: the run tried to recover for {:.1}s ({} attempts since step {} \
                             first failed; the retry budget is {:.1}s) and the last attempt failed with: {why}",
                            spent.as_secs_f64(),
                            r.attempts,
                            r.step,
                            self.budget.as_secs_f64()
                        )));
                    }
                    tracing::warn!(attempt = r.attempts, step, "{what} aborted, rerunning: {why}");
                    std::thread::sleep(self.pause.min(self.budget - spent));
                    if !recover(state)? {
                        return Ok(None);
                    }
                }
                other => return other.map(Some),
            }
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { budget: std::time::Duration::from_secs(60), pause: std::time::Duration::from_millis(500) }
    }
}

/// Brings MemoryX up to the engines' replicas, which hold `step` (steps applied). Returns whether it did: a
/// replica of another step (or none) leaves MemoryX as it was.
fn take_back(store: &dyn WeightStore, swarm: &mut dyn Swarm, step: u64) -> Result<bool> {
    let state = swarm.snapshot()?;
    let (at, _) = crate::memoryx::checkpoint::from_bytes(&state, "the engines' replica")?;
    if at != step {
        tracing::warn!(replica = at, expected = step, "the surviving replica is of another step");
        return Ok(false);
    }
    store.set_state(&state)?;
    Ok(true)
}

/// How the steps of a run are carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every layer streamed from MemoryX, forward and backward, every step.
    Streaming,
    /// The engines hold the model; MemoryX is brought up to date when `sync_at` asks and at the end.
    Resident,
}

/// What pipelined execution keeps beside the engines' replicas: whether they are primed with MemoryX's state,
/// and the step MemoryX's copy holds, which a fault that loses every replica goes back to.
struct Resident {
    /// Whether the engines hold MemoryX's state (not at the start, nor after a fault).
    primed: bool,
    /// The step MemoryX's copy holds.
    copy_at: u64,
    /// When it was last brought up to the replicas: at least every `snapshotSeconds`, so a fault that loses
    /// every replica costs at most that much work.
    copied: Instant,
    /// `spec.checkpoint.snapshotSeconds`.
    snapshot_every: std::time::Duration,
}

impl Resident {
    /// The replicas of a run starting at step `start` (which MemoryX's copy holds), not yet primed.
    fn new(start: u64, checkpoint: &crds::CheckpointSpec) -> Self {
        Resident {
            primed: false,
            copy_at: start,
            copied: Instant::now(),
            snapshot_every: std::time::Duration::from_secs(checkpoint.snapshot_seconds.max(1)),
        }
    }

    /// One step of pipelined execution: the engines hold the model, so only the batch goes down and the loss
    /// comes up; the gradients are summed and applied inside the fabric. Engines are primed with MemoryX's state
    /// first when they need it (at the start, and after a fault).
    fn step(
        &mut self,
        store: &dyn WeightStore,
        swarm: &mut dyn Swarm,
        job: &str,
        request: &StepRequest,
    ) -> Result<(LossSum, u64)> {
        let mut bytes = 0;
        if !self.primed {
            let (at, state) = store.state(job)?;
            if at != request.step {
                return Err(Error::Protocol(format!(
                    "MemoryX holds step {at} but the loop is at step {}",
                    request.step
                )));
            }
            swarm.prime(&state)?;
            bytes += state.len() as u64;
            self.primed = true;
        }
        Ok((swarm.resident_step(request)?, bytes))
    }

    /// Between attempts of `step`: the replacement engine has no replica, so the state is taken from a
    /// surviving one (or, if none survived, the run goes back to MemoryX's copy: `Ok(false)`) and they are all
    /// primed again. MemoryX's copy of this very step needs nothing taken back.
    fn recover(&mut self, store: &dyn WeightStore, swarm: &mut dyn Swarm, step: u64) -> Result<bool> {
        self.primed = false;
        if self.copy_at == step {
            return Ok(true);
        }
        match take_back(store, swarm, step) {
            Ok(taken) => {
                if taken {
                    self.copy_at = step;
                }
                Ok(taken)
            }
            Err(e) => {
                tracing::warn!("no replica to take back: {e}");
                Ok(false)
            }
        }
    }

    /// Brings MemoryX's copy up to the replicas after step `done` (steps applied) when it is due: `sync_at`
    /// asks, the run ends there, or the last copy is `snapshotSeconds` old. Returns `false` when the replicas
    /// could not be taken back: the run goes back to MemoryX's copy.
    fn sync(
        &mut self,
        steps: &Steps<'_>,
        swarm: &mut dyn Swarm,
        recovery: &mut Option<Recovery>,
        done: u64,
    ) -> Result<bool> {
        let due = (steps.sync_at)(done) || done == steps.range.end || self.copied.elapsed() >= self.snapshot_every;
        if !due {
            return Ok(true);
        }
        let (store, stop, copy_at) = (steps.store, steps.stop, self.copy_at);
        let synced = steps.retry.retry(
            "taking the replicas back after step",
            done,
            recovery,
            swarm,
            |s| take_back(store, s, done),
            |_| if stop() { Err(Error::Stopped { step: copy_at, checkpoint: None }) } else { Ok(true) },
        )?;
        if synced != Some(true) {
            self.primed = false;
            return Ok(false);
        }
        self.copy_at = done;
        self.copied = Instant::now();
        Ok(true)
    }
}

/// What a step's attempts drive, and what the recovery between them changes: MemoryX, the engines through
/// SwarmX, the shape of every step and, when the engines hold the model, their replicas' state.
struct Fabric<'r> {
    store: &'r dyn WeightStore,
    swarm: &'r mut dyn Swarm,
    shape: StepShape,
    /// The replicas' state in pipelined execution; `None` streams every layer every step.
    resident: Option<Resident>,
}

impl Fabric<'_> {
    /// One attempt of training step `step` (steps applied before it) over `samples`.
    fn attempt(&mut self, job: &str, samples: Vec<u32>, step: u64) -> Result<(LossSum, u64)> {
        match &mut self.resident {
            None => train_step(self.store, self.swarm, self.shape, samples, step),
            Some(r) => r.step(self.store, self.swarm, job, &self.shape.train(step, samples)),
        }
    }

    /// Between attempts of `step`: whether to run it again (`Ok(false)`: go back to MemoryX's copy), or
    /// [`Error::Stopped`] at the step MemoryX holds when the run is asked to stop. Every rerun draws on the
    /// step's one recovery budget.
    fn recover(&mut self, step: u64, stop: &dyn Fn() -> bool) -> Result<bool> {
        if stop() {
            return Err(Error::Stopped { step: self.back_to(step), checkpoint: None });
        }
        match &mut self.resident {
            None => Ok(true),
            Some(r) => r.recover(self.store, self.swarm, step),
        }
    }

    /// The step MemoryX holds while the loop is at `step`: its copy's when the engines hold the model, else
    /// `step` itself (a streamed step leaves MemoryX as it was until it commits).
    fn back_to(&self, step: u64) -> u64 {
        self.resident.as_ref().map_or(step, |r| r.copy_at)
    }
}

/// What [`run`] trains: the job, its store and data, and the steps to run.
pub struct Steps<'a> {
    /// The job's spec.
    pub spec: &'a crds::TrainingJobSpec,
    /// The job's identity on the wire.
    pub job: &'a str,
    /// MemoryX.
    pub store: &'a dyn WeightStore,
    /// What the training and held-out splits hold.
    pub data: &'a DataInfo,
    /// The steps to run: from the checkpoint resumed (or 0) to the job's total.
    pub range: std::ops::Range<u64>,
    /// How a step that loses a component is rerun.
    pub retry: RetryPolicy,
    /// Whether MemoryX's copy must be brought up to date after a step (a checkpoint is due), when the
    /// engines hold the model.
    pub sync_at: &'a dyn Fn(u64) -> bool,
    /// Whether the run is asked to stop: a step that fails meanwhile is not rerun, and the run ends with
    /// [`Error::Stopped`] at the step MemoryX holds (the caller checkpoints it).
    pub stop: &'a dyn Fn() -> bool,
}

/// What the step loop leaves for the summary.
struct Trained {
    /// The mean loss of the last step reported (NaN when none was run).
    final_loss: f64,
    /// Bytes moved between MemoryX and the fabric over the steps reported.
    bytes: u64,
    /// Wall time of the training steps.
    wall_s: f64,
}

/// Trains `steps.range` and evaluates. `on_step` sees every step's metrics as it finishes (and may
/// checkpoint); a step that fails because a component is unavailable is rerun whole, so no gradient is lost or
/// applied twice.
///
/// The execution mode is the plan's: when the model fits the engines whole (`pipelined`, or `auto` choosing it)
/// and the engines can hold replicas, they keep it resident and MemoryX's copy is brought up to date before
/// every step `sync_at` names (a checkpoint is due) and at the end. If a fault loses every replica, the run
/// goes back to MemoryX's copy and reruns the steps since, which reproduces them exactly.
pub fn run(
    steps: &Steps<'_>,
    swarm: &mut dyn Swarm,
    on_step: &mut dyn FnMut(&ProgressReport) -> Result<()>,
) -> Result<Summary> {
    let spec = steps.spec;
    // The tree's shape does not bear on the mode; the mode is all the loop takes from the plan.
    let plan = plan::appliance::Plan::new(spec, swarm.sram_bytes(), crds::contract::DEFAULT_FAN_OUT)?;
    let mode = if plan.execution_mode == crds::ExecutionMode::Pipelined && swarm.holds_replicas() {
        Mode::Resident
    } else {
        Mode::Streaming
    };
    tracing::info!(?mode, "execution");
    let layout = plan::layout::ModelLayout::from_spec(&spec.model);
    let resident = (mode == Mode::Resident).then(|| Resident::new(steps.range.start, &spec.checkpoint));
    let mut fabric = Fabric { store: steps.store, swarm: &mut *swarm, shape: StepShape::of(&plan, &layout), resident };
    let started = Instant::now();
    let (final_loss, bytes) = train_steps(steps, &mut fabric, plan.batch, on_step)?;
    let trained = Trained { final_loss, bytes, wall_s: started.elapsed().as_secs_f64() };
    summarize(steps, swarm, &plan, &layout, mode, trained)
}

/// The step loop of [`run`]: runs `steps.range` over `fabric`, reporting each step once to `on_step`, and
/// returns the last step's mean loss and the bytes streamed.
fn train_steps(
    steps: &Steps<'_>,
    fabric: &mut Fabric<'_>,
    batch: usize,
    on_step: &mut dyn FnMut(&ProgressReport) -> Result<()>,
) -> Result<(f64, u64)> {
    let Steps { spec, job, retry, stop, .. } = *steps;
    let (start, total) = (steps.range.start, steps.range.end);
    let sampler = Sampler::new(steps.data.train_samples, batch, spec.training.seed);
    let (mut bytes, mut final_loss) = (0u64, f64::NAN);
    // Steps already reported: a rerun after a lost replica does not report them twice.
    let mut reported = start;
    let mut step = start;
    let mut recovery: Option<Recovery> = None;
    while step < total {
        let step_started = Instant::now();
        let outcome = retry.retry(
            "step",
            step + 1,
            &mut recovery,
            &mut *fabric,
            |f| f.attempt(job, sampler.batch(step), step),
            |f| f.recover(step, stop),
        )?;
        let Some((loss, step_bytes)) = outcome else {
            let to = fabric.back_to(step);
            tracing::warn!(from = step, to, "every replica was lost; rerunning from MemoryX's copy");
            step = to;
            continue;
        };
        if let Some(r) = &mut fabric.resident
            && !r.sync(steps, fabric.swarm, &mut recovery, step + 1)?
        {
            tracing::warn!(
                from = step + 1,
                to = r.copy_at,
                "the replicas could not be taken back; rerunning from MemoryX's copy"
            );
            step = r.copy_at;
            continue;
        }
        step += 1;
        // A step past the one that failed first ends its recovery.
        if recovery.is_some_and(|r| step >= r.step) {
            recovery = None;
        }
        if step <= reported {
            continue;
        }
        reported = step;
        let step = step - 1;
        final_loss = loss.loss / loss.samples.max(1) as f64;
        if !final_loss.is_finite() {
            return Err(Error::Protocol(format!(
                "the loss became {final_loss} at step {}; lower spec.training.optimizer.learningRate",
                step + 1
            )));
        }
        bytes += step_bytes;
        on_step(&ProgressReport {
            step: step + 1,
            loss: final_loss,
            samples_per_s: batch as f64 / step_started.elapsed().as_secs_f64().max(1e-9),
            bytes_streamed: step_bytes,
            learning_rate: crate::optim::learning_rate(&spec.training.optimizer, &spec.training.schedule, step, total),
        })?;
    }
    Ok((final_loss, bytes))
}

/// A run's [`Summary`] once `trained`: the engines' counters, then the held-out evaluation (rerun like a step
/// if a component drops out), and the rates and totals of the steps run.
fn summarize(
    steps: &Steps<'_>,
    swarm: &mut dyn Swarm,
    plan: &plan::appliance::Plan,
    layout: &plan::layout::ModelLayout,
    mode: Mode,
    trained: Trained,
) -> Result<Summary> {
    let (start, total) = (steps.range.start, steps.range.end);
    let (shape, batch, wall_s) = (StepShape::of(plan, layout), plan.batch, trained.wall_s);
    let engines = swarm.stats()?;
    let eval_batch = batch.max(swarm.engines());
    let test_samples = &steps.data.eval_samples;
    let mut eval = steps
        .retry
        .retry(
            "evaluation after step",
            total,
            &mut None,
            swarm,
            |s| evaluate(steps.store, s, shape, test_samples, eval_batch, total),
            |_| Ok(true),
        )?
        .ok_or_else(|| Error::Unavailable("evaluation gave up".into()))?;
    if let Some(unigram) = steps.data.unigram_loss {
        eval.perplexity = Some(eval.loss.exp());
        eval.unigram_loss = Some(unigram);
    }
    let steps_run = total - start;
    let samples_per_s = (steps_run as usize * batch) as f64 / wall_s.max(1e-9);
    Ok(Summary {
        steps: total,
        final_loss: trained.final_loss,
        eval,
        wall_s,
        samples_per_s,
        tokens_per_s: samples_per_s * shape.tokens_per_sample as f64,
        model_weight_bytes: layout.weight_bytes(),
        bytes_streamed: trained.bytes,
        dense_equivalent_bytes: plan::appliance::step_bytes(layout, true) * steps_run,
        cs2: steps.spec.cs2,
        execution_mode: match mode {
            Mode::Resident => crds::ExecutionMode::Pipelined,
            Mode::Streaming => crds::ExecutionMode::WeightStreaming,
        },
        wse_utilization: engines.iter().map(|e| e.compute_s).sum::<f64>()
            / engines.len().max(1) as f64
            / wall_s.max(1e-9),
        simulated_step_s: engines.iter().map(|e| e.counters.simulated_s).fold(0.0, f64::max) / steps_run.max(1) as f64,
        engines,
        samples: Vec::new(),
        memoryx: MemoryxUsage::default(),
    })
}

#[cfg(test)]
mod retry_tests {
    use super::*;
    use std::time::Duration;

    /// A component that never answers again: the recovery ends once its one budget is spent, however many
    /// times the caller falls back and starts again (a return to MemoryX's copy draws on the same budget), and
    /// the error carries the last failure (which names the component).
    #[test]
    fn one_budget_bounds_every_path_of_a_steps_recovery() {
        let policy = RetryPolicy { budget: Duration::from_millis(300), pause: Duration::from_millis(20) };
        let started = Instant::now();
        let mut recovery = None;
        let mut fallbacks = 0;
        let err = loop {
            let r: Result<Option<()>> = policy.retry(
                "step",
                7,
                &mut recovery,
                &mut (),
                |_| Err(Error::Unavailable("engine-0 at 127.0.0.1:9: transport error".into())),
                |_| Ok(false),
            );
            match r {
                Ok(None) => fallbacks += 1,
                Ok(Some(())) => panic!("a component that never answers cannot succeed"),
                Err(e) => break e,
            }
        };
        let spent = started.elapsed();
        assert!(fallbacks > 3, "the caller fell back and tried again: {fallbacks}");
        assert!(spent >= Duration::from_millis(300) && spent < Duration::from_millis(600), "{spent:?}");
        let message = err.to_string();
        assert!(
            message.contains("step 7")
                && message.contains("engine-0 at 127.0.0.1:9")
                && message.contains("retry budget is 0.3s"),
            "{message}"
        );
        assert_eq!(recovery.map(|r| r.step), Some(7), "the recovery of the step that failed first");
    }

    /// A step that comes back within the budget succeeds, and other errors are not retried.
    #[test]
    fn a_component_that_comes_back_is_waited_for_and_other_errors_are_not_retried() {
        let policy = RetryPolicy { budget: Duration::from_secs(5), pause: Duration::from_millis(1) };
        let mut calls = 0;
        let got = policy.retry(
            "step",
            1,
            &mut None,
            &mut calls,
            |calls| {
                *calls += 1;
                if *calls < 3 { Err(Error::Unavailable("not yet".into())) } else { Ok(*calls) }
            },
            |_| Ok(true),
        );
        assert_eq!(got.unwrap(), Some(3));
        let mut calls = 0;
        let got: Result<Option<()>> = policy.retry(
            "step",
            1,
            &mut None,
            &mut calls,
            |calls| {
                *calls += 1;
                Err(Error::Protocol("wrong shape".into()))
            },
            |_| Ok(true),
        );
        assert!(got.is_err() && calls == 1);
    }
}
