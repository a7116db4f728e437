//! Test fixtures for the cluster client: the shared test job ([`crds::testing::mlp_job`]) in the states the
//! client shows (queued, running, succeeded), written once so every unit test reads the same statuses.

use crds::conditions::{ConditionStatus, ConditionType, Reason};
use crds::{Phase, Progress, TrainingJob, TrainingJobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A status condition as the operator writes it.
pub fn condition(type_: ConditionType, status: ConditionStatus, reason: Reason, message: &str) -> Condition {
    Condition {
        type_: type_.as_str().into(),
        status: status.as_str().into(),
        reason: reason.as_str().into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

fn with_status(name: &str, status: TrainingJobStatus) -> TrainingJob {
    let mut job = crds::testing::mlp_job(name, "ml", 2);
    job.status = Some(status);
    job
}

/// `train` at step 20 of 100 on its 2 CS-2s: loss 0.4321, 1234 samples/s, 65 s left.
pub fn running() -> TrainingJob {
    with_status(
        "train",
        TrainingJobStatus {
            phase: Some(Phase::Running),
            allocated_cs2: Some(2),
            progress: Progress {
                step: Some(20),
                total_steps: Some(100),
                loss: Some(0.43214),
                samples_per_second: Some(1234.0),
                ..Progress::default()
            },
            progress_percentage: Some(20),
            estimated_remaining_seconds: Some(65),
            conditions: vec![condition(
                ConditionType::Admitted,
                ConditionStatus::True,
                Reason::Admitted,
                "2 CS-2s allocated",
            )],
            ..TrainingJobStatus::default()
        },
    )
}

/// `waiting`, second in the queue for want of CS-2s.
pub fn queued() -> TrainingJob {
    with_status(
        "waiting",
        TrainingJobStatus {
            phase: Some(Phase::Queued),
            queue_position: Some(2),
            conditions: vec![condition(
                ConditionType::Admitted,
                ConditionStatus::False,
                Reason::InsufficientCapacity,
                "needs 2 CS-2s, 0 free",
            )],
            ..TrainingJobStatus::default()
        },
    )
}

/// `done`, trained to its 100th step.
pub fn succeeded() -> TrainingJob {
    with_status(
        "done",
        TrainingJobStatus {
            phase: Some(Phase::Succeeded),
            progress: Progress { step: Some(100), total_steps: Some(100), loss: Some(0.1), ..Progress::default() },
            progress_percentage: Some(100),
            estimated_remaining_seconds: Some(0),
            ..TrainingJobStatus::default()
        },
    )
}
