//! The words of a job's status conditions: their types, their `True`/`False` status and their reasons. The
//! operator writes them and `wsctl` (and scripts, through `kubectl`) reads them, so they are spelled once here
//! as enums, and each string the API shows comes from [`ConditionType::as_str`], [`ConditionStatus::as_str`]
//! or [`Reason::as_str`]. The conditions themselves stay Kubernetes' own [`Condition`] objects, so what is
//! written to the API server is unchanged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The aspects of a job the status has one condition each for (`status.conditions[].type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// Whether the job holds its CS-2s: `True` from admission until it is suspended, rescaled away or over;
    /// while `False`, its reason says what a queued job waits for.
    Admitted,
    /// Whether every child is up and MemoryX reports progress; while `False`, its reason says what the job
    /// waits for (pods, MemoryX) or what the API server refused.
    Ready,
    /// Whether the job is suspended on request (`spec.suspend`), its state checkpointed and its CS-2s free.
    Suspended,
    /// Whether the job trained to the end.
    Complete,
    /// Whether the job stopped for good on an error; its reason and message say which.
    Failed,
}

impl ConditionType {
    /// Every condition type, for code and tests that go through them all.
    pub const ALL: [ConditionType; 5] = [
        ConditionType::Admitted,
        ConditionType::Ready,
        ConditionType::Suspended,
        ConditionType::Complete,
        ConditionType::Failed,
    ];

    /// The type as it appears in the API (`Admitted`, `Ready`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Admitted => "Admitted",
            ConditionType::Ready => "Ready",
            ConditionType::Suspended => "Suspended",
            ConditionType::Complete => "Complete",
            ConditionType::Failed => "Failed",
        }
    }

    /// Whether condition `c` is of this type.
    pub fn of(self, c: &Condition) -> bool {
        c.type_ == self.as_str()
    }

    /// The condition of this type among `conditions`, if one was written: readers look conditions up by type,
    /// never by position.
    pub fn find(self, conditions: &[Condition]) -> Option<&Condition> {
        conditions.iter().find(|c| self.of(c))
    }
}

impl std::fmt::Display for ConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition's `status`: Kubernetes spells it as a string, and the operator writes only `True` or `False`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The aspect holds.
    True,
    /// The aspect does not hold; the reason says why.
    False,
    /// Not known: the operator never writes it, but Kubernetes allows it, so readers must not take a
    /// condition that is not `True` for `False`.
    Unknown,
}

impl ConditionStatus {
    /// The status as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// Whether condition `c` has this status.
    pub fn of(self, c: &Condition) -> bool {
        c.status == self.as_str()
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { ConditionStatus::True } else { ConditionStatus::False }
    }
}

impl std::fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Machine-readable reasons of the conditions, and of the Events the operator records: one enum for all
/// condition types, since several reasons (`Suspended`, `Released`, the failures) appear on more than one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    // Waiting for admission (`Admitted=False`, phase `Queued`).
    /// `Admitted=False`: the job holds no CS-2s and admission gave no verdict this pass.
    AwaitingAdmission,
    /// `Admitted=False`: `spec.priorityClassName` names a PriorityClass that does not exist, so the job is never
    /// admitted (a Warning Event too: a cluster admin or the owner must act).
    PriorityClassNotFound,
    /// `Admitted=False`: the job wants more CS-2s than the whole pool has, so it can never start.
    ExceedsPool,
    /// `Admitted=False`: the job is next in the queue but not enough CS-2s are free.
    InsufficientCapacity,
    /// `Admitted=False`: jobs ahead in the queue wait for CS-2s first, so this one may not jump them.
    WaitingForEarlierJobs,
    /// `Admitted=False`: admission was asked about a job that waits for nothing (a race with its own update).
    NotWaiting,
    /// `Admitted=False`: `spec.data.volume` names a PersistentVolumeClaim that does not exist; the job waits
    /// outside the queue, blocking no one.
    DataVolumeNotFound,
    /// `Admitted=False`: no node advertises `weightstream.dev/cs2` and no pool size is configured.
    NoPool,
    /// `Admitted=False`: the job is labelled `kueue.x-k8s.io/queue-name`, so Kueue admits it, and its Workload is
    /// not admitted yet (Kueue's reason, its ClusterQueue and its position are in the message).
    KueueQueued,

    // Holding CS-2s (`Admitted=True`) and the moves between sizes.
    /// `Admitted=True` and the `Starting` transition: all the job's CS-2s were free and it got them.
    Admitted,
    /// The `Starting` transition and `Suspended=False`: a suspended job was admitted again and continues from
    /// its checkpoint.
    Resumed,
    /// `Admitted=True` and the `Starting` transition: the job was reassembled at its new `spec.cs2`.
    Rescaled,
    /// `Admitted=True`: the job keeps running at its old size while growing to `spec.cs2` waits for free CS-2s.
    RescaleWaitingForCapacity,
    /// The `Checkpointing` and `Starting` transitions and a Warning Event: CS-2s the job held were lost for good
    /// (a node gone or cordoned, the pool shrunk), and it goes on with fewer, down to `spec.minCs2`.
    CapacityLost,
    /// The `Checkpointing` and `Queued` transitions and a Warning Event: a waiting job of a higher PriorityClass
    /// needs the CS-2s (preemption allowed by the operator); the job checkpoints, gives them back and waits.
    Preempted,
    /// The `Checkpointing` and `Queued` transitions and a Warning Event: Kueue evicted the job's Workload (it was
    /// preempted, its queue stopped, its quota shrank); the job checkpoints, gives its CS-2s back and requeues.
    KueueEvicted,
    /// The `Checkpointing` transition: a checkpoint is written before a suspend gives back the CS-2s.
    Suspending,
    /// The `Checkpointing` transition: a checkpoint is written before the job is reassembled at a new size.
    Rescaling,
    /// `Suspended=True`, `Admitted=False`, `Ready=False` and the `Suspended` transition: suspended on request.
    Suspended,
    /// `Admitted=False`: the job is over (succeeded or failed) and its CS-2s are free.
    Released,

    // Readiness (`Ready`).
    /// `Ready=False`: the appliance is being assembled (or reassembled) after admission or a rescale.
    Assembling,
    /// `Ready=False` and the `Starting` transition: engine, SwarmX or input-worker pods are not ready yet.
    PodsNotReady,
    /// `Ready=False` and the `Starting` transition: failed pods are being replaced (each counts as a restart).
    ReplacingFailedPods,
    /// `Ready=False` and the `Starting` transition: MemoryX is loading data, restoring its checkpoint or
    /// reaching its engines.
    CoordinatorStarting,
    /// `Ready=False` and the `Starting` transition: MemoryX does not answer `/status` yet.
    CoordinatorUnreachable,
    /// `Ready=True` and the `Running`/`Checkpointing` transitions: every child is ready and MemoryX reports
    /// progress.
    Training,
    /// `Ready=False`: the job succeeded and its CS-2s are free.
    Finished,
    /// `Ready=False` and a Warning Event: the API server refused a child with 403 (Pod Security, RBAC, a quota).
    PodsForbidden,
    /// `Ready=False` and a Warning Event: the API server refused a child as invalid (422).
    ChildInvalid,
    /// `Ready=False` and a Warning Event: MemoryX's pod was refused for another reason, as its StatefulSet says.
    PodCreateFailed,
    /// `Ready=False` and a Warning Event: the stored TrainingJob does not decode, so the operator cannot act on it.
    InvalidSpec,

    // The end.
    /// `Complete=True` and the `Succeeded` transition: MemoryX trained every step.
    TrainingComplete,
    /// `Failed=True`: the plan refuses the job (it cannot fit an engine at its size).
    PlanRejected,
    /// `Failed=True`: MemoryX reported that training failed.
    DataPlaneFailed,
    /// `Failed=True`: the job ran longer than `spec.activeDeadlineSeconds` since its first admission.
    DeadlineExceeded,
    /// `Failed=True`: more failures of MemoryX or engines than `spec.restartLimit`.
    RestartLimitExceeded,
    /// `Failed=True`: a role refused the job's input (its data, model or plan) at run time, so it failed at once
    /// rather than after `spec.restartLimit` runs that would fail the same way.
    InputRefused,
}

impl Reason {
    /// Every reason, for code and tests that go through them all.
    pub const ALL: [Reason; 37] = [
        Reason::AwaitingAdmission,
        Reason::PriorityClassNotFound,
        Reason::ExceedsPool,
        Reason::InsufficientCapacity,
        Reason::WaitingForEarlierJobs,
        Reason::NotWaiting,
        Reason::DataVolumeNotFound,
        Reason::NoPool,
        Reason::KueueQueued,
        Reason::Admitted,
        Reason::Resumed,
        Reason::Rescaled,
        Reason::RescaleWaitingForCapacity,
        Reason::CapacityLost,
        Reason::Preempted,
        Reason::KueueEvicted,
        Reason::Suspending,
        Reason::Rescaling,
        Reason::Suspended,
        Reason::Released,
        Reason::Assembling,
        Reason::PodsNotReady,
        Reason::ReplacingFailedPods,
        Reason::CoordinatorStarting,
        Reason::CoordinatorUnreachable,
        Reason::Training,
        Reason::Finished,
        Reason::PodsForbidden,
        Reason::ChildInvalid,
        Reason::PodCreateFailed,
        Reason::InvalidSpec,
        Reason::TrainingComplete,
        Reason::PlanRejected,
        Reason::DataPlaneFailed,
        Reason::DeadlineExceeded,
        Reason::RestartLimitExceeded,
        Reason::InputRefused,
    ];

    /// The reason as it appears in the API (CamelCase, as Kubernetes reasons are).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AwaitingAdmission => "AwaitingAdmission",
            Reason::PriorityClassNotFound => "PriorityClassNotFound",
            Reason::ExceedsPool => "ExceedsPool",
            Reason::InsufficientCapacity => "InsufficientCapacity",
            Reason::WaitingForEarlierJobs => "WaitingForEarlierJobs",
            Reason::NotWaiting => "NotWaiting",
            Reason::DataVolumeNotFound => "DataVolumeNotFound",
            Reason::NoPool => "NoPool",
            Reason::Admitted => "Admitted",
            Reason::Resumed => "Resumed",
            Reason::Rescaled => "Rescaled",
            Reason::RescaleWaitingForCapacity => "RescaleWaitingForCapacity",
            Reason::CapacityLost => "CapacityLost",
            Reason::Preempted => "Preempted",
            Reason::KueueQueued => "KueueQueued",
            Reason::KueueEvicted => "KueueEvicted",
            Reason::Suspending => "Suspending",
            Reason::Rescaling => "Rescaling",
            Reason::Suspended => "Suspended",
            Reason::Released => "Released",
            Reason::Assembling => "Assembling",
            Reason::PodsNotReady => "PodsNotReady",
            Reason::ReplacingFailedPods => "ReplacingFailedPods",
            Reason::CoordinatorStarting => "CoordinatorStarting",
            Reason::CoordinatorUnreachable => "CoordinatorUnreachable",
            Reason::Training => "Training",
            Reason::Finished => "Finished",
            Reason::PodsForbidden => "PodsForbidden",
            Reason::ChildInvalid => "ChildInvalid",
            Reason::PodCreateFailed => "PodCreateFailed",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::TrainingComplete => "TrainingComplete",
            Reason::PlanRejected => "PlanRejected",
            Reason::DataPlaneFailed => "DataPlaneFailed",
            Reason::DeadlineExceeded => "DeadlineExceeded",
            Reason::RestartLimitExceeded => "RestartLimitExceeded",
            Reason::InputRefused => "InputRefused",
        }
    }

    /// Whether condition `c` carries this reason.
    pub fn of(self, c: &Condition) -> bool {
        c.reason == self.as_str()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reason compares equal to its API spelling, so tests (and readers of conditions) can check the very string
/// the API shows.
impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API spelling is the variant's name: nothing is renamed on the way to the API server.
    #[test]
    fn every_name_is_spelled_as_its_variant() {
        for t in ConditionType::ALL {
            assert_eq!(t.as_str(), format!("{t:?}"));
            assert_eq!(t.to_string(), t.as_str());
        }
        for r in Reason::ALL {
            assert_eq!(r.as_str(), format!("{r:?}"));
            assert_eq!(r.to_string(), r.as_str());
        }
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len(), "each reason once");
        for s in [ConditionStatus::True, ConditionStatus::False, ConditionStatus::Unknown] {
            assert_eq!(s.as_str(), format!("{s:?}"));
        }
        assert_eq!(
            (ConditionStatus::from(true), ConditionStatus::from(false)),
            (ConditionStatus::True, ConditionStatus::False)
        );
    }
}
