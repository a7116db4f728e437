//! What each status [`Reason`] means and what a user does about it: the text of
//! `docs/reference/status-reasons.md` (generated from here by `crds/tests/reference_doc.rs`). Each match is
//! exhaustive, so a reason cannot be added without saying both.

use crate::conditions::Reason;

impl Reason {
    /// Where the reason appears and what happened, in a sentence.
    pub fn cause(self) -> &'static str {
        match self {
            Reason::AwaitingAdmission => "`Admitted=False`: the job holds no CS-2s and admission gave no verdict yet.",
            Reason::PriorityClassNotFound => {
                "`Admitted=False` and a Warning Event: `spec.priorityClassName` names a PriorityClass that does not \
                 exist, so the job is never admitted."
            }
            Reason::ExceedsPool => "`Admitted=False`: the job wants more CS-2s (`spec.cs2`) than the whole pool has.",
            Reason::InsufficientCapacity => {
                "`Admitted=False`: the job is next in the queue but not enough CS-2s are free."
            }
            Reason::WaitingForEarlierJobs => {
                "`Admitted=False`: jobs ahead in the queue (`status.queuePosition`) wait for CS-2s first."
            }
            Reason::NotWaiting => "`Admitted=False`, briefly: admission was asked about a job that waits for nothing.",
            Reason::DataVolumeNotFound => {
                "`Admitted=False`: `spec.data.volume` names a PersistentVolumeClaim that does not exist in the job's \
                 namespace; the job waits outside the queue."
            }
            Reason::NoPool => {
                "`Admitted=False`: no node advertises `weightstream.dev/cs2` and the chart sets no fallback pool \
                 (`cs2.pool`)."
            }
            Reason::KueueQueued => {
                "`Admitted=False`: the job carries the label `kueue.x-k8s.io/queue-name`, so Kueue admits it, and its \
                 Workload waits for quota; the message gives Kueue's reason, the ClusterQueue and the position."
            }
            Reason::Admitted => "`Admitted=True`: all the job's CS-2s were free and it got them.",
            Reason::Resumed => {
                "`Suspended=False`: a suspended job was admitted again and continues from its checkpoint."
            }
            Reason::Rescaled => "`Admitted=True`: the job was reassembled at its new `spec.cs2`.",
            Reason::RescaleWaitingForCapacity => {
                "`Admitted=True`: the job runs at its old size while growing to `spec.cs2` waits for free CS-2s."
            }
            Reason::CapacityLost => {
                "A Warning Event and the `Checkpointing`/`Starting` transitions: CS-2s the job held were lost for good \
                 (a node gone or cordoned, the pool shrunk); it goes on with fewer, down to `spec.minCs2`. Left with \
                 fewer than that for 2 minutes, it checkpoints, gives its CS-2s back and waits (`Queued`)."
            }
            Reason::Preempted => {
                "A Warning Event and the `Checkpointing`/`Queued` transitions: a waiting job of a higher PriorityClass \
                 needed the CS-2s (the chart's `operator.preemption: allowed`); the job checkpointed, gave them back \
                 and waits in the queue. `Admitted` keeps this reason, naming that job, until it is admitted again; \
                 `Ready` says what it waits for meanwhile."
            }
            Reason::KueueEvicted => {
                "A Warning Event and the `Checkpointing`/`Queued` transitions: Kueue evicted the job's Workload \
                 (preempted by a higher-priority workload, its queue stopped, its quota shrank); the job \
                 checkpointed, gave its CS-2s back and waits for Kueue to admit it again (`Admitted` keeps this \
                 reason until then; `Ready` says what it waits for)."
            }
            Reason::Suspending => {
                "Phase `Checkpointing`: a checkpoint is written before a suspend gives back the CS-2s."
            }
            Reason::Rescaling => {
                "Phase `Checkpointing`: a checkpoint is written before the job is reassembled at a new size."
            }
            Reason::Suspended => {
                "`Suspended=True`: the job was suspended on request (`spec.suspend`); its CS-2s are free."
            }
            Reason::Released => "`Admitted=False`: the job is over (succeeded or failed) and its CS-2s are free.",
            Reason::Assembling => "`Ready=False`: the appliance is being assembled after admission or a rescale.",
            Reason::PodsNotReady => {
                "`Ready=False`, phase `Starting`: engine, SwarmX or input-worker pods are not ready yet."
            }
            Reason::ReplacingFailedPods => {
                "`Ready=False`, phase `Starting`: failed pods are being replaced; each counts as a restart."
            }
            Reason::CoordinatorStarting => {
                "`Ready=False`, phase `Starting`: MemoryX is loading data, restoring its checkpoint or reaching its \
                 engines."
            }
            Reason::CoordinatorUnreachable => "`Ready=False`, phase `Starting`: MemoryX does not answer `/status` yet.",
            Reason::Training => "`Ready=True`: every child is ready and MemoryX reports progress.",
            Reason::Finished => "`Ready=False`: the job succeeded and its CS-2s are free.",
            Reason::PodsForbidden => {
                "`Ready=False` and a Warning Event: the API server refused a child with 403 (Pod Security admission, \
                 RBAC or a ResourceQuota)."
            }
            Reason::ChildInvalid => {
                "`Ready=False` and a Warning Event: the API server refused a child as invalid (422)."
            }
            Reason::PodCreateFailed => {
                "`Ready=False` and a Warning Event: MemoryX's pod was refused for another reason, as its StatefulSet \
                 says."
            }
            Reason::InvalidSpec => {
                "`Ready=False` and a Warning Event: the stored TrainingJob does not decode, so the operator cannot act \
                 on it."
            }
            Reason::TrainingComplete => "`Complete=True`, phase `Succeeded`: MemoryX trained every step.",
            Reason::PlanRejected => "`Failed=True`: the plan refuses the job; it cannot fit an engine at its size.",
            Reason::DataPlaneFailed => "`Failed=True`: MemoryX reported that training failed.",
            Reason::DeadlineExceeded => {
                "`Failed=True`: the job ran longer than `spec.activeDeadlineSeconds` since its first admission."
            }
            Reason::RestartLimitExceeded => {
                "`Failed=True`: MemoryX or the engines failed more often than `spec.restartLimit` allows."
            }
            Reason::InputRefused => {
                "`Failed=True`: a role refused the job's input (a corrupt or missing data file or tokenizer, a model \
                 it cannot run, an engine's SRAM exceeded); another run would fail the same way, so it was not \
                 restarted."
            }
        }
    }

    /// What to do about it (or that nothing needs doing), naming the command that shows more.
    pub fn remedy(self) -> &'static str {
        match self {
            Reason::AwaitingAdmission | Reason::NotWaiting => "Nothing: the operator decides on its next pass.",
            Reason::PriorityClassNotFound => {
                "Create the PriorityClass (`kubectl get priorityclass` lists them) or delete the job and submit it \
                 naming an existing one."
            }
            Reason::ExceedsPool => {
                "Lower `spec.cs2` to the pool's size, or grow the pool (more nodes advertising `weightstream.dev/cs2`, \
                 or the chart's `cs2.pool`)."
            }
            Reason::InsufficientCapacity | Reason::WaitingForEarlierJobs => {
                "Wait: `wsctl get` shows the queue. A smaller `spec.cs2` (or `spec.minCs2`) fits sooner; a higher \
                 `spec.priority` reorders your own namespace's jobs."
            }
            Reason::DataVolumeNotFound => {
                "Create the PersistentVolumeClaim named in `spec.data.volume` in the job's namespace (`kubectl get \
                 pvc`); the job is admitted once it exists."
            }
            Reason::NoPool => {
                "Enable the chart's device plugin (`devicePlugin.enabled=true`) on the CS-2 hosts, or set `cs2.pool` \
                 to a fallback size."
            }
            Reason::Admitted | Reason::Resumed | Reason::Rescaled | Reason::Training | Reason::Assembling => {
                "Nothing: the job proceeds; `wsctl get JOB -w` follows it."
            }
            Reason::RescaleWaitingForCapacity => {
                "Nothing, or set `spec.cs2` back to the size it runs at; it grows once CS-2s are free."
            }
            Reason::CapacityLost => {
                "Nothing: it continues from its last checkpoint and grows back when the CS-2s return; check the \
                 nodes with `kubectl get nodes`."
            }
            Reason::Preempted => {
                "Nothing: it resumes from its checkpoint once the higher-priority jobs leave room; a higher \
                 `spec.priorityClassName` (`wsctl set-priority JOB CLASS`) keeps a job from being preempted."
            }
            Reason::KueueQueued => {
                "Wait for quota, or ask the cluster's admin about the ClusterQueue's quota: `kubectl get \
                 clusterqueue NAME -o yaml` shows what it admits; a higher `kueue.x-k8s.io/priority-class` label \
                 orders the job earlier."
            }
            Reason::KueueEvicted => {
                "Nothing: it resumes from its checkpoint when Kueue admits its Workload again; `kubectl get workloads \
                 -n NS` shows why it was evicted."
            }
            Reason::Suspending | Reason::Rescaling => "Nothing: the checkpoint is written, then the job moves on.",
            Reason::Suspended => "`wsctl resume JOB` continues it from its checkpoint.",
            Reason::Released | Reason::Finished | Reason::TrainingComplete => {
                "Nothing: the job is over; `wsctl get JOB` shows its last loss and checkpoint."
            }
            Reason::PodsNotReady | Reason::CoordinatorStarting | Reason::CoordinatorUnreachable => {
                "Usually wait. If it lasts, `kubectl get pods -l weightstream.dev/job=JOB` shows which pod waits and \
                 `kubectl describe pod POD` why (an image pull, no node with a free CS-2); `wsctl logs JOB` shows \
                 MemoryX's log."
            }
            Reason::ReplacingFailedPods => {
                "Read the failed pod's log (`wsctl logs JOB --role engine`); the job fails once `spec.restartLimit` is \
                 used up."
            }
            Reason::PodsForbidden => {
                "Read the Event (`kubectl describe tj JOB`): allow the pods under the namespace's Pod Security level, \
                 grant the operator's RBAC, or raise the quota; the operator retries."
            }
            Reason::ChildInvalid | Reason::PodCreateFailed => {
                "Read the Event (`kubectl describe tj JOB`); usually a value in `spec.resources` or `spec.images` the \
                 API server refuses: fix it in a new job."
            }
            Reason::InvalidSpec => {
                "The CRD and the stored object disagree (an older or newer API): upgrade the chart's CRD, or delete \
                 the job and submit it again."
            }
            Reason::PlanRejected => {
                "Run `wsctl plan JOB.yaml` to see why; use more CS-2s, a smaller model, weight streaming \
                 (`spec.executionMode`) or a larger `spec.engine.sramBytes`."
            }
            Reason::DataPlaneFailed => {
                "Read the condition's message and `wsctl logs JOB`; fix the spec or the data and submit a new job."
            }
            Reason::DeadlineExceeded => {
                "Submit it again with a larger `spec.activeDeadlineSeconds` (or none), or make it shorter."
            }
            Reason::RestartLimitExceeded => {
                "Find the failing role with `wsctl logs JOB --role engine` or `--role memoryx` and `kubectl get events`; \
                 raise `spec.restartLimit` only for a flaky cluster."
            }
            Reason::InputRefused => {
                "The condition's message names the pod and its line (`wsctl get JOB`, `wsctl logs export JOB` for \
                 the post-mortem); fix what it names in the spec or on the data volume and submit the job again."
            }
        }
    }
}
