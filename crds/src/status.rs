//! What the appliance reports about a job: written by the operator to the status subresource and by
//! `wsctl run` to its summary, so both speak of progress in the same terms.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a [`crate::TrainingJob`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Where the job is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
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
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
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
