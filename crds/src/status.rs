//! What the appliance reports about a job: written by the operator to the status subresource and by
//! `wsctl run` to its summary, so both speak of progress in the same terms.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::Role;
use crate::execution::ExecutionMode;

/// Observed state of a [`crate::TrainingJob`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Where the job is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Why the job is in its phase, one condition per aspect (`Admitted`, `Ready`, `Suspended`, `Complete`,
    /// `Failed`), each with a machine-readable reason and a sentence for people.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where a queued job stands among the jobs waiting for CS-2s, 1 being next; what it waits for is the
    /// `Admitted` condition's reason and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub queue_position: Option<u32>,
    /// CS-2 systems the job holds now. Admission sums this over all jobs to know what is free, so the pool's
    /// state survives an operator restart without any memory of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_cs2: Option<u32>,
    /// Steps, loss, throughput and the newest checkpoint, as MemoryX last reported them.
    #[serde(flatten)]
    pub progress: Progress,
    /// Share of the steps done, 0 to 100 ([`Progress::percentage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub progress_percentage: Option<u32>,
    /// How long the remaining steps take at the throughput of the last steps ([`Progress::remaining_seconds`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000_000_000u64))]
    pub estimated_remaining_seconds: Option<u64>,
    /// Failures survived so far (engines or SwarmX nodes replaced, MemoryX restarted); past `spec.restartLimit`
    /// the job fails.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// Restarts of the current MemoryX container already counted in `restarts`, so each is counted once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memoryx_restarts_seen: u32,
    /// The step at which the operator asked MemoryX for a checkpoint (to suspend or rescale); the job moves on
    /// once a checkpoint at or after it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_requested_at_step: Option<u64>,
    /// When that checkpoint was asked for: a suspend or rescale waits for it only so long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_requested_at: Option<Time>,
    /// When the operator first saw the pool hold fewer CS-2s than the job holds (a node gone or cordoned, CS-2s
    /// lost): after a grace period the job goes on with fewer (`spec.minCs2`); cleared once they are back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_lost_at: Option<Time>,
    /// When the job was first admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The appliance the operator assembled for the spec it last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// Where the appliance runs: each pod of the job that the scheduler has placed, with its node, by role (input
    /// workers, engines, SwarmX nodes, MemoryX's weight servers), then name; empty while nothing is placed. A
    /// finished job keeps where its pods ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<PodPlacement>,
}

/// One pod of a job and the node it runs on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPlacement {
    /// What the pod runs.
    pub role: Role,
    /// The pod's name.
    pub pod: String,
    /// The node's name.
    pub node: String,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// How far training has come, as MemoryX reports it on `/status` (see [`crate::contract::MemoryxStatus`]) and
/// the TrainingJob status shows it: one type for both, so a field added here reaches the user without a copy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The optimizer steps completed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The optimizer steps the job will run in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// Mean training loss of the last completed step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Training throughput over the last steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second: Option<f64>,
    /// What one step takes on the simulated engines' cost model (the wall clock of the simulation is not it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_step_seconds: Option<f64>,
    /// Held-out accuracy of the last evaluation, when the job has run one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// Held-out loss of the last evaluation (nats per token for a language model): what an exported model is
    /// checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// The newest complete checkpoint: where a restart, a resume or a rescale continues from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointRef>,
}

impl Progress {
    /// Share of the steps done, 0 to 100, once both the step and the total are known.
    pub fn percentage(&self) -> Option<u32> {
        let (step, total) = (self.step?, self.total_steps?);
        (total > 0).then(|| (u128::from(step.min(total)) * 100 / u128::from(total)) as u32)
    }

    /// Seconds the remaining steps take at the reported throughput, with `batch` samples a step; none until a
    /// throughput is known.
    pub fn remaining_seconds(&self, batch: u32) -> Option<u64> {
        let rate = self.samples_per_second.filter(|r| r.is_finite() && *r > 0.0)?;
        let left = self.total_steps?.saturating_sub(self.step?);
        Some(((left as f64 * f64::from(batch) / rate).ceil() as u64).min(1_000_000_000_000))
    }

    /// Takes every field `newer` reports, keeping what it leaves out (a report without a loss yet does not
    /// erase the last one).
    pub fn merge(&mut self, newer: &Progress) {
        fn take<T: Clone>(into: &mut Option<T>, from: &Option<T>) {
            if from.is_some() {
                into.clone_from(from);
            }
        }
        take(&mut self.step, &newer.step);
        take(&mut self.total_steps, &newer.total_steps);
        take(&mut self.loss, &newer.loss);
        take(&mut self.samples_per_second, &newer.samples_per_second);
        take(&mut self.simulated_step_seconds, &newer.simulated_step_seconds);
        take(&mut self.eval_accuracy, &newer.eval_accuracy);
        take(&mut self.eval_loss, &newer.eval_loss);
        take(&mut self.last_checkpoint, &newer.last_checkpoint);
    }
}

/// A complete checkpoint MemoryX wrote.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRef {
    /// The optimizer step whose state it holds.
    pub step: u64,
    /// Where it is on MemoryX's checkpoint volume.
    pub path: String,
}

/// The appliance for one job, as the plan computes it: enough to see where memory goes and how the fabric is
/// shaped without running `wsctl plan`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// CS-2 systems, one engine each.
    pub cs2: u32,
    /// Samples each engine takes per step.
    pub shard: u64,
    /// Bytes MemoryX holds: weights, biases and optimizer state.
    pub memoryx_bytes: u64,
    /// SRAM of each engine.
    pub engine_sram_bytes: u64,
    /// The most an engine holds at once.
    pub peak_engine_bytes: u64,
    /// How weights reach the engines.
    pub execution_mode: ExecutionMode,
    /// Bytes one step moves between MemoryX and the fabric.
    pub step_bytes: u64,
    /// The SwarmX tree between MemoryX and the engines.
    pub swarmx: SwarmxTreeStatus,
    /// The engine pods, in index order.
    pub engines: Vec<String>,
}

/// The SwarmX broadcast/reduce tree.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SwarmxTreeStatus {
    /// Children per node (engines under a leaf, nodes under an inner node).
    pub fan_out: u32,
    /// Levels of nodes from the root (1 when a single node reaches every engine, 0 when a one-engine job's
    /// MemoryX drives its engine directly).
    pub depth: u32,
    /// SwarmX node pods, root first (none for one engine).
    pub nodes: Vec<String>,
}

/// Phases of a job's life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for enough free CS-2 systems.
    Queued,
    /// Its MemoryX, SwarmX and engines are being assembled.
    Starting,
    /// Training.
    Running,
    /// Writing a checkpoint.
    Checkpointing,
    /// Stopped on request with its state checkpointed; its CS-2s are free.
    Suspended,
    /// Trained to the end.
    Succeeded,
    /// Stopped for good; the conditions say why.
    Failed,
}

impl Phase {
    /// Whether the job is over for good, so it holds nothing and is never admitted again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    /// The name as it appears in the API, for events, logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Queued => "Queued",
            Phase::Starting => "Starting",
            Phase::Running => "Running",
            Phase::Checkpointing => "Checkpointing",
            Phase::Suspended => "Suspended",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn percentage_and_remaining_time_follow_the_steps_and_the_throughput() {
        let mut p = Progress { step: Some(25), total_steps: Some(200), ..Progress::default() };
        assert_eq!(p.percentage(), Some(12));
        assert_eq!(p.remaining_seconds(64), None, "no throughput yet");
        p.samples_per_second = Some(1600.0);
        // 175 steps of 64 samples at 1600 samples/s.
        assert_eq!(p.remaining_seconds(64), Some(7));
        p.step = Some(200);
        assert_eq!((p.percentage(), p.remaining_seconds(64)), (Some(100), Some(0)));
        p.total_steps = Some(0);
        assert_eq!(p.percentage(), None);
        p.samples_per_second = Some(f64::NAN);
        assert_eq!(p.remaining_seconds(64), None);
    }
}
