//! The one job driver: everything between "here is a job and a fabric" and "here is the trained model and its
//! summary". MemoryX's program runs it against the SwarmX tree on the network and `wsctl run --in-process`
//! against engines in the same process, so both resume from checkpoints, write them, choose the execution mode,
//! report progress and decode samples in exactly the same way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crds::contract::{MemoryxPhase, MemoryxStatus, ProgressReport};
use crds::{CheckpointRef, TrainingJobSpec};

use crate::coordinator::records::{Records, SUMMARY_FILE};
use crate::coordinator::train::MemoryxUsage;
use crate::coordinator::train::{self, RetryPolicy, Summary};
use crate::input::DataInfo;
use crate::memoryx::store::MemoryX;
use crate::memoryx::weight_server::Masking;
use crate::memoryx::{checkpoint, manifest};
use crate::swarmx::Swarm;
use errors::{Error, Result};
use plan::layout::ModelLayout;

/// A job ready to train: its spec, its identity on the wire and what its data holds (the data itself stays
/// with the input workers).
pub struct Job {
    /// What to train.
    pub spec: TrainingJobSpec,
    /// The job's identity on the wire and in checkpoints.
    pub id: String,
    /// What the data holds, as an input worker described it.
    pub data: DataInfo,
    /// Optimizer steps in the whole run.
    pub total_steps: u64,
    /// The TrainingJob's uid when the manifest has one (in a cluster): checkpoints record it, and only this
    /// job's are resumed.
    pub uid: Option<String>,
    /// Where this process reads the pretrained folder `spec.model.from` names: the path as given, until
    /// [`Job::locate_pretrained`] finds it inside the data volume.
    pub pretrained: Option<PathBuf>,
}

impl Job {
    /// The job over data that holds `data`, its steps counted; fails with what to change when the data cannot
    /// train.
    pub fn new(spec: TrainingJobSpec, id: impl Into<String>, data: DataInfo) -> Result<Job> {
        let total_steps = train::total_steps(&spec.training, data.train_samples)?;
        let pretrained = spec.model.from.as_ref().map(PathBuf::from);
        Ok(Job { spec, id: id.into(), data, total_steps, uid: None, pretrained })
    }

    /// The job with its pretrained folder found where this process reads it: inside the data volume mounted
    /// at `root` when the job names one ([`crate::memoryx::huggingface::locate`], which checks the folder is
    /// the job's model).
    pub fn locate_pretrained(mut self, root: Option<&Path>) -> Result<Job> {
        self.pretrained = crate::memoryx::huggingface::locate(&self.spec, root)?;
        Ok(self)
    }

    /// The model's layout.
    pub fn layout(&self) -> ModelLayout {
        ModelLayout::from_spec(&self.spec.model)
    }

    /// A freshly initialised MemoryX for this job: the store the driver trains, and the shape of every
    /// pipelined engine's replica.
    pub fn memoryx(&self) -> MemoryX {
        let t = &self.spec.training;
        MemoryX::new(self.layout(), t.optimizer.clone(), t.schedule.clone(), self.total_steps, t.seed)
    }

    /// How this job's state is trained: its optimizer, schedule, run length and seed.
    pub fn recipe(&self) -> crate::optim::Recipe {
        crate::optim::Recipe { from: self.pretrained.clone(), ..crate::optim::Recipe::of(&self.spec, self.total_steps) }
    }

    /// How this job's MemoryX is spread over weight servers, memory and disk.
    pub fn memoryx_plan(&self) -> Result<plan::memoryx::MemoryxPlan> {
        plan::memoryx::MemoryxPlan::for_spec(&self.spec)
    }

    /// How weight server `slice` of this job stores its slice: the memory budget, and a disk tier under
    /// `outputs.tier_dir` (or the checkpoint directory's `tier`, or a scratch directory).
    pub fn storage(
        &self,
        outputs: &Outputs,
        slice: crate::memoryx::slice::SliceId,
    ) -> crate::memoryx::weight_server::Storage {
        let tier_base = outputs
            .tier_dir
            .clone()
            .or_else(|| outputs.checkpoint_dir.as_ref().map(|c| c.join("tier")))
            .unwrap_or_else(|| std::env::temp_dir().join(format!("weightstream-tier-{}", std::process::id())));
        crate::memoryx::weight_server::Storage {
            memory_bytes: self.spec.memoryx.memory_bytes,
            tier_dir: Some(tier_base.join(format!("server-{}", slice.index))),
        }
    }

    /// Weight server `slice` of this job, built in this process and stored as [`Job::storage`] says.
    pub fn local_slice(
        &self,
        outputs: &Outputs,
        slice: crate::memoryx::slice::SliceId,
    ) -> Result<crate::memoryx::weight_server::LocalSlice> {
        let t = &self.spec.training;
        let layout = self.layout();
        let lengths = crate::memoryx::weight_server::layer_lengths(&layout, &t.optimizer, &Masking::of(&self.recipe()));
        let storage = self.storage(outputs, slice);
        crate::memoryx::weight_server::LocalSlice::new(&layout, &lengths, self.recipe(), slice, storage)
    }

    /// The job's MemoryX with every weight server in this process, as the plan spreads it: one in memory
    /// (the store of earlier versions), or several, each with its budget and disk tier.
    pub fn store(&self, outputs: &Outputs) -> Result<MemoryX> {
        let plan = self.memoryx_plan()?;
        if plan.servers == 1 && plan.disk_bytes == 0 && self.spec.model.from.is_none() {
            return Ok(self.memoryx());
        }
        MemoryX::sharded(self.layout(), &self.recipe(), plan.servers, &|slice| self.storage(outputs, slice))
    }

    /// Builds replicas of this job's MemoryX for engines that hold the model (pipelined execution).
    pub fn replica_factory(&self) -> crate::engine::replica::ReplicaFactory {
        let (layout, recipe) = (self.layout(), self.recipe());
        Arc::new(move || MemoryX::replica(layout.clone(), &recipe))
    }
}

/// Where the driver writes, and how patient it is.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// Checkpoints go here, and the run resumes from the newest good one found here.
    pub checkpoint_dir: Option<PathBuf>,
    /// `metrics.jsonl` and `summary.json` go here.
    pub out: Option<PathBuf>,
    /// Where the weight servers' disk tiers go (default: `tier` in the checkpoint directory).
    pub tier_dir: Option<PathBuf>,
    /// Lines of text to decode from a trained language model into the summary.
    pub sample: usize,
    /// How a step that loses a component is rerun.
    pub retry: RetryPolicy,
    /// After a checkpoint asked for from outside (`POST /checkpoint`: the operator suspends or rescales the
    /// job), wait this long before the next step, so the job stops at that checkpoint rather than running on
    /// while the operator tears it down; training goes on if nobody stops it in that time.
    pub hold_after_requested_checkpoint: std::time::Duration,
}

/// Runs a job to the end and keeps its `/status` true on the way.
pub struct Driver {
    job: Job,
    outputs: Outputs,
    /// The store to train, when the caller assembled it (weight servers on the network); else the driver
    /// builds the job's own.
    store: Mutex<Option<MemoryX>>,
    status: Arc<Mutex<MemoryxStatus>>,
    want_checkpoint: Arc<AtomicBool>,
    /// Set when the process is asked to stop (a termination signal): the driver checkpoints at the next step
    /// boundary and ends with [`Error::Stopped`].
    stop: Arc<AtomicBool>,
}

impl Driver {
    /// A driver for `job` writing to `outputs`; its status starts as `Starting`.
    pub fn new(job: Job, outputs: Outputs) -> Driver {
        Driver {
            job,
            outputs,
            store: Mutex::new(None),
            status: Arc::default(),
            want_checkpoint: Arc::default(),
            stop: Arc::default(),
        }
    }

    /// Trains `store` instead of a store of the job's own: MemoryX's program hands it its weight servers.
    pub fn with_store(&mut self, store: MemoryX) {
        self.store = Mutex::new(Some(store));
    }

    /// Reports through `status` and takes checkpoint requests from `want_checkpoint` instead of its own: for a
    /// program that serves them before the job's data is loaded.
    pub fn share(&mut self, status: Arc<Mutex<MemoryxStatus>>, want_checkpoint: Arc<AtomicBool>) {
        self.status = status;
        self.want_checkpoint = want_checkpoint;
    }

    /// Stops gracefully once `stop` is set (by a termination signal): the step in flight finishes, MemoryX's
    /// copy is brought up to it, a checkpoint is written, and [`Driver::run`] ends with [`Error::Stopped`]. A
    /// step that cannot finish (its engines went first, as in a drain) is not retried: the state MemoryX holds
    /// is checkpointed instead.
    pub fn stop_on(&mut self, stop: Arc<AtomicBool>) {
        self.stop = stop;
    }

    /// The job being driven.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The live status, for MemoryX's `GET /status`.
    pub fn status(&self) -> Arc<Mutex<MemoryxStatus>> {
        self.status.clone()
    }

    fn update(&self, f: impl FnOnce(&mut MemoryxStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Trains the job on `swarm` from its newest checkpoint (or from scratch) to the end, evaluates it,
    /// decodes samples and writes the summary. `on_step` sees each step's progress after it is recorded (and
    /// checkpointed, when one was due). The status ends `Succeeded`, or `Failed` with the error's message.
    pub fn run(&self, swarm: &mut dyn Swarm, on_step: &mut dyn FnMut(&ProgressReport)) -> Result<Summary> {
        let result = self.train(swarm, on_step);
        self.update(|s| match &result {
            Ok(summary) => {
                s.phase = MemoryxPhase::Succeeded;
                s.progress.eval_accuracy = Some(summary.eval.accuracy);
                s.progress.eval_loss = Some(summary.eval.loss);
            }
            // Not a failure: the job resumes from the checkpoint just written.
            Err(Error::Stopped { .. }) => {}
            Err(e) => {
                s.phase = MemoryxPhase::Failed;
                s.message = Some(e.to_string());
            }
        });
        result
    }

    fn train(&self, swarm: &mut dyn Swarm, on_step: &mut dyn FnMut(&ProgressReport)) -> Result<Summary> {
        let job = &self.job;
        let store = match self.store.lock().ok().and_then(|mut s| s.take()) {
            Some(store) => store,
            None => job.store(&self.outputs)?,
        };
        if store.servers() > 1 {
            self.await_servers(&store)?;
        }
        let mut start = self.resume(&store)?;
        if start == 0 && store.server_steps().iter().any(|s| !matches!(s, Ok(0))) {
            return Err(Error::Protocol(
                "the weight servers already hold trained state but there is no complete checkpoint to agree on; \
                 restart every weight server"
                    .into(),
            ));
        }
        // Over several servers, a run's first checkpoint is its start: should the coordinator restart before the
        // first periodic one, the others (which kept training) are taken back to it rather than refused.
        if start == 0 && store.servers() > 1 && self.outputs.checkpoint_dir.is_some() {
            self.write_checkpoint(&store, 0)?;
        }
        let mut recoveries = 0;
        loop {
            match self.train_from(&store, start, swarm, on_step) {
                Ok(summary) => return Ok(summary),
                // A weight server that restarted lost its slice: every server goes back to the last complete
                // checkpoint together, and the steps since are trained again.
                Err(e)
                    if store.servers() > 1 && recoveries < self.job.spec.restart_limit && self.server_lost(&store) =>
                {
                    recoveries += 1;
                    tracing::warn!(
                        recoveries,
                        "a weight server lost its state ({e}); resuming every server from the last complete checkpoint"
                    );
                    self.await_servers(&store)?;
                    start = self.resume(&store)?;
                    if start == 0 && store.step() != 0 {
                        return Err(Error::Unavailable(format!(
                            "a weight server restarted and the job has no complete checkpoint to resume it from ({e}); \
                             set spec.checkpoint.intervalSteps so it can recover"
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a server no longer holds the step the coordinator counts (it restarted) or cannot be reached.
    fn server_lost(&self, store: &MemoryX) -> bool {
        let at = store.step();
        store.server_steps().iter().any(|s| !matches!(s, Ok(step) if *step == at))
    }

    /// Waits for every server to answer again, up to the retry policy's patience.
    fn await_servers(&self, store: &MemoryX) -> Result<()> {
        let patience = self.outputs.retry.budget;
        let deadline = std::time::Instant::now() + patience;
        loop {
            let steps = store.server_steps();
            if steps.iter().all(Result::is_ok) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                let why =
                    steps.into_iter().filter_map(Result::err).map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
                return Err(Error::Unavailable(format!("weight servers did not come back within {patience:?}: {why}")));
            }
            std::thread::sleep(self.outputs.retry.pause);
        }
    }

    /// Puts the newest complete checkpoint back into `store` (one file for one server, a manifest and its
    /// slices for several) and returns its step, or 0 when there is none.
    fn resume(&self, store: &MemoryX) -> Result<u64> {
        let (job, spec) = (&self.job, &self.job.spec);
        let Some(dir) = &self.outputs.checkpoint_dir else { return Ok(0) };
        // The newest of either kind, whatever number of servers wrote it: the state is cut again for this store.
        let max_bytes = plan::limits::Limits::for_spec(spec).state_bytes();
        let sliced = manifest::latest(dir, job.uid.as_deref())?;
        let whole = checkpoint::latest_for(dir, job.uid.as_deref(), max_bytes)?;
        let newer_whole = match (&sliced, whole) {
            (Some((m, _)), Some(w)) if w.0 > m.step => Some(w),
            (None, w) => w,
            _ => None,
        };
        let found = match (newer_whole, sliced) {
            (Some((step, tensors, path)), _) => {
                store.restore(step, &tensors)?;
                Some((step, path))
            }
            (None, Some((m, path))) => {
                store.read_slices(dir, m.step, &m.slices, max_bytes)?;
                Some((m.step, path))
            }
            (None, None) => None,
        };
        let Some((step, path)) = found else { return Ok(0) };
        tracing::info!(step, path = %path.display(), "resumed from checkpoint");
        let at = CheckpointRef { step, path: path.display().to_string() };
        self.update(|s| s.progress.last_checkpoint = Some(at));
        Ok(step.min(job.total_steps))
    }

    /// Writes a checkpoint of `store` after `step`: one file for one server; for several, each server's slice
    /// and then the manifest that makes them count.
    fn write_checkpoint(&self, store: &MemoryX, step: u64) -> Result<()> {
        let (job, spec) = (&self.job, &self.job.spec);
        let Some(dir) = &self.outputs.checkpoint_dir else { return Ok(()) };
        self.update(|s| s.phase = MemoryxPhase::Checkpointing);
        let keep = spec.checkpoint.keep as usize;
        let path = if store.servers() == 1 {
            let (at, tensors) = store.snapshot()?;
            debug_assert_eq!(at, step);
            let owner = checkpoint::Owner {
                job: &job.id,
                uid: job.uid.as_deref(),
                model: Some((&spec.model, spec.training.seed)),
            };
            checkpoint::write_owned(dir, at, &tensors, &owner, keep)?
        } else {
            let slices = store.write_slices(dir, step, &job.id)?;
            let m = manifest::Manifest {
                step,
                job: job.id.clone(),
                uid: job.uid.clone(),
                model: Some(spec.model.clone()),
                seed: spec.training.seed,
                slices,
            };
            let (path, kept) = manifest::write_manifest(dir, &m, keep)?;
            for i in 0..store.servers() as u32 {
                let slice = crate::memoryx::slice::SliceId { index: i, count: store.servers() as u32 };
                manifest::retain_slices(&manifest::slice_dir(dir, i), slice, &kept)?;
            }
            path
        };
        self.update(|s| {
            s.phase = MemoryxPhase::Running;
            s.progress.last_checkpoint = Some(CheckpointRef { step, path: path.display().to_string() });
        });
        Ok(())
    }

    fn train_from(
        &self,
        store: &MemoryX,
        start: u64,
        swarm: &mut dyn Swarm,
        on_step: &mut dyn FnMut(&ProgressReport),
    ) -> Result<Summary> {
        let (job, spec, total) = (&self.job, &self.job.spec, self.job.total_steps);
        self.update(|s| {
            s.phase = MemoryxPhase::Running;
            s.progress.step = Some(start);
            s.progress.total_steps = Some(total);
        });
        tracing::info!(engines = swarm.engines(), servers = store.servers(), start, total, "training");
        let mut records = self.outputs.out.as_deref().map(|out| Records::open(out, start)).transpose()?;
        let interval = spec.checkpoint.interval_steps;
        let due = |step: u64| interval > 0 && step.is_multiple_of(interval);
        let stopping = || self.stop.load(Ordering::SeqCst);
        // With the model resident on the engines, MemoryX's copy is brought up to date for each checkpoint.
        let sync_at = |step: u64| due(step) || self.want_checkpoint.load(Ordering::SeqCst) || stopping();
        let steps = train::Steps {
            spec,
            job: &job.id,
            store,
            data: &job.data,
            range: start..total,
            retry: self.outputs.retry,
            sync_at: &sync_at,
            stop: &stopping,
        };
        let trained = train::run(&steps, swarm, &mut |m: &ProgressReport| {
            self.update(|s| {
                s.progress.step = Some(m.step);
                s.progress.loss = Some(m.loss);
                s.progress.samples_per_second = Some(m.samples_per_s);
            });
            if let Some(r) = records.as_mut() {
                r.step(m)?;
            }
            let requested = self.want_checkpoint.swap(false, Ordering::SeqCst);
            // MemoryX's copy holds this step unless the stop came after its replicas were asked for it: then the
            // next step brings it up (sync_at) and stops there.
            let stop_here = stopping() && store.step() == m.step;
            if due(m.step) || requested || stop_here {
                self.write_checkpoint(store, m.step)?;
            }
            on_step(m);
            if stop_here {
                return Err(self.stopped_at(m.step));
            }
            let hold = self.outputs.hold_after_requested_checkpoint;
            if requested && self.outputs.checkpoint_dir.is_some() && !hold.is_zero() {
                tracing::info!(step = m.step, ?hold, "holding at the requested checkpoint until stopped");
                // The stop this hold waits for (the operator scaling MemoryX down) ends it at once.
                let until = std::time::Instant::now() + hold;
                while std::time::Instant::now() < until {
                    if stopping() {
                        return Err(self.stopped_at(m.step));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                tracing::info!(step = m.step, "nobody stopped the job at its checkpoint; training on");
            }
            Ok(())
        });
        let mut summary = match trained {
            // A step that could not finish while stopping: MemoryX's state is what is saved.
            Err(Error::Stopped { checkpoint: None, .. }) => return Err(self.stop_with(store)),
            other => other?,
        };
        if let Some(r) = records.as_mut() {
            r.end(total, &summary.eval, summary.wse_utilization)?;
        }
        let last = self.last_checkpoint().map(|c| c.step);
        if self.outputs.checkpoint_dir.is_some() && last != Some(total) {
            self.write_checkpoint(store, total)?;
        }
        self.update(|s| s.progress.simulated_step_seconds = Some(summary.simulated_step_s));
        summary.samples =
            crate::coordinator::sample::lines(store, &job.layout(), self.outputs.sample, spec.training.seed)?;
        summary.memoryx = MemoryxUsage::of(store);
        if let Some(out) = &self.outputs.out {
            write_json_atomic(&out.join(SUMMARY_FILE), &summary)?;
        }
        Ok(summary)
    }

    /// The newest checkpoint written or resumed from.
    fn last_checkpoint(&self) -> Option<CheckpointRef> {
        self.status.lock().ok().and_then(|s| s.progress.last_checkpoint.clone())
    }

    /// Ends a run asked to stop mid-step: checkpoints the step MemoryX holds (unless that checkpoint exists)
    /// and returns [`Error::Stopped`] naming it, or the error that kept it from being written.
    fn stop_with(&self, store: &MemoryX) -> Error {
        let step = store.step();
        let have = self.last_checkpoint().filter(|c| c.step == step);
        if have.is_none()
            && step > 0
            && let Err(e) = self.write_checkpoint(store, step)
        {
            return e;
        }
        self.stopped_at(step)
    }

    /// [`Error::Stopped`] at `step`, naming its checkpoint when one of that step was written.
    fn stopped_at(&self, step: u64) -> Error {
        let checkpoint = self.last_checkpoint().filter(|c| c.step == step).map(|c| c.path);
        tracing::info!(step, ?checkpoint, "stopped on a termination signal");
        Error::Stopped { step, checkpoint }
    }
}

/// Writes `value` as pretty JSON through a temporary file and a rename, so a reader never sees half a file.
pub fn write_json_atomic(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::io("encoding JSON", e.into()))?;
    std::fs::write(&tmp, text + "\n").map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))
}
