//! The job's life as one pure function: from the job, its previous status and what the operator observed (its
//! pods, MemoryX's report, admission), to the next status and what to do with the children. Everything the
//! lifecycle promises (gang admission, replacement of failed engines, the restart limit, suspend through a
//! checkpoint, rescale between steps) is decided here and unit-tested without a cluster.

use crds::conditions::{ConditionStatus, ConditionType, Reason};
use crds::{Phase, PlanStatus, PodPlacement, TrainingJob, TrainingJobSpec, TrainingJobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::admission::Verdict;
use crds::contract::{MemoryxPhase, MemoryxStatus, ROLE_LABEL, Role};

/// How long a suspend or a rescale waits for the checkpoint it asked MemoryX for before it goes ahead from the
/// newest checkpoint there is: a MemoryX that cannot write one must not keep the CS-2s for good.
pub const CHECKPOINT_WAIT_SECONDS: u64 = 300;

/// How long the pool may hold fewer CS-2s than a job holds before the job goes on with fewer: long enough that
/// a kubelet or device-plugin restart (the CS-2s unadvertised for a moment) moves nothing.
pub const CAPACITY_GRACE_SECONDS: u64 = 30;

/// How long a job may hold CS-2s with fewer left to it than it can run on (below `spec.minCs2`) before it
/// checkpoints, gives its CS-2s back and waits in the queue: longer than any restart of a kubelet or the device
/// plugin, so only capacity really gone (a node unreachable, cordoned or drained) moves it.
pub const REQUEUE_GRACE_SECONDS: u64 = 4 * CAPACITY_GRACE_SECONDS;

/// What the operator saw this pass, beyond the job itself.
#[derive(Clone, Debug)]
pub struct Observed {
    /// Admission's verdict, when the job holds no CS-2s.
    pub admission: Option<Verdict>,
    /// Where the job stands among the waiting jobs (see [`crate::admission::position`]).
    pub queue_position: Option<u32>,
    /// Whether a running job may grow to its spec's CS-2 count now.
    pub may_grow: bool,
    /// The CS-2s left to this job: the pool less what every other job holds; `None` when there is no pool to
    /// count (then nothing is taken for lost).
    pub capacity: Option<u32>,
    /// The plan for the spec's CS-2 count, or why it refuses the job.
    pub plan: Result<PlanStatus, String>,
    /// Whether every engine, SwarmX and input-worker pod of the assembled size exists, is current and is ready.
    pub pods_ready: bool,
    /// Names of engine, SwarmX and input-worker pods that failed this pass (the operator replaces them).
    pub failed_pods: Vec<String>,
    /// Names of the job's pods whose program refused the job's input (see [`crds::contract::exit::Exit`]):
    /// another run would fail the same way, so the job fails at once.
    pub refused_pods: Vec<String>,
    /// The first of those pods that is not ready, and why, when one is not.
    pub unready: Option<Unready>,
    /// Container restarts of the current MemoryX pod, when it exists.
    pub memoryx_restarts: Option<u32>,
    /// Each of the job's pods that is placed on a node, and that node (see [`placement`]).
    pub placement: Vec<PodPlacement>,
    /// The lost nodes (unreachable) that the job had pods on, which the operator takes back.
    pub lost_nodes: Vec<String>,
    /// Why the job must give its CS-2s back and wait in the queue now, when it must: a waiting job of a higher
    /// PriorityClass takes them ([`crate::admission::preempted_by`]), or Kueue evicted its Workload.
    pub evicted: Option<Eviction>,
    /// MemoryX's `/status`, or why it could not be read; `None` when it was not asked (nothing assembled).
    pub coordinator: Option<Result<MemoryxStatus, String>>,
    /// Now, for condition and start/completion times.
    pub now: Timestamp,
}

/// Why a job that holds CS-2s must checkpoint, give them back and wait in the queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    /// `Preempted` (the operator's own queue preempts) or `KueueEvicted`.
    pub reason: Reason,
    /// Who or what evicts it, in words that follow the job: `preempted by ml/urgent (PriorityClass 'high')`.
    pub why: String,
}

/// A pod of the job that is not ready, as the status names it: a job stuck `Starting` says which pod holds it,
/// why where Kubernetes says so, and the command that shows more.
#[derive(Clone, Debug, PartialEq)]
pub struct Unready {
    /// The pod's name.
    pub pod: String,
    /// Its namespace (the job's).
    pub namespace: String,
    /// What holds it, in Kubernetes' words ([`why_unready`]), or that it does not exist yet.
    pub why: String,
}

impl Unready {
    /// `pod` (of `namespace`) as it stands.
    pub fn of(pod: &Pod, namespace: &str) -> Unready {
        Unready { pod: pod.name_any(), namespace: namespace.to_string(), why: why_unready(pod) }
    }

    /// The status message: the pod, why, and how to see more.
    pub fn message(&self) -> String {
        let Unready { pod, namespace, why } = self;
        format!("waiting for pod {pod} to be ready ({why}); `kubectl describe pod {pod} -n {namespace}` shows why")
    }
}

/// The most a reason's message from Kubernetes adds to a status message.
const MAX_WHY: usize = 200;

/// Why `pod` is not ready, in Kubernetes' own words: a container's waiting reason and message
/// (`ImagePullBackOff: …`, `ContainerCreating`), else the scheduler's (`Unschedulable: 0/1 nodes are
/// available: …`), else its phase.
pub fn why_unready(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
    let said = |reason: &str, message: Option<&String>| match message.filter(|m| !m.is_empty()) {
        Some(m) if m.chars().count() > MAX_WHY => format!("{reason}: {}…", m.chars().take(MAX_WHY).collect::<String>()),
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    };
    let containers = status
        .into_iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()));
    let waiting = containers.filter_map(|c| c.state.as_ref()?.waiting.as_ref()).find(|w| w.reason.is_some());
    if let Some(w) = waiting {
        return format!("{phase}, {}", said(w.reason.as_deref().unwrap_or_default(), w.message.as_ref()));
    }
    let conditions = status.and_then(|s| s.conditions.as_ref());
    let unscheduled = conditions.into_iter().flatten().find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return format!("{phase}, {}", said(c.reason.as_deref().unwrap_or("not scheduled"), c.message.as_ref()));
    }
    match phase.as_str() {
        "Running" => "Running, its readiness probe not passed yet".into(),
        _ => phase,
    }
}

/// What to do with the children.
#[derive(Clone, Debug, PartialEq)]
pub enum Children {
    /// Nothing exists nor should: a queued job.
    Nothing,
    /// Assemble (or keep) the appliance for this many CS-2s, replacing failed and outdated pods.
    Assemble(u32),
    /// Give the CS-2s back: remove engines and SwarmX nodes, scale MemoryX to zero, keep its checkpoints.
    Release,
}

/// An Event to record when the phase changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The phase reached.
    pub phase: Phase,
    /// Why, as the Event's reason.
    pub reason: Reason,
    /// A sentence for people.
    pub message: String,
    /// Whether it is bad news (a Warning event).
    pub warning: bool,
}

/// The outcome of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to write.
    pub status: TrainingJobStatus,
    /// What to do with the children.
    pub children: Children,
    /// Ask MemoryX to write a checkpoint now (before a suspend or a rescale).
    pub request_checkpoint: bool,
    /// The phase change, if any, for an Event.
    pub transition: Option<Transition>,
}

/// Sets condition `type_` in `conditions`, keeping its transition time when its status does not change, so a
/// pass that changes nothing writes nothing.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: ConditionType,
    status: bool,
    reason: Reason,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = ConditionStatus::from(status).as_str().to_string();
    let message = message.into();
    if let Some(c) = conditions.iter_mut().find(|c| type_.of(c)) {
        if c.status != status {
            c.last_transition_time = Time(now);
        }
        c.status = status;
        c.reason = reason.as_str().into();
        c.message = message;
        c.observed_generation = generation;
        return;
    }
    conditions.push(Condition {
        type_: type_.as_str().into(),
        status,
        reason: reason.as_str().into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(now),
    });
}

/// The status of a job whose children the API server refused to create (Pod Security, a quota, an admission
/// webhook): its phase stays, and `Ready` says which object was refused and the server's own words, so the
/// owner sees why the job cannot progress without reading controller logs.
pub fn children_refused(
    status: &TrainingJobStatus,
    reason: Reason,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> TrainingJobStatus {
    let mut s = status.clone();
    set_condition(&mut s.conditions, ConditionType::Ready, false, reason, message, generation, now);
    s
}

/// The status of a job that just failed, its `Failed` condition naming the pod and log line that failed it
/// (`POD (exit CODE): LINE`, from the post-mortem), so `wsctl get` and `kubectl describe` say it.
pub fn failed_by(status: &TrainingJobStatus, culprit: &str) -> TrainingJobStatus {
    let mut s = status.clone();
    if let Some(c) = s.conditions.iter_mut().find(|c| ConditionType::Failed.of(c) && c.status == "True") {
        c.message = format!("{}; failed by pod {culprit}", c.message);
    }
    s
}

/// The condition reason for an API refusal of a child: `PodsForbidden` for 403s (Pod Security, RBAC,
/// quotas), `ChildInvalid` for 422s.
pub fn refusal_reason(code: u16) -> Reason {
    match code {
        403 => Reason::PodsForbidden,
        _ => Reason::ChildInvalid,
    }
}

/// Reasons that keep a job from progressing until someone acts (a cluster admin, the job's owner): each is a
/// Warning Event when it first appears, not only a condition.
pub const WARNING_REASONS: &[Reason] =
    &[Reason::PriorityClassNotFound, Reason::CapacityLost, Reason::Preempted, Reason::KueueEvicted];

/// Why MemoryX's pod does not exist although its StatefulSet wants it: the API server refused it (Pod
/// Security, a quota, a webhook) and the StatefulSet controller said so only on the StatefulSet, as a
/// `ReplicaFailure` condition or (what Kubernetes' controller does today) a `FailedCreate` Warning Event.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// `PodsForbidden` (403: Pod Security, RBAC, a quota), `ChildInvalid` (422) or `PodCreateFailed`.
    pub reason: Reason,
    /// The API server's words, as the StatefulSet controller passed them on.
    pub message: String,
}

/// Reads a refusal of MemoryX's pod from its StatefulSet `sts` and the core Events about it: a
/// `ReplicaFailure=True` condition, or else the newest `FailedCreate` event about this StatefulSet (by uid)
/// when no `SuccessfulCreate` came after it. `None` when the StatefulSet wants no pod. The caller asks only
/// while the pod is missing, so an old refusal that was since overcome is never reported.
pub fn memoryx_refusal(
    sts: &k8s_openapi::api::apps::v1::StatefulSet,
    events: &[k8s_openapi::api::core::v1::Event],
) -> Option<Refusal> {
    if sts.spec.as_ref().and_then(|s| s.replicas) == Some(0) {
        return None;
    }
    let classify = |message: &str| {
        let reason = if message.contains("forbidden") {
            Reason::PodsForbidden
        } else if message.contains("is invalid") {
            Reason::ChildInvalid
        } else {
            Reason::PodCreateFailed
        };
        Refusal { reason, message: format!("the API server refused MemoryX's pod: {message}") }
    };
    let conditions = sts.status.as_ref().and_then(|s| s.conditions.as_ref());
    if let Some(c) = conditions.into_iter().flatten().find(|c| c.type_ == "ReplicaFailure" && c.status == "True") {
        return Some(classify(c.message.as_deref().or(c.reason.as_deref()).unwrap_or("ReplicaFailure")));
    }
    let uid = sts.metadata.uid.as_deref();
    let about_it = |e: &&k8s_openapi::api::core::v1::Event| {
        let o = &e.involved_object;
        o.kind.as_deref() == Some("StatefulSet")
            && o.name == sts.metadata.name
            && (uid.is_none() || o.uid.as_deref().is_none_or(|u| Some(u) == uid))
            && matches!(e.reason.as_deref(), Some("FailedCreate" | "SuccessfulCreate"))
    };
    let when = |e: &k8s_openapi::api::core::v1::Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.first_timestamp.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    let newest = events.iter().filter(about_it).max_by_key(|e| when(e))?;
    (newest.reason.as_deref() == Some("FailedCreate"))
        .then(|| classify(newest.message.as_deref().unwrap_or("FailedCreate")))
}

/// Where the job's `pods` run: each one the scheduler has placed and that is not being deleted, with its node, by
/// role (in the order an appliance is brought up), then name. A pod without the role label is not the job's.
pub fn placement(pods: &[Pod]) -> Vec<PodPlacement> {
    let mut placed: Vec<PodPlacement> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let role = Role::from_name(p.labels().get(ROLE_LABEL)?)?;
            let node = p.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())?;
            Some(PodPlacement { role, pod: p.name_any(), node })
        })
        .collect();
    let order = |r: Role| Role::ALL.iter().position(|&x| x == r);
    placed.sort_by(|a, b| (order(a.role), &a.pod).cmp(&(order(b.role), &b.pod)));
    placed
}

/// Decides the next status of `job` and what to do with its children: the common bookkeeping here, each phase
/// (or group of phases) in a function of its own, tried in the order the lifecycle gives them precedence.
pub fn decide(job: &TrainingJob, obs: &Observed) -> Decision {
    let spec = &job.spec;
    let prev = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation;
    let mut d = Pass { s: prev.clone(), generation, now: obs.now, reason: None, message: String::new() };
    d.s.observed_generation = generation;
    // Only a job that waits in the queue has a place in it; `without_cs2` sets it.
    d.s.queue_position = None;
    let holds = prev.allocated_cs2.unwrap_or(0);
    if let Some(Ok(c)) = &obs.coordinator {
        d.progress(c, spec.training.batch_size);
    }

    let (children, request_checkpoint) = if prev.phase.is_some_and(Phase::is_terminal) {
        finished(&mut d)
    } else if let Err(why) = &obs.plan {
        d.fail(Reason::PlanRejected, why.clone());
        (Children::Release, false)
    } else if holds == 0 {
        without_cs2(&mut d, spec, &prev, obs)
    } else if let Some(over) = ended_by_memoryx(&mut d, obs) {
        over
    } else if let Some(failed) = past_limits(&mut d, spec, &prev, obs) {
        failed
    } else {
        // The job holds its CS-2s and goes on: it moves (suspend, or a resize it may make now) or it runs.
        let (target, grow_blocked) = size_now(&mut d, spec, &prev, obs, holds);
        if spec.suspend || target != holds {
            checkpoint_then_move(&mut d, spec, &prev, obs, holds, target)
        } else {
            holding(&mut d, spec, obs, holds, grow_blocked)
        }
    };

    // Where the pods run now; a finished job keeps where they ran once they are gone, for the post-mortem.
    if !(obs.placement.is_empty() && prev.phase.is_some_and(Phase::is_terminal)) {
        d.s.placement.clone_from(&obs.placement);
    }

    // A reason that needs someone to act is announced when it first appears, even if the phase stays.
    let needs_action = d.reason.is_some_and(|r| WARNING_REASONS.contains(&r));
    let new_reason =
        needs_action && !prev.conditions.iter().any(|c| d.reason.is_some_and(|r| r.of(c)) && c.message == d.message);
    let changed = d.s.phase != prev.phase || new_reason;
    let transition = d.reason.filter(|_| changed).map(|reason| Transition {
        phase: d.s.phase.unwrap_or(Phase::Queued),
        reason,
        message: d.message.clone(),
        warning: d.s.phase == Some(Phase::Failed) || needs_action,
    });
    Decision { status: d.s, children, request_checkpoint, transition }
}

/// `Succeeded` or `Failed` already: final, so the job holds nothing and stays as it is.
fn finished(d: &mut Pass) -> (Children, bool) {
    d.s.allocated_cs2 = None;
    (Children::Release, false)
}

/// A job holding no CS-2s: `Suspended` on request, else `Queued` until admission lets it start (`Starting`, or
/// resumed from its checkpoint after a suspend).
fn without_cs2(d: &mut Pass, spec: &TrainingJobSpec, prev: &TrainingJobStatus, obs: &Observed) -> (Children, bool) {
    if spec.suspend {
        d.phase(Phase::Suspended, Reason::Suspended, "suspended on request; set spec.suspend to false to resume");
        d.cond(ConditionType::Suspended, true);
        d.cond_with(ConditionType::Admitted, false, Reason::Suspended, "a suspended job holds no CS-2s");
        return (Children::Release, false);
    }
    let admitted = match &obs.admission {
        Some(Verdict::Admit) => Some((spec.cs2, format!("all {} CS-2s are free", spec.cs2))),
        Some(Verdict::Kueue { cs2, cluster_queue }) => {
            Some((*cs2, format!("Kueue admitted it on {cs2} CS-2s in ClusterQueue '{cluster_queue}'")))
        }
        _ => None,
    };
    match (&obs.admission, admitted) {
        (_, Some((n, why))) => {
            d.s.allocated_cs2 = Some(n);
            d.s.start_time.get_or_insert(Time(obs.now));
            let resumed = prev.conditions.iter().any(|c| ConditionType::Suspended.of(c) && ConditionStatus::True.of(c));
            // Given back earlier (preempted, or below spec.minCs2) with a checkpoint: MemoryX resumes from it.
            let requeued = prev.progress.last_checkpoint.is_some();
            let (reason, msg) = if resumed || requeued {
                (Reason::Resumed, format!("{why}; resumed on {n} CS-2s from the last checkpoint"))
            } else {
                (Reason::Admitted, format!("{why}; assembling the appliance"))
            };
            d.phase(Phase::Starting, reason, msg);
            d.cond(ConditionType::Admitted, true);
            if prev.conditions.iter().any(|c| ConditionType::Suspended.of(c)) {
                d.cond_with(ConditionType::Suspended, false, Reason::Resumed, "resumed");
            }
            d.cond_with(ConditionType::Ready, false, Reason::Assembling, "the appliance is being assembled");
            d.s.plan = obs.plan.clone().ok();
            (Children::Assemble(n), false)
        }
        (Some(Verdict::Wait { reason, message }), None) => {
            d.phase(Phase::Queued, *reason, message.clone());
            d.s.queue_position = obs.queue_position;
            if gave_back(prev) && WAITS_FOR_CAPACITY.contains(reason) {
                // Given back earlier (preempted, evicted, below minCs2): `Admitted` keeps saying why and by whom
                // until the job is admitted again; `Ready` says what it waits for now.
                d.cond_with(ConditionType::Ready, false, *reason, message.clone());
            } else {
                d.cond(ConditionType::Admitted, false);
            }
            (Children::Nothing, false)
        }
        (_, None) => {
            d.phase(Phase::Queued, Reason::AwaitingAdmission, "waiting for admission");
            d.cond(ConditionType::Admitted, false);
            (Children::Nothing, false)
        }
    }
}

/// The reasons a job waits only for CS-2s to be free: a job that gave its CS-2s back waits for these still
/// saying why it gave them back.
const WAITS_FOR_CAPACITY: [Reason; 3] =
    [Reason::InsufficientCapacity, Reason::WaitingForEarlierJobs, Reason::KueueQueued];

/// Whether the job gave its CS-2s back (preempted, evicted by Kueue, below `spec.minCs2`) and has not been
/// admitted since: its `Admitted` condition is `False` for one of those reasons.
fn gave_back(prev: &TrainingJobStatus) -> bool {
    prev.conditions.iter().any(|c| {
        ConditionType::Admitted.of(c)
            && !ConditionStatus::True.of(c)
            && [Reason::Preempted, Reason::KueueEvicted, Reason::CapacityLost].iter().any(|r| r.of(c))
    })
}

/// A job left with fewer CS-2s than it can run on, once its checkpoint (`at`) is written: it gives back the `holds`
/// CS-2s it holds (its checkpoint claims stay) and waits in the queue; admitted again, MemoryX resumes from that
/// checkpoint.
fn requeue(d: &mut Pass, spec: &TrainingJobSpec, obs: &Observed, holds: u32, at: &str) -> (Children, bool) {
    d.s.allocated_cs2 = None;
    d.s.capacity_lost_at = None;
    let (reason, why) = match &obs.evicted {
        Some(e) => (e.reason, e.why.clone()),
        None => (
            Reason::CapacityLost,
            format!("fewer CS-2s are left to it than spec.minCs2 = {}{}", spec.min_cs2(), lost_where(obs)),
        ),
    };
    d.phase(
        Phase::Queued,
        reason,
        format!(
            "{why}: it gave back its {holds} CS-2s and waits in the queue for {}; it resumes from its checkpoint at \
             {at}",
            spec.cs2
        ),
    );
    d.cond_with(ConditionType::Admitted, false, reason, format!("{why}: gave back its {holds} CS-2s"));
    d.cond_with(ConditionType::Ready, false, reason, "waiting in the queue");
    (Children::Release, false)
}

/// `Succeeded` or `Failed` as MemoryX reports it; `None` while MemoryX trains (or cannot be asked).
fn ended_by_memoryx(d: &mut Pass, obs: &Observed) -> Option<(Children, bool)> {
    let Some(Ok(c)) = &obs.coordinator else { return None };
    match c.phase {
        MemoryxPhase::Succeeded => {
            d.s.allocated_cs2 = None;
            d.s.completion_time.get_or_insert(Time(obs.now));
            d.phase(Phase::Succeeded, Reason::TrainingComplete, format!("trained {} steps", c.step()));
            d.cond(ConditionType::Complete, true);
            d.cond_with(ConditionType::Ready, false, Reason::Finished, "the job is over and its CS-2s are free");
            d.cond_with(ConditionType::Admitted, false, Reason::Released, "the job is over and its CS-2s are free");
            Some((Children::Release, false))
        }
        MemoryxPhase::Failed => {
            let why = c.message.clone().unwrap_or_else(|| "MemoryX reported a failure".into());
            d.fail(Reason::DataPlaneFailed, why);
            Some((Children::Release, false))
        }
        MemoryxPhase::Starting | MemoryxPhase::Running | MemoryxPhase::Checkpointing => None,
    }
}

/// Counts this pass's failures (failed pods, MemoryX restarts not yet counted) into `restarts`, then `Failed`
/// when the job ran past `spec.activeDeadlineSeconds` or failed more often than `spec.restartLimit`.
fn past_limits(
    d: &mut Pass,
    spec: &TrainingJobSpec,
    prev: &TrainingJobStatus,
    obs: &Observed,
) -> Option<(Children, bool)> {
    let mut restarts = prev.restarts + obs.failed_pods.len() as u32;
    if let Some(rc) = obs.memoryx_restarts {
        restarts += rc.saturating_sub(prev.memoryx_restarts_seen);
        d.s.memoryx_restarts_seen = rc;
    }
    d.s.restarts = restarts;
    if !obs.refused_pods.is_empty() {
        d.fail(
            Reason::InputRefused,
            format!(
                "{} refused the job's input: its data, model or plan is wrong, and another run would fail the same \
                 way",
                obs.refused_pods.join(", ")
            ),
        );
        return Some((Children::Release, false));
    }
    let ran = prev.start_time.as_ref().map_or(0, |t| obs.now.duration_since(t.0).as_secs().max(0) as u64);
    if let Some(limit) = spec.active_deadline_seconds.filter(|&limit| ran > limit) {
        d.fail(
            Reason::DeadlineExceeded,
            format!("ran {ran} s since it was admitted, past spec.activeDeadlineSeconds = {limit}; CS-2s released"),
        );
        return Some((Children::Release, false));
    }
    if restarts > spec.restart_limit {
        d.fail(
            Reason::RestartLimitExceeded,
            format!("{restarts} failures of MemoryX or engines exceed spec.restartLimit = {}", spec.restart_limit),
        );
        return Some((Children::Release, false));
    }
    None
}

/// The CS-2s a job holding `holds` should hold now, and whether growing to `spec.cs2` waits for free ones:
/// - CS-2s it holds lost for good (fewer left to it than it holds for [`CAPACITY_GRACE_SECONDS`]): as many as
///   remain, down to `spec.minCs2` ([`TrainingJobSpec::elastic_size`]); below that it keeps what it holds for
///   [`REQUEUE_GRACE_SECONDS`], then none: it checkpoints, releases them and waits in the queue.
/// - preempted: none (it checkpoints, releases them and waits in the queue);
/// - otherwise `spec.cs2` when it holds more (a shrink asked for) or may grow to it (never jumping the queue);
///   else what it holds.
fn size_now(d: &mut Pass, spec: &TrainingJobSpec, prev: &TrainingJobStatus, obs: &Observed, holds: u32) -> (u32, bool) {
    if obs.evicted.is_some() {
        return (0, false);
    }
    if let Some(left) = obs.capacity.filter(|&left| left < holds) {
        let since = prev.capacity_lost_at.clone().unwrap_or(Time(obs.now));
        let short_for = obs.now.duration_since(since.0).as_secs().max(0) as u64;
        d.s.capacity_lost_at = Some(since);
        match spec.elastic_size(left) {
            Some(n) if short_for >= CAPACITY_GRACE_SECONDS => return (n, false),
            None if short_for >= REQUEUE_GRACE_SECONDS => return (0, false),
            _ => return (holds, false),
        }
    }
    d.s.capacity_lost_at = None;
    if spec.cs2 < holds || (spec.cs2 > holds && obs.may_grow) {
        return (spec.cs2, false);
    }
    (holds, spec.cs2 > holds)
}

/// Where CS-2s were lost, when nodes the job ran on were: ` (node N unreachable)`, else nothing.
fn lost_where(obs: &Observed) -> String {
    match obs.lost_nodes.len() {
        0 => String::new(),
        1 => format!(" (node {} unreachable)", obs.lost_nodes[0]),
        _ => format!(" (nodes {} unreachable)", obs.lost_nodes.join(", ")),
    }
}

/// A suspend or a resize of a job holding `holds` CS-2s to `target`: `Checkpointing` until a checkpoint of the latest step
/// exists (or MemoryX could not write one in time), then `Suspended` with the CS-2s released, or `Starting`
/// again at the new size.
fn checkpoint_then_move(
    d: &mut Pass,
    spec: &TrainingJobSpec,
    prev: &TrainingJobStatus,
    obs: &Observed,
    holds: u32,
    target: u32,
) -> (Children, bool) {
    // Going on with fewer than the spec asks because CS-2s were lost, not because the spec changed.
    let lost = !spec.suspend && target < holds && target < spec.cs2;
    let evicted = obs.evicted.as_ref().filter(|_| !spec.suspend);
    let (why, doing) = if spec.suspend {
        (Reason::Suspending, "checkpointing before giving back the CS-2s".to_string())
    } else if let Some(e) = evicted {
        (e.reason, format!("{}: checkpointing before giving back its {holds} CS-2s", e.why))
    } else if lost && target == 0 {
        (
            Reason::CapacityLost,
            format!(
                "fewer CS-2s are left to it than spec.minCs2 = {}{}; checkpointing before giving back its {holds} \
                 and waiting in the queue",
                spec.min_cs2(),
                lost_where(obs)
            ),
        )
    } else if lost {
        (
            Reason::CapacityLost,
            format!(
                "{} of its {holds} CS-2s were lost{}; checkpointing before going on with {target} (spec.minCs2 = {})",
                holds - target,
                lost_where(obs),
                spec.min_cs2()
            ),
        )
    } else {
        (Reason::Rescaling, format!("checkpointing before rescaling from {holds} to {target} CS-2s"))
    };
    let reachable = match &obs.coordinator {
        Some(Ok(c)) => Some(c),
        _ => None,
    };
    let saved = |c: &MemoryxStatus| c.progress.last_checkpoint.as_ref().map_or(0, |k| k.step);
    let waited =
        prev.checkpoint_requested_at.as_ref().map_or(0, |t| obs.now.duration_since(t.0).as_secs().max(0) as u64);
    let mut late = false;
    match (reachable, prev.checkpoint_requested_at_step) {
        (Some(c), None) if c.step() > saved(c) => {
            d.s.checkpoint_requested_at_step = Some(c.step());
            d.s.checkpoint_requested_at = Some(Time(obs.now));
            d.phase(Phase::Checkpointing, why, doing);
            return (Children::Assemble(holds), true);
        }
        (Some(c), Some(at)) if saved(c) < at && waited <= CHECKPOINT_WAIT_SECONDS => {
            d.phase(Phase::Checkpointing, why, doing);
            return (Children::Assemble(holds), false);
        }
        (Some(c), Some(at)) if saved(c) < at => late = true,
        _ => {}
    }
    // A checkpoint of the latest step exists (or there is no MemoryX to ask, or it did not write one in
    // time): act now, from the newest checkpoint there is.
    d.s.checkpoint_requested_at_step = None;
    d.s.checkpoint_requested_at = None;
    let mut at =
        d.s.progress.last_checkpoint.as_ref().map_or("no checkpoint yet".to_string(), |k| format!("step {}", k.step));
    if late {
        at = format!("{at} (MemoryX wrote no newer one within {CHECKPOINT_WAIT_SECONDS} s of being asked)");
    }
    if spec.suspend {
        d.s.allocated_cs2 = None;
        d.phase(Phase::Suspended, Reason::Suspended, format!("suspended with its checkpoint at {at}; CS-2s released"));
        d.cond(ConditionType::Suspended, true);
        d.cond_with(ConditionType::Admitted, false, Reason::Suspended, "a suspended job holds no CS-2s");
        d.cond_with(ConditionType::Ready, false, Reason::Suspended, "suspended");
        return (Children::Release, false);
    }
    if lost && target == 0 {
        return requeue(d, spec, obs, holds, &at);
    }
    d.s.allocated_cs2 = Some(target);
    if target == spec.cs2 {
        d.s.plan = obs.plan.clone().ok();
    }
    if lost {
        d.phase(
            Phase::Starting,
            Reason::CapacityLost,
            format!(
                "continuing on {target} of {} CS-2s from {at}: {} were lost{}; the global batch and the curve are the \
                 full job's, and it grows back to {} when CS-2s are free again",
                spec.cs2,
                holds - target,
                lost_where(obs),
                spec.cs2
            ),
        );
        d.cond_with(
            ConditionType::Admitted,
            true,
            Reason::CapacityLost,
            format!("holds {target} of {} CS-2s", spec.cs2),
        );
    } else {
        d.phase(
            Phase::Starting,
            Reason::Rescaled,
            format!("rescaled from {holds} to {target} CS-2s, continuing from {at}"),
        );
        d.cond_with(ConditionType::Admitted, true, Reason::Rescaled, format!("holds {target} CS-2s"));
    }
    d.cond_with(ConditionType::Ready, false, Reason::Assembling, "the appliance is being reassembled");
    (Children::Assemble(target), false)
}

/// A job that holds its `holds` CS-2s and keeps them: `Starting` until its pods are ready and MemoryX trains,
/// then `Running` (or `Checkpointing` while MemoryX writes a periodic checkpoint). `grow_blocked`: its spec
/// wants more CS-2s than are free to grow by.
fn holding(d: &mut Pass, spec: &TrainingJobSpec, obs: &Observed, holds: u32, grow_blocked: bool) -> (Children, bool) {
    d.s.checkpoint_requested_at_step = None;
    d.s.checkpoint_requested_at = None;
    if grow_blocked {
        d.cond_with(
            ConditionType::Admitted,
            true,
            Reason::RescaleWaitingForCapacity,
            format!("holds {holds} CS-2s; growing to {} waits for free CS-2s", spec.cs2),
        );
    } else {
        d.cond_with(ConditionType::Admitted, true, Reason::Admitted, format!("holds {holds} CS-2s"));
    }
    match (&obs.coordinator, obs.pods_ready) {
        (Some(Ok(c)), true) if c.phase == MemoryxPhase::Starting => {
            let msg = "MemoryX is starting (loading data, restoring its checkpoint, reaching its engines)";
            d.phase(Phase::Starting, Reason::CoordinatorStarting, msg);
            d.cond_with(ConditionType::Ready, false, Reason::CoordinatorStarting, msg);
        }
        (Some(Ok(c)), true) => {
            let phase = if c.phase == MemoryxPhase::Checkpointing { Phase::Checkpointing } else { Phase::Running };
            d.phase(
                phase,
                Reason::Training,
                format!("step {} of {}", c.step(), c.progress.total_steps.map_or("?".into(), |t| t.to_string())),
            );
            d.cond_with(
                ConditionType::Ready,
                true,
                Reason::Training,
                "every child is ready and MemoryX reports progress",
            );
        }
        (_, false) => {
            let msg = match &obs.unready {
                _ if !obs.failed_pods.is_empty() => format!("replacing failed pods: {}", obs.failed_pods.join(", ")),
                Some(u) => u.message(),
                None => "waiting for engine, SwarmX and input-worker pods to be ready".to_string(),
            };
            let reason = if obs.failed_pods.is_empty() { Reason::PodsNotReady } else { Reason::ReplacingFailedPods };
            d.phase(Phase::Starting, reason, msg.clone());
            d.cond_with(ConditionType::Ready, false, reason, msg);
        }
        (other, true) => {
            let msg = match other {
                Some(Err(e)) => format!("MemoryX does not answer yet: {e}"),
                _ => "MemoryX has not been asked yet".into(),
            };
            d.phase(Phase::Starting, Reason::CoordinatorUnreachable, msg.clone());
            d.cond_with(ConditionType::Ready, false, Reason::CoordinatorUnreachable, msg);
        }
    }
    (Children::Assemble(holds), false)
}

/// The status being built, with the reason and message of the phase it was last set to.
struct Pass {
    s: TrainingJobStatus,
    generation: Option<i64>,
    now: Timestamp,
    /// `None` until a phase is set this pass (a finished job keeps its phase and sets none).
    reason: Option<Reason>,
    message: String,
}

impl Pass {
    fn phase(&mut self, phase: Phase, reason: Reason, message: impl Into<String>) {
        self.s.phase = Some(phase);
        self.reason = Some(reason);
        self.message = message.into();
    }

    /// Sets a condition with the phase's reason and message (called only after [`Pass::phase`]).
    fn cond(&mut self, type_: ConditionType, status: bool) {
        if let Some(r) = self.reason {
            let m = self.message.clone();
            self.cond_with(type_, status, r, m);
        }
    }

    fn cond_with(&mut self, type_: ConditionType, status: bool, reason: Reason, message: impl Into<String>) {
        set_condition(&mut self.s.conditions, type_, status, reason, message, self.generation, self.now);
    }

    fn fail(&mut self, reason: Reason, message: String) {
        self.s.allocated_cs2 = None;
        self.s.checkpoint_requested_at_step = None;
        self.s.checkpoint_requested_at = None;
        self.s.completion_time.get_or_insert(Time(self.now));
        self.phase(Phase::Failed, reason, message);
        self.cond(ConditionType::Failed, true);
        self.cond_with(ConditionType::Ready, false, reason, "the job failed and its CS-2s are free");
        self.cond_with(ConditionType::Admitted, false, Reason::Released, "the job failed and its CS-2s are free");
    }

    fn progress(&mut self, c: &MemoryxStatus, batch: u32) {
        self.s.progress.merge(&c.progress);
        self.s.progress_percentage = self.s.progress.percentage();
        self.s.estimated_remaining_seconds = self.s.progress.remaining_seconds(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::CheckpointRef;

    fn job(cs2: u32) -> TrainingJob {
        let mut j = crds::testing::mlp_job("j", "ns", cs2);
        j.spec.restart_limit = 2;
        j.spec.training.steps = Some(100);
        j.metadata.generation = Some(1);
        j
    }

    fn obs() -> Observed {
        Observed {
            admission: None,
            queue_position: None,
            may_grow: true,
            capacity: None,
            plan: Ok(PlanStatus {
                cs2: 2,
                shard: 32,
                memoryx_bytes: 1,
                engine_sram_bytes: 1,
                peak_engine_bytes: 1,
                execution_mode: crds::ExecutionMode::Pipelined,
                step_bytes: 1,
                swarmx: crds::SwarmxTreeStatus { fan_out: 8, depth: 1, nodes: vec![] },
                engines: vec![],
            }),
            pods_ready: false,
            failed_pods: vec![],
            refused_pods: vec![],
            unready: None,
            memoryx_restarts: None,
            placement: vec![],
            lost_nodes: vec![],
            evicted: None,
            coordinator: None,
            now: Timestamp::from_second(1_000_000).unwrap(),
        }
    }

    fn placed(name: &str, role: Option<&str>, node: Option<&str>, deleting: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = role.map(|r| [(ROLE_LABEL.to_string(), r.to_string())].into());
        p.metadata.deletion_timestamp = deleting.then(|| Time(Timestamp::from_second(1).unwrap()));
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec { node_name: node.map(Into::into), ..Default::default() });
        p
    }

    /// The placement lists every placed pod of a role by role and name, and nothing unplaced, deleted or
    /// foreign; a running job's status shows it, a finished one keeps it once its pods are gone.
    #[test]
    fn the_status_says_where_each_pod_of_the_appliance_runs() {
        let pods = [
            placed("j-engine-1", Some("engine"), Some("w2"), false),
            placed("j-engine-0", Some("engine"), Some("w1"), false),
            placed("j-memoryx-0", Some("memoryx"), Some("w2"), false),
            placed("j-input-0", Some("input"), Some("w1"), false),
            placed("j-swarmx-0-0", Some("swarmx"), None, false),
            placed("j-engine-2", Some("engine"), Some("w1"), true),
            placed("loader", None, Some("w1"), false),
        ];
        let got = placement(&pods);
        let want = [
            (Role::Input, "j-input-0", "w1"),
            (Role::Engine, "j-engine-0", "w1"),
            (Role::Engine, "j-engine-1", "w2"),
            (Role::Memoryx, "j-memoryx-0", "w2"),
        ];
        let got_: Vec<(Role, &str, &str)> = got.iter().map(|p| (p.role, p.pod.as_str(), p.node.as_str())).collect();
        assert_eq!(got_, want);

        let mut j = job(2);
        j.status =
            Some(TrainingJobStatus { allocated_cs2: Some(2), phase: Some(Phase::Running), ..Default::default() });
        let mut o = obs();
        o.placement = got.clone();
        o.coordinator = running(5, None);
        let d = decide(&j, &o);
        assert_eq!(d.status.placement, got);
        let json = serde_json::to_value(&d.status).unwrap();
        assert_eq!(json["placement"][3], serde_json::json!({"role": "memoryx", "pod": "j-memoryx-0", "node": "w2"}));

        let mut done = job(2);
        let before = TrainingJobStatus { phase: Some(Phase::Succeeded), placement: got.clone(), ..Default::default() };
        done.status = Some(before);
        assert_eq!(decide(&done, &obs()).status.placement, got, "a finished job keeps where it ran");
    }

    fn running(step: u64, ckpt: Option<u64>) -> Option<Result<MemoryxStatus, String>> {
        let mut s = MemoryxStatus::at(MemoryxPhase::Running, step);
        s.progress.total_steps = Some(100);
        s.progress.loss = Some(0.5);
        s.progress.last_checkpoint = ckpt.map(|s| CheckpointRef { step: s, path: format!("/ckpt/{s}") });
        Some(Ok(s))
    }

    /// Applies a decision as the operator would, so the next pass starts from it.
    fn step(j: &mut TrainingJob, o: &Observed) -> Decision {
        let d = decide(j, o);
        j.status = Some(d.status.clone());
        d
    }

    /// A job of `cs2` CS-2s after the pass that admitted it, and observations with the admission taken.
    fn admitted(cs2: u32) -> (TrainingJob, Observed) {
        let mut j = job(cs2);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        step(&mut j, &o);
        o.admission = None;
        (j, o)
    }

    fn cond(j: &TrainingJob, t: ConditionType) -> &Condition {
        j.status.as_ref().unwrap().conditions.iter().find(|c| t.of(c)).unwrap()
    }

    /// A job stuck Starting names the pod that holds it, why in Kubernetes' words, and the command that shows more.
    #[test]
    fn a_starting_job_names_the_pod_it_waits_for_and_how_to_see_why() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodStatus,
        };
        let (mut j, mut o) = admitted(2);
        let mut pod = Pod::default();
        pod.metadata.name = Some("j-engine-1".into());
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/1 nodes are available: 1 Insufficient weightstream.dev/cs2.".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        o.unready = Some(Unready::of(&pod, "ml"));
        let d = step(&mut j, &o);
        let ready = cond(&j, ConditionType::Ready);
        assert_eq!((d.status.phase, ready.reason.as_str()), (Some(Phase::Starting), "PodsNotReady"));
        assert_eq!(
            ready.message,
            "waiting for pod j-engine-1 to be ready (Pending, Unschedulable: 0/1 nodes are available: 1 Insufficient \
             weightstream.dev/cs2.); `kubectl describe pod j-engine-1 -n ml` shows why"
        );
        // A container waiting says so before the scheduler's old news; a running pod waits for its probe.
        let status = pod.status.get_or_insert_with(Default::default);
        status.container_statuses = Some(vec![ContainerStatus {
            name: "engine".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("x".repeat(500)),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let why = why_unready(&pod);
        assert!(why.starts_with("Pending, ImagePullBackOff: xxx") && why.ends_with('…') && why.len() < 300, "{why}");
        let running = Pod {
            status: Some(PodStatus { phase: Some("Running".into()), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(why_unready(&running), "Running, its readiness probe not passed yet");
        // Failed pods being replaced are named as before.
        o.failed_pods = vec!["j-engine-0".into()];
        step(&mut j, &o);
        assert_eq!(cond(&j, ConditionType::Ready).message, "replacing failed pods: j-engine-0");
    }

    #[test]
    fn queued_until_admitted_then_starting_then_running() {
        let mut j = job(2);
        let mut o = obs();
        o.admission = Some(Verdict::Wait { reason: Reason::InsufficientCapacity, message: "needs 2".into() });
        o.queue_position = Some(1);
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Queued));
        assert_eq!(d.children, Children::Nothing);
        assert_eq!(cond(&j, ConditionType::Admitted).reason, "InsufficientCapacity");
        assert_eq!(d.status.queue_position, Some(1), "a queued job shows its place");
        assert_eq!(d.transition.unwrap().phase, Phase::Queued);

        o.admission = Some(Verdict::Admit);
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.allocated_cs2), (Some(Phase::Starting), Some(2)));
        assert_eq!(d.status.queue_position, None, "an admitted job has left the queue");
        assert_eq!(d.children, Children::Assemble(2));
        assert!(d.status.start_time.is_some() && d.status.plan.is_some());

        o.admission = None;
        o.coordinator = running(0, None);
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Starting), "pods are not ready yet");
        assert_eq!(cond(&j, ConditionType::Ready).reason, "PodsNotReady");

        o.pods_ready = true;
        o.coordinator = Some(Ok(MemoryxStatus { phase: MemoryxPhase::Starting, ..Default::default() }));
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Starting));
        assert_eq!(cond(&j, ConditionType::Ready).reason, "CoordinatorStarting");
        o.coordinator = running(7, None);
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Running));
        assert_eq!((d.status.progress.step, d.status.progress.loss), (Some(7), Some(0.5)));
        assert_eq!(d.status.progress_percentage, Some(7), "7 of 100 steps");
        assert_eq!(cond(&j, ConditionType::Ready).status, "True");

        // MemoryX writing a periodic checkpoint shows as Checkpointing, then Running again.
        o.coordinator =
            Some(Ok(MemoryxStatus { phase: MemoryxPhase::Checkpointing, ..running(10, None).unwrap().unwrap() }));
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Checkpointing));
        o.coordinator = running(11, Some(10));
        let d = step(&mut j, &o);
        assert_eq!(
            (d.status.phase, d.status.progress.last_checkpoint.map(|c| c.step)),
            (Some(Phase::Running), Some(10))
        );
    }

    #[test]
    fn a_pass_that_observes_nothing_new_changes_nothing() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = true;
        o.coordinator = running(3, None);
        step(&mut j, &o);
        let before = j.status.clone();
        o.now = Timestamp::from_second(2_000_000).unwrap();
        let d = step(&mut j, &o);
        assert_eq!(Some(d.status), before, "same observations must give the same status");
        assert!(d.transition.is_none());
    }

    #[test]
    fn unreachable_memoryx_keeps_the_job_starting_with_the_reason() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = true;
        o.coordinator = Some(Err("connection refused".into()));
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Starting));
        assert!(cond(&j, ConditionType::Ready).message.contains("connection refused"));
    }

    #[test]
    fn refused_children_are_named_in_ready_with_the_servers_reason() {
        let mut j = job(2);
        let s = children_refused(
            &TrainingJobStatus { phase: Some(Phase::Starting), ..Default::default() },
            refusal_reason(403),
            "pods \"j-engine-0\" is forbidden: violates PodSecurity".into(),
            Some(1),
            obs().now,
        );
        j.status = Some(s.clone());
        assert_eq!(s.phase, Some(Phase::Starting));
        let c = cond(&j, ConditionType::Ready);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "PodsForbidden"));
        assert!(c.message.contains("violates PodSecurity"));
        assert_eq!(refusal_reason(422), "ChildInvalid");
    }

    fn memoryx_set(
        replicas: i32,
        conditions: Vec<k8s_openapi::api::apps::v1::StatefulSetCondition>,
    ) -> k8s_openapi::api::apps::v1::StatefulSet {
        use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus};
        StatefulSet {
            metadata: kube::api::ObjectMeta {
                name: Some("j-memoryx".into()),
                uid: Some("sts-uid".into()),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec { replicas: Some(replicas), ..Default::default() }),
            status: Some(StatefulSetStatus { conditions: Some(conditions), ..Default::default() }),
        }
    }

    fn sts_event(reason: &str, second: i64, uid: &str, message: &str) -> k8s_openapi::api::core::v1::Event {
        use k8s_openapi::api::core::v1::{Event, ObjectReference};
        Event {
            involved_object: ObjectReference {
                kind: Some("StatefulSet".into()),
                name: Some("j-memoryx".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(if reason == "FailedCreate" { "Warning" } else { "Normal" }.into()),
            last_timestamp: Some(Time(Timestamp::from_second(second).unwrap())),
            ..Default::default()
        }
    }

    const FORBIDDEN: &str = "create Pod j-memoryx-0 in StatefulSet j-memoryx failed error: pods \"j-memoryx-0\" is forbidden: \
        violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false";

    #[test]
    fn a_refused_memoryx_pod_is_read_from_the_statefulsets_replica_failure() {
        use k8s_openapi::api::apps::v1::StatefulSetCondition;
        let failure = StatefulSetCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some(FORBIDDEN.into()),
            ..Default::default()
        };
        let r = memoryx_refusal(&memoryx_set(1, vec![failure.clone()]), &[]).expect("a refusal");
        assert_eq!(r.reason, "PodsForbidden");
        assert!(
            r.message.contains("violates PodSecurity \"restricted:latest\"") && r.message.contains("MemoryX"),
            "{}",
            r.message
        );
        // It reaches Ready with the API server's words, as a refused engine pod does.
        let mut j = job(2);
        let s = children_refused(
            &TrainingJobStatus { phase: Some(Phase::Starting), ..Default::default() },
            r.reason,
            r.message.clone(),
            Some(1),
            obs().now,
        );
        j.status = Some(s);
        assert_eq!(
            (cond(&j, ConditionType::Ready).status.as_str(), cond(&j, ConditionType::Ready).reason.as_str()),
            ("False", "PodsForbidden")
        );
        assert!(cond(&j, ConditionType::Ready).message.contains("allowPrivilegeEscalation"));
        // A condition that no longer holds, or a set scaled to zero, is no refusal.
        let over = StatefulSetCondition { status: "False".into(), ..failure.clone() };
        assert_eq!(memoryx_refusal(&memoryx_set(1, vec![over]), &[]), None);
        assert_eq!(memoryx_refusal(&memoryx_set(0, vec![failure]), &[]), None);
        let invalid = StatefulSetCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            message: Some("Pod \"j-memoryx-0\" is invalid: spec.containers[0].image: Required value".into()),
            ..Default::default()
        };
        assert_eq!(memoryx_refusal(&memoryx_set(1, vec![invalid]), &[]).unwrap().reason, "ChildInvalid");
    }

    #[test]
    fn a_refused_memoryx_pod_is_read_from_the_statefulset_controllers_event() {
        let sts = memoryx_set(1, vec![]);
        let failed = sts_event("FailedCreate", 200, "sts-uid", FORBIDDEN);
        let r =
            memoryx_refusal(&sts, &[sts_event("SuccessfulCreate", 100, "sts-uid", "create Pod ok"), failed.clone()])
                .expect("a refusal");
        assert_eq!(r.reason, "PodsForbidden");
        assert!(r.message.contains("allowPrivilegeEscalation != false"), "{}", r.message);
        // A later successful create, another (older) StatefulSet of the same name, or no event: no refusal.
        assert_eq!(memoryx_refusal(&sts, &[failed.clone(), sts_event("SuccessfulCreate", 300, "sts-uid", "ok")]), None);
        assert_eq!(memoryx_refusal(&sts, &[sts_event("FailedCreate", 200, "old-uid", FORBIDDEN)]), None);
        assert_eq!(memoryx_refusal(&sts, &[]), None);
        let quota = sts_event("FailedCreate", 400, "sts-uid", "pods \"j-memoryx-0\" is forbidden: exceeded quota: q");
        assert_eq!(
            memoryx_refusal(&sts, &[failed, quota]).unwrap().message,
            "the API server refused MemoryX's pod: pods \"j-memoryx-0\" is forbidden: exceeded quota: q"
        );
    }

    #[test]
    fn a_missing_priority_class_queues_the_job_with_a_warning_once() {
        let mut j = job(2);
        let mut o = obs();
        let missing = Verdict::Wait {
            reason: Reason::PriorityClassNotFound,
            message: "spec.priorityClassName names PriorityClass 'gold', which does not exist".into(),
        };
        o.admission = Some(Verdict::Wait { reason: Reason::InsufficientCapacity, message: "needs 2".into() });
        assert!(!step(&mut j, &o).transition.unwrap().warning);
        o.admission = Some(missing);
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.children.clone()), (Some(Phase::Queued), Children::Nothing));
        assert_eq!(
            (cond(&j, ConditionType::Admitted).status.as_str(), cond(&j, ConditionType::Admitted).reason.as_str()),
            ("False", "PriorityClassNotFound")
        );
        let t = d.transition.expect("an Event although the phase stays Queued");
        assert!(t.warning && t.reason == "PriorityClassNotFound" && t.message.contains("'gold'"), "{t:?}");
        assert!(step(&mut j, &o).transition.is_none(), "announced once");
    }

    #[test]
    fn failed_engines_are_replaced_until_the_restart_limit() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = false;
        o.coordinator = running(5, None);
        o.failed_pods = vec!["j-engine-1".into()];
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.restarts), (Some(Phase::Starting), 1));
        assert_eq!(d.children, Children::Assemble(2));
        assert_eq!(cond(&j, ConditionType::Ready).reason, "ReplacingFailedPods");
        // MemoryX restarting twice counts too, once each.
        o.failed_pods = vec![];
        o.memoryx_restarts = Some(1);
        let d = step(&mut j, &o);
        assert_eq!(d.status.restarts, 2);
        let d = step(&mut j, &o);
        assert_eq!(d.status.restarts, 2, "the same MemoryX restart is not counted twice");
        o.memoryx_restarts = Some(2);
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Failed));
        assert_eq!(d.children, Children::Release);
        assert_eq!(d.status.allocated_cs2, None);
        assert_eq!(cond(&j, ConditionType::Failed).reason, "RestartLimitExceeded");
        assert!(d.transition.unwrap().warning);
        // Failed is final.
        o.memoryx_restarts = Some(0);
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Failed));
        // The pod and line that failed it join the Failed condition, and the next passes keep them.
        let named = failed_by(j.status.as_ref().unwrap(), "j-engine-1 (exit 137): ERROR out of memory");
        j.status = Some(named);
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Failed));
        let message = &cond(&j, ConditionType::Failed).message;
        assert!(
            message.ends_with("restartLimit = 2; failed by pod j-engine-1 (exit 137): ERROR out of memory"),
            "{message}"
        );
    }

    #[test]
    fn a_pod_refusing_the_jobs_input_fails_the_job_at_once() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = false;
        o.failed_pods = vec!["j-input-0".into()];
        o.refused_pods = vec!["j-input-0".into()];
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.restarts), (Some(Phase::Failed), 1), "one failure, far below the limit");
        assert_eq!((d.children, d.status.allocated_cs2), (Children::Release, None));
        let failed = cond(&j, ConditionType::Failed);
        assert_eq!(failed.reason, "InputRefused");
        assert!(failed.message.starts_with("j-input-0 refused the job's input"), "{}", failed.message);
        assert!(d.transition.unwrap().warning);
    }

    #[test]
    fn a_suspend_waits_for_its_checkpoint_only_so_long() {
        let mut j = job(2);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        step(&mut j, &o);
        (o.admission, o.pods_ready, o.coordinator) = (None, true, running(40, Some(30)));
        step(&mut j, &o);
        j.spec.suspend = true;
        assert!(step(&mut j, &o).request_checkpoint);
        // MemoryX never writes it (a full disk, a hung store): the wait ends after the deadline.
        o.coordinator = running(41, Some(30));
        o.now += std::time::Duration::from_secs(CHECKPOINT_WAIT_SECONDS - 1);
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Checkpointing));
        o.now += std::time::Duration::from_secs(2);
        let d = step(&mut j, &o);
        assert_eq!(
            (d.status.phase, d.status.allocated_cs2, d.children),
            (Some(Phase::Suspended), None, Children::Release)
        );
        assert!(
            cond(&j, ConditionType::Suspended).message.contains("step 30")
                && cond(&j, ConditionType::Suspended).message.contains("within 300 s"),
            "{:?}",
            cond(&j, ConditionType::Suspended)
        );
        assert_eq!(d.status.checkpoint_requested_at, None);
    }

    #[test]
    fn a_job_past_its_active_deadline_fails_and_frees_its_cs2s() {
        let mut j = job(2);
        j.spec.active_deadline_seconds = Some(600);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        step(&mut j, &o);
        (o.admission, o.pods_ready, o.coordinator) = (None, true, running(40, None));
        o.now += std::time::Duration::from_secs(600);
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Running));
        o.now += std::time::Duration::from_secs(1);
        let d = step(&mut j, &o);
        assert_eq!(
            (d.status.phase, d.status.allocated_cs2, d.children),
            (Some(Phase::Failed), None, Children::Release)
        );
        assert_eq!(cond(&j, ConditionType::Failed).reason, "DeadlineExceeded");
    }

    #[test]
    fn suspend_checkpoints_first_then_releases_and_resume_readmits() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = true;
        o.coordinator = running(40, Some(30));
        step(&mut j, &o);
        j.spec.suspend = true;
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Checkpointing));
        assert!(d.request_checkpoint);
        assert_eq!(d.status.checkpoint_requested_at_step, Some(40));
        assert_eq!(d.children, Children::Assemble(2), "keeps running until the checkpoint exists");
        o.coordinator = running(41, Some(30));
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Checkpointing));
        assert!(!d.request_checkpoint, "asks once");
        o.coordinator = running(41, Some(41));
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.allocated_cs2), (Some(Phase::Suspended), None));
        assert_eq!(d.children, Children::Release);
        assert_eq!(d.status.progress.last_checkpoint.as_ref().unwrap().step, 41);
        assert_eq!(cond(&j, ConditionType::Suspended).status, "True");
        // Resume: through admission again.
        j.spec.suspend = false;
        o.coordinator = None;
        o.admission = Some(Verdict::Wait { reason: Reason::InsufficientCapacity, message: "busy".into() });
        assert_eq!(step(&mut j, &o).status.phase, Some(Phase::Queued));
        o.admission = Some(Verdict::Admit);
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.children.clone()), (Some(Phase::Starting), Children::Assemble(2)));
        assert_eq!(d.transition.unwrap().reason, "Resumed");
        assert_eq!(cond(&j, ConditionType::Suspended).status, "False");
    }

    #[test]
    fn rescale_checkpoints_then_reassembles_at_the_new_size() {
        let (mut j, mut o) = admitted(2);
        o.pods_ready = true;
        o.coordinator = running(10, None);
        step(&mut j, &o);
        j.spec.cs2 = 4;
        o.may_grow = false;
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.children.clone()), (Some(Phase::Running), Children::Assemble(2)));
        assert_eq!(cond(&j, ConditionType::Admitted).reason, "RescaleWaitingForCapacity");
        o.may_grow = true;
        let d = step(&mut j, &o);
        assert!(d.request_checkpoint);
        assert_eq!(d.status.phase, Some(Phase::Checkpointing));
        o.coordinator = running(11, Some(11));
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.allocated_cs2), (Some(Phase::Starting), Some(4)));
        assert_eq!(d.children, Children::Assemble(4));
        // Shrinking needs no capacity.
        j.spec.cs2 = 1;
        o.may_grow = false;
        o.coordinator = running(11, Some(11));
        let d = step(&mut j, &o);
        assert_eq!((d.status.allocated_cs2, d.children), (Some(1), Children::Assemble(1)));
    }

    /// CS-2s lost for good: after the grace period the job checkpoints and goes on with as many as remain,
    /// down to minCs2 (never below, and a brief dip moves nothing), says so, and grows back when they return.
    #[test]
    fn a_job_that_loses_cs2s_goes_on_with_fewer_down_to_min_cs2_and_grows_back() {
        let mut j = job(4);
        j.spec.min_cs2 = Some(2);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        o.capacity = Some(4);
        step(&mut j, &o);
        o.admission = None;
        o.pods_ready = true;
        o.coordinator = running(10, Some(10));
        assert_eq!(step(&mut j, &o).children, Children::Assemble(4));
        // The pool drops to 1 left for the job: below minCs2, it keeps what it holds.
        o.coordinator = running(11, Some(10));
        o.capacity = Some(1);
        o.now = Timestamp::from_second(1_000_100).unwrap();
        let d = step(&mut j, &o);
        assert_eq!((d.children.clone(), d.request_checkpoint), (Children::Assemble(4), false));
        // 3 left: within the grace period nothing moves; after it, 2 (3 does not divide the batch of 64).
        o.capacity = Some(3);
        o.now = Timestamp::from_second(1_000_110).unwrap();
        assert_eq!(step(&mut j, &o).children, Children::Assemble(4), "a dip within the grace period moves nothing");
        o.now = Timestamp::from_second(1_000_100 + CAPACITY_GRACE_SECONDS as i64).unwrap();
        let d = step(&mut j, &o);
        assert!(d.request_checkpoint, "a checkpoint first");
        assert_eq!(d.status.phase, Some(Phase::Checkpointing));
        let t = d.transition.expect("an event");
        assert_eq!((t.reason, t.warning), (Reason::CapacityLost, true));
        o.coordinator = running(12, Some(12));
        o.lost_nodes = vec!["w2".into()];
        let d = step(&mut j, &o);
        assert_eq!((d.status.allocated_cs2, d.children.clone()), (Some(2), Children::Assemble(2)));
        assert!(
            d.transition.as_ref().is_some_and(|t| t.reason == Reason::CapacityLost
                && t.message.contains("continuing on 2 of 4")
                && t.message.contains("were lost (node w2 unreachable)")),
            "{:?}",
            d.transition
        );
        o.lost_nodes.clear();
        // Running on 2 with 2 left: no loss any more; growing back waits for free CS-2s, then happens.
        o.capacity = Some(2);
        o.may_grow = false;
        let d = step(&mut j, &o);
        assert_eq!((d.children.clone(), d.status.capacity_lost_at.clone()), (Children::Assemble(2), None));
        assert_eq!(cond(&j, ConditionType::Admitted).reason, "RescaleWaitingForCapacity");
        o.capacity = Some(4);
        o.may_grow = true;
        o.coordinator = running(20, Some(12));
        assert!(step(&mut j, &o).request_checkpoint);
        o.coordinator = running(21, Some(21));
        let d = step(&mut j, &o);
        assert_eq!((d.status.allocated_cs2, d.children), (Some(4), Children::Assemble(4)));
        // A job without minCs2 keeps all it holds through a dip.
        let mut k = job(4);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        step(&mut k, &o);
        o.admission = None;
        o.capacity = Some(2);
        o.now = Timestamp::from_second(2_000_000).unwrap();
        assert_eq!(step(&mut k, &o).children, Children::Assemble(4));
    }

    /// Fewer CS-2s left than minCs2 for longer than a restart takes: the job checkpoints, gives its CS-2s back
    /// with its checkpoint claims kept, waits in the queue saying why, and resumes from the checkpoint.
    #[test]
    fn a_job_left_below_min_cs2_checkpoints_gives_back_its_cs2s_and_waits() {
        let mut j = job(4);
        j.spec.min_cs2 = Some(2);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        o.capacity = Some(4);
        step(&mut j, &o);
        o.admission = None;
        o.pods_ready = true;
        o.coordinator = running(30, Some(20));
        step(&mut j, &o);
        o.capacity = Some(1);
        o.lost_nodes = vec!["w1".into(), "w2".into()];
        let t0 = 1_000_000;
        for (after, holds) in [(0, 4), (CAPACITY_GRACE_SECONDS, 4), (REQUEUE_GRACE_SECONDS - 1, 4)] {
            o.now = Timestamp::from_second(t0 + after as i64).unwrap();
            let d = step(&mut j, &o);
            assert_eq!((d.children, d.request_checkpoint), (Children::Assemble(holds), false), "{after} s short");
        }
        o.now = Timestamp::from_second(t0 + REQUEUE_GRACE_SECONDS as i64).unwrap();
        let d = step(&mut j, &o);
        assert!(d.request_checkpoint, "a checkpoint of step 30 first");
        let t = d.transition.expect("an event");
        assert_eq!((t.phase, t.reason), (Phase::Checkpointing, Reason::CapacityLost));
        assert!(
            t.message.contains("fewer CS-2s are left to it than spec.minCs2 = 2")
                && t.message.contains("giving back its 4")
        );
        o.coordinator = running(31, Some(31));
        let d = step(&mut j, &o);
        assert_eq!(
            (d.children, d.status.allocated_cs2, d.status.phase),
            (Children::Release, None, Some(Phase::Queued))
        );
        let t = d.transition.expect("an event");
        assert_eq!((t.reason, t.warning), (Reason::CapacityLost, true));
        assert!(
            t.message.contains("spec.minCs2 = 2 (nodes w1, w2 unreachable)")
                && t.message.contains("checkpoint at step 31"),
            "{}",
            t.message
        );
        // In the queue it holds nothing and asks for nothing; admitted again, it resumes.
        o.coordinator = None;
        o.lost_nodes.clear();
        o.admission = Some(Verdict::Wait {
            reason: Reason::ExceedsPool,
            message: "needs 4 CS-2s but the whole pool has 1".into(),
        });
        let d = step(&mut j, &o);
        assert_eq!((d.children, d.status.phase), (Children::Nothing, Some(Phase::Queued)));
        o.admission = Some(Verdict::Admit);
        o.capacity = Some(4);
        let d = step(&mut j, &o);
        assert_eq!((d.children, d.status.allocated_cs2), (Children::Assemble(4), Some(4)));
        assert!(d.transition.is_some_and(|t| t.reason == Reason::Resumed));
    }

    /// Preempted: the job checkpoints, gives its CS-2s back, waits saying by whom, and resumes when admitted.
    #[test]
    fn a_preempted_job_checkpoints_gives_back_its_cs2s_and_resumes_later() {
        let mut j = job(4);
        let mut o = obs();
        o.admission = Some(Verdict::Admit);
        step(&mut j, &o);
        o.admission = None;
        o.pods_ready = true;
        o.coordinator = running(50, Some(40));
        step(&mut j, &o);
        o.evicted =
            Some(Eviction { reason: Reason::Preempted, why: "preempted by ml/urgent (PriorityClass 'high')".into() });
        let d = step(&mut j, &o);
        assert!(d.request_checkpoint);
        let t = d.transition.expect("an event");
        assert_eq!((t.phase, t.reason, t.warning), (Phase::Checkpointing, Reason::Preempted, true));
        assert!(t.message.contains("preempted by ml/urgent (PriorityClass 'high')"), "{}", t.message);
        o.coordinator = running(51, Some(51));
        let d = step(&mut j, &o);
        assert_eq!(
            (d.children, d.status.allocated_cs2, d.status.phase),
            (Children::Release, None, Some(Phase::Queued))
        );
        assert!(d.transition.is_some_and(|t| t.message.contains("resumes from its checkpoint at step 51")));
        assert_eq!(cond(&j, ConditionType::Admitted).reason, "Preempted");
        // While it waits for the higher job's CS-2s, it still says by whom it was preempted; Ready says for what.
        o.evicted = None;
        o.coordinator = None;
        o.admission = Some(Verdict::Wait { reason: Reason::InsufficientCapacity, message: "needs 4, 0 free".into() });
        step(&mut j, &o);
        let admitted = cond(&j, ConditionType::Admitted);
        assert_eq!(admitted.reason, "Preempted");
        assert!(admitted.message.contains("preempted by ml/urgent"), "{}", admitted.message);
        assert_eq!(
            (cond(&j, ConditionType::Ready).reason.as_str(), j.status.as_ref().unwrap().phase),
            ("InsufficientCapacity", Some(Phase::Queued))
        );
        // A wait for anything but CS-2s says so instead.
        let mut other = j.clone();
        o.admission = Some(Verdict::Wait { reason: Reason::PriorityClassNotFound, message: "gone".into() });
        step(&mut other, &o);
        assert_eq!(cond(&other, ConditionType::Admitted).reason, "PriorityClassNotFound");
        o.admission = Some(Verdict::Admit);
        let d = step(&mut j, &o);
        assert_eq!(d.children, Children::Assemble(4));
        assert!(d.transition.is_some_and(|t| t.reason == Reason::Resumed));
    }

    #[test]
    fn memoryx_success_completes_and_releases() {
        let (mut j, mut o) = admitted(2);
        o.coordinator = Some(Ok(MemoryxStatus::at(MemoryxPhase::Succeeded, 100)));
        let d = step(&mut j, &o);
        assert_eq!((d.status.phase, d.status.allocated_cs2), (Some(Phase::Succeeded), None));
        assert!(d.status.completion_time.is_some());
        assert_eq!(d.children, Children::Release);
        assert_eq!(cond(&j, ConditionType::Complete).status, "True");
    }

    #[test]
    fn a_plan_that_cannot_fit_fails_the_job_with_the_reason() {
        let mut j = job(2);
        let mut o = obs();
        o.plan = Err("needs 9 bytes of SRAM, has 1".into());
        o.admission = Some(Verdict::Admit);
        let d = step(&mut j, &o);
        assert_eq!(d.status.phase, Some(Phase::Failed));
        assert!(cond(&j, ConditionType::Failed).message.contains("SRAM"));
    }

    #[test]
    fn suspending_a_queued_job_needs_no_checkpoint() {
        let mut j = job(2);
        j.spec.suspend = true;
        let d = step(&mut j, &obs());
        assert_eq!((d.status.phase, d.request_checkpoint), (Some(Phase::Suspended), false));
    }
}
