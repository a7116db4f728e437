//! What MemoryX, the job's coordinator, answers on `GET /status`: the operator reads exactly this type and
//! copies its [`Progress`] into the TrainingJob's status.

use serde::{Deserialize, Serialize};

use crate::status::Progress;

/// Where MemoryX's training loop is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryxPhase {
    /// Up, but still loading data, restoring a checkpoint or waiting for its engines.
    #[default]
    Starting,
    /// Training.
    Running,
    /// Writing a checkpoint.
    Checkpointing,
    /// Trained to the end (and wrote the final checkpoint).
    Succeeded,
    /// Gave up; `message` says why.
    Failed,
}

/// The body of MemoryX's `GET /status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryxStatus {
    /// Where the loop is.
    pub phase: MemoryxPhase,
    /// Steps, loss, throughput, the newest checkpoint: what the TrainingJob status shows.
    #[serde(flatten)]
    pub progress: Progress,
    /// Why the job failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl MemoryxStatus {
    /// A report of `phase` at `step` and nothing else: what a stand-in for MemoryX scripts.
    pub fn at(phase: MemoryxPhase, step: u64) -> Self {
        MemoryxStatus { phase, progress: Progress { step: Some(step), ..Progress::default() }, message: None }
    }

    /// The steps completed so far (0 before the first).
    pub fn step(&self) -> u64 {
        self.progress.step.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_memoryx_serves_and_refuses_unknown_phases() {
        let body = r#"{"phase":"Checkpointing","step":12,"totalSteps":100,"loss":0.25,"samplesPerSecond":900.5,
            "simulatedStepSeconds":0.001,"lastCheckpoint":{"step":10,"path":"/var/lib/weightstream/checkpoints/10"},
            "evalAccuracy":0.9,"message":null}"#;
        let s: MemoryxStatus = serde_json::from_str(body).unwrap();
        assert_eq!(s.phase, MemoryxPhase::Checkpointing);
        assert_eq!(
            (s.step(), s.progress.total_steps, s.progress.last_checkpoint.as_ref().unwrap().step),
            (12, Some(100), 10)
        );
        let minimal: MemoryxStatus = serde_json::from_str(r#"{"phase":"Starting","step":0,"totalSteps":0}"#).unwrap();
        assert_eq!((minimal.phase, minimal.progress.loss), (MemoryxPhase::Starting, None));
        assert!(serde_json::from_str::<MemoryxStatus>(r#"{"phase":"Sleeping"}"#).is_err());
        let back: MemoryxStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
