//! What a job's Workload says (waiting, admitted, evicted, finished), what that means for the job (admission's
//! verdict, an eviction), and the writes the job's controller owes Kueue (`PodsReady`, `Finished`, clearing an
//! evicted reservation) as the bodies sent: all pure, tested without a cluster.

use crds::conditions::Reason;
use crds::{Phase, TrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::api::workloads::Workload;
use super::api::{GROUP, VERSION};
use crate::admission::Verdict;
use crate::status::Eviction;

/// The field manager of the operator's `PodsReady` condition on a Workload.
pub const PODS_READY_MANAGER: &str = "weightstream-operator-pods-ready";
/// The field manager of the operator's `Finished` condition on a Workload.
pub const FINISHED_MANAGER: &str = "weightstream-operator-finished";

/// A Workload as the job sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    /// There is none yet: the operator creates it.
    Missing,
    /// It waits for quota (or for its admission checks); Kueue's words, when it gave any.
    Pending {
        /// The `QuotaReserved=False` (or `Evicted`) message.
        message: Option<String>,
    },
    /// Admitted: the job may run.
    Admitted {
        /// Whose quota it holds.
        cluster_queue: String,
        /// The engines admitted, when Kueue said (fewer than the pod set's count under partial admission).
        engines: Option<u32>,
    },
    /// Evicted while it holds a reservation: the job stops, then the reservation is cleared.
    Evicted {
        /// Kueue's reason (`Preempted`, `ClusterQueueStopped`, `PodsReadyTimeout`, ...).
        reason: String,
        /// Kueue's message.
        message: String,
    },
    /// Finished (by the operator, or by Kueue for an orphan): it holds nothing.
    Finished,
}

fn condition<'a>(w: &'a Workload, type_: &str) -> Option<&'a Condition> {
    w.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

fn is_true(w: &Workload, type_: &str) -> bool {
    condition(w, type_).is_some_and(|c| c.status == "True")
}

/// What `w` says.
pub fn seen(w: Option<&Workload>) -> Seen {
    let Some(w) = w else { return Seen::Missing };
    let admission = w.status.as_ref().and_then(|s| s.admission.as_ref());
    if is_true(w, "Finished") {
        return Seen::Finished;
    }
    if is_true(w, "Evicted") && (admission.is_some() || is_true(w, "QuotaReserved")) {
        let (reason, message) =
            condition(w, "Evicted").map(|c| (c.reason.clone(), c.message.clone())).unwrap_or_default();
        return Seen::Evicted { reason, message };
    }
    if let (true, Some(a)) = (is_true(w, "Admitted"), admission) {
        let mut assigned = a.pod_set_assignments.iter().flatten();
        let engines = assigned.find(|p| p.name.as_deref() == Some(crds::contract::Role::Engine.as_str()));
        let engines = engines.and_then(|p| p.count).and_then(|n| u32::try_from(n).ok());
        return Seen::Admitted { cluster_queue: a.cluster_queue.clone().unwrap_or_default(), engines };
    }
    let said = |t: &str| condition(w, t).filter(|c| c.status == "False" && !c.message.is_empty());
    let message = said("QuotaReserved").or_else(|| said("Admitted")).map(|c| c.message.clone());
    Seen::Pending { message }
}

/// Where a pending Workload stands in Kueue's queues, as the visibility API says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Queueing {
    /// The LocalQueue (the job's label).
    pub local_queue: String,
    /// The ClusterQueue it feeds, when it could be read.
    pub cluster_queue: Option<String>,
    /// 1 for the next one its ClusterQueue admits, when the visibility API answered.
    pub position: Option<u32>,
    /// Whether the LocalQueue is known not to exist (the job's label names no queue of its namespace).
    pub missing: bool,
}

/// Admission's verdict for a Kueue job that holds no CS-2s.
pub fn verdict(job: &TrainingJob, seen: &Seen, q: &Queueing) -> Verdict {
    let wait = |message: String| Verdict::Wait { reason: Reason::KueueQueued, message };
    let queues = match &q.cluster_queue {
        Some(cq) => format!("LocalQueue '{}' (ClusterQueue '{cq}')", q.local_queue),
        None => format!("LocalQueue '{}'", q.local_queue),
    };
    let at = q.position.map(|p| format!(", position {p}")).unwrap_or_default();
    match seen {
        Seen::Admitted { cluster_queue, engines } => {
            // Partial admission: run on the most of those the curve allows (a divisor of spec.cs2).
            let given = engines.unwrap_or(job.spec.cs2).min(job.spec.cs2);
            match job.spec.elastic_size(given) {
                Some(cs2) => Verdict::Kueue { cs2, cluster_queue: cluster_queue.clone() },
                None => wait(format!(
                    "Kueue admitted {given} CS-2s, fewer than spec.minCs2 = {}; waiting for Kueue",
                    job.spec.min_cs2()
                )),
            }
        }
        Seen::Missing | Seen::Pending { .. } if q.missing => wait(format!(
            "its label {} names LocalQueue '{}', which does not exist in its namespace: create it (for a \
             ClusterQueue) or fix the label",
            super::workload::QUEUE_LABEL,
            q.local_queue
        )),
        Seen::Missing => wait(format!("creating its Kueue Workload in {queues}")),
        Seen::Pending { message } => {
            let why = message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
            wait(format!("waiting for Kueue in {queues}{at}{why}"))
        }
        Seen::Evicted { reason, message } => {
            wait(format!("evicted by Kueue ({reason}: {message}); requeued in {queues}"))
        }
        Seen::Finished => wait(format!(
            "its Kueue Workload is finished; delete the job or remove the label {}",
            super::workload::QUEUE_LABEL
        )),
    }
}

/// Why a Kueue job holding CS-2s must give them back: its Workload was evicted, or is no longer admitted.
pub fn eviction(seen: &Seen) -> Option<Eviction> {
    let why = match seen {
        Seen::Admitted { .. } => return None,
        Seen::Evicted { reason, message } => format!("evicted by Kueue ({reason}: {message})"),
        Seen::Pending { .. } | Seen::Missing | Seen::Finished => "Kueue withdrew its Workload's admission".into(),
    };
    Some(Eviction { reason: Reason::KueueEvicted, why })
}

/// The body of a server-side apply of the Workload's status that sets one condition, as `manager` owns it.
fn condition_apply(w: &Workload, c: Condition) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Workload",
        "metadata": { "name": w.name_any(), "namespace": w.namespace() },
        "status": { "conditions": [c] },
    })
}

fn kueue_condition(type_: &str, status: bool, reason: &str, message: &str, w: &Workload, now: Timestamp) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: w.metadata.generation,
        last_transition_time: Time(now),
    }
}

/// The `PodsReady` condition the job's phase calls for, as an apply body, when it differs from what `w` says:
/// `True` while the appliance trains (or is over), `False` before (`WaitForStart`) or after it was
/// (`WaitForRecovery`). Kueue evicts a Workload whose pods are not ready in time.
pub fn pods_ready(w: &Workload, phase: Option<Phase>, now: Timestamp) -> Option<serde_json::Value> {
    let ready = matches!(phase, Some(Phase::Running | Phase::Checkpointing | Phase::Succeeded));
    let was = condition(w, "PodsReady");
    let (reason, message) = match (ready, was.is_some_and(|c| c.status == "True" || c.reason == "WaitForRecovery")) {
        (true, false) => ("Started", "All pods reached readiness and the workload is running"),
        (true, true) => ("Recovered", "All pods reached readiness and the workload is running"),
        (false, false) => ("WaitForStart", "Not all pods are ready or succeeded"),
        (false, true) => ("WaitForRecovery", "At least one pod has failed, waiting for recovery"),
    };
    let same = was.is_some_and(|c| (c.status == "True") == ready);
    (!same).then(|| condition_apply(w, kueue_condition("PodsReady", ready, reason, message, w, now)))
}

/// The `Finished` condition of a job that ended in `phase`, as an apply body, unless `w` has one already.
pub fn finished(w: &Workload, phase: Phase, message: &str, now: Timestamp) -> Option<serde_json::Value> {
    let reason = if phase == Phase::Succeeded { "Succeeded" } else { "Failed" };
    (!is_true(w, "Finished")).then(|| condition_apply(w, kueue_condition("Finished", true, reason, message, w, now)))
}

/// The merge patch that gives an evicted Workload's reservation back once the job stopped, as Kueue's own job
/// integrations do: no admission, `QuotaReserved` and `Admitted` false, `Requeued` set; guarded by the version
/// read, so a write of Kueue's in between makes it fail rather than be undone.
pub fn clear_reservation(w: &Workload, now: Timestamp) -> Option<serde_json::Value> {
    let Seen::Evicted { reason, message } = seen(Some(w)) else { return None };
    let mut conditions = w.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let requeued = matches!(reason.as_str(), "Preempted" | "NodeFailures");
    let set = [
        kueue_condition("QuotaReserved", false, "Pending", &message, w, now),
        kueue_condition("Admitted", false, "NoReservation", "The workload has no reservation", w, now),
        kueue_condition("Requeued", requeued, &reason, &message, w, now),
    ];
    for c in set {
        match conditions.iter_mut().find(|x| x.type_ == c.type_) {
            Some(x) if x.status == c.status => {
                x.reason = c.reason;
                x.message = c.message;
                x.observed_generation = c.observed_generation;
            }
            Some(x) => *x = c,
            None => conditions.push(c),
        }
    }
    Some(serde_json::json!({
        "metadata": { "resourceVersion": w.resource_version() },
        "status": { "admission": null, "conditions": conditions },
    }))
}

/// The merge patch that (de)activates the Workload as the job is suspended or resumed, when it is not so yet: a
/// suspended job gives its quota back (Kueue evicts an inactive Workload; the job's own suspend path has
/// already checkpointed and stopped it, and its reservation is then cleared as after any eviction), and a
/// resumed one queues again.
pub fn activation(job: &TrainingJob, w: &Workload) -> Option<serde_json::Value> {
    let want = !job.spec.suspend;
    let active = w.spec.active.unwrap_or(true);
    (active != want).then(|| serde_json::json!({ "spec": { "active": want } }))
}

/// The merge patch that removes Kueue's `resource-in-use` finalizer, when `w` has it.
pub fn release_finalizer(w: &Workload) -> Option<serde_json::Value> {
    let finalizers = w.finalizers();
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != super::workload::RESOURCE_IN_USE).collect();
    (kept.len() != finalizers.len())
        .then(|| serde_json::json!({ "metadata": { "resourceVersion": w.resource_version(), "finalizers": kept } }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kueue::api::workloads::{
        WorkloadStatus, WorkloadStatusAdmission, WorkloadStatusAdmissionPodSetAssignments,
    };

    fn cond(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
        kueue_condition(type_, status, reason, message, &Workload::new("w", Default::default()), Timestamp::UNIX_EPOCH)
    }

    fn wl(conditions: Vec<Condition>, engines: Option<i32>) -> Workload {
        let engine = |n| WorkloadStatusAdmissionPodSetAssignments {
            name: Some("engine".into()),
            count: Some(n),
            ..Default::default()
        };
        let admission = engines.map(|n| WorkloadStatusAdmission {
            cluster_queue: Some("cq".into()),
            pod_set_assignments: Some(vec![engine(n)]),
        });
        let mut w = Workload::new("trainingjob-a-12345", Default::default());
        w.metadata.namespace = Some("ml".into());
        w.metadata.resource_version = Some("7".into());
        w.metadata.finalizers = Some(vec!["other".into(), crate::kueue::workload::RESOURCE_IN_USE.into()]);
        w.status = Some(WorkloadStatus { conditions: Some(conditions), admission, ..Default::default() });
        w
    }

    fn job(cs2: u32, min: Option<u32>) -> TrainingJob {
        let mut j = crds::testing::mlp_job("a", "ml", cs2);
        j.spec.min_cs2 = min;
        j
    }

    fn queueing() -> Queueing {
        Queueing { local_queue: "team".into(), cluster_queue: Some("cq".into()), position: Some(2), missing: false }
    }

    /// Waiting says Kueue's reason, the queues and the position; admitted runs on what Kueue gave (partial
    /// admission to a divisor of spec.cs2 no smaller than spec.minCs2).
    #[test]
    fn the_verdict_follows_the_workload() {
        let nowhere = Queueing { local_queue: "nowhere".into(), missing: true, ..Default::default() };
        match verdict(&job(4, None), &Seen::Pending { message: None }, &nowhere) {
            Verdict::Wait { message, .. } => assert!(message.contains("'nowhere', which does not exist"), "{message}"),
            v => panic!("{v:?}"),
        }
        let pending = wl(vec![cond("QuotaReserved", false, "Pending", "insufficient unused quota for cs2")], None);
        match verdict(&job(4, None), &seen(Some(&pending)), &queueing()) {
            Verdict::Wait { reason, message } => {
                assert_eq!(reason, Reason::KueueQueued);
                assert!(message.contains("ClusterQueue 'cq'") && message.contains("position 2"), "{message}");
                assert!(message.contains("insufficient unused quota"), "{message}");
            }
            v => panic!("{v:?}"),
        }
        let admitted =
            wl(vec![cond("QuotaReserved", true, "QuotaReserved", ""), cond("Admitted", true, "Admitted", "")], Some(2));
        let v = verdict(&job(4, Some(2)), &seen(Some(&admitted)), &queueing());
        assert_eq!(v, Verdict::Kueue { cs2: 2, cluster_queue: "cq".into() });
        let three = wl(vec![cond("Admitted", true, "Admitted", "")], Some(3));
        assert_eq!(
            verdict(&job(4, Some(2)), &seen(Some(&three)), &queueing()),
            Verdict::Kueue { cs2: 2, cluster_queue: "cq".into() }
        );
        assert!(matches!(verdict(&job(4, None), &seen(None), &queueing()), Verdict::Wait { .. }));
    }

    /// An eviction while admitted stops the job; once stopped, the reservation is cleared as Kueue expects and
    /// the Workload then reads as pending again.
    #[test]
    fn an_evicted_workload_stops_the_job_then_gives_its_reservation_back() {
        let evicted = wl(
            vec![
                cond("QuotaReserved", true, "QuotaReserved", ""),
                cond("Admitted", true, "Admitted", ""),
                cond("Evicted", true, "Preempted", "Preempted to accommodate a higher priority Workload"),
            ],
            Some(4),
        );
        let s = seen(Some(&evicted));
        let e = eviction(&s).expect("an eviction");
        assert_eq!(e.reason, Reason::KueueEvicted);
        assert!(e.why.contains("Preempted to accommodate"), "{}", e.why);
        let patch = clear_reservation(&evicted, Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert!(patch["status"]["admission"].is_null());
        let mut cleared = evicted.clone();
        let status = cleared.status.as_mut().unwrap();
        status.admission = None;
        status.conditions = serde_json::from_value(patch["status"]["conditions"].clone()).unwrap();
        let by_type = |t: &str| status.conditions.iter().flatten().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(
            (by_type("QuotaReserved").status.as_str(), by_type("Admitted").reason.as_str()),
            ("False", "NoReservation")
        );
        assert_eq!(by_type("Requeued").status, "True");
        assert!(matches!(seen(Some(&cleared)), Seen::Pending { .. }));
        assert_eq!(clear_reservation(&cleared, Timestamp::UNIX_EPOCH), None);
        // A withdrawn admission stops a running job too; an admitted one runs on.
        assert!(eviction(&Seen::Pending { message: None }).is_some());
        assert_eq!(eviction(&Seen::Admitted { cluster_queue: "cq".into(), engines: None }), None);
    }

    /// A suspended job's Workload is deactivated, a resumed one's activated again, each once.
    #[test]
    fn suspending_deactivates_the_workload_and_resuming_activates_it() {
        let mut j = job(4, None);
        let mut w = wl(vec![], Some(4));
        w.spec.active = Some(true);
        assert_eq!(activation(&j, &w), None, "a running job's Workload stays active");
        j.spec.suspend = true;
        assert_eq!(activation(&j, &w), Some(serde_json::json!({"spec": {"active": false}})));
        w.spec.active = Some(false);
        assert_eq!(activation(&j, &w), None);
        j.spec.suspend = false;
        assert_eq!(activation(&j, &w), Some(serde_json::json!({"spec": {"active": true}})));
        w.spec.active = None;
        assert_eq!(activation(&j, &w), None, "active is Kueue's default");
    }

    /// PodsReady is written when it changes: WaitForStart, Started, WaitForRecovery, Recovered; Finished once;
    /// the finalizer is removed keeping others.
    #[test]
    fn pods_ready_finished_and_the_finalizer_are_written_once() {
        let now = Timestamp::UNIX_EPOCH;
        let mut w = wl(vec![], Some(2));
        let body = pods_ready(&w, Some(Phase::Starting), now).unwrap();
        assert_eq!(body["status"]["conditions"][0]["reason"], "WaitForStart");
        w.status.as_mut().unwrap().conditions.get_or_insert_default().push(cond(
            "PodsReady",
            false,
            "WaitForStart",
            "",
        ));
        assert_eq!(pods_ready(&w, Some(Phase::Starting), now), None);
        let body = pods_ready(&w, Some(Phase::Running), now).unwrap();
        assert_eq!(
            (body["status"]["conditions"][0]["status"].as_str(), body["kind"].as_str()),
            (Some("True"), Some("Workload"))
        );
        w.status.as_mut().unwrap().conditions.get_or_insert_default()[0] = cond("PodsReady", true, "Started", "");
        assert_eq!(pods_ready(&w, Some(Phase::Checkpointing), now), None);
        assert_eq!(
            pods_ready(&w, Some(Phase::Starting), now).unwrap()["status"]["conditions"][0]["reason"],
            "WaitForRecovery"
        );
        let body = finished(&w, Phase::Failed, "restart limit", now).unwrap();
        assert_eq!(body["status"]["conditions"][0]["reason"], "Failed");
        w.status.as_mut().unwrap().conditions.get_or_insert_default().push(cond("Finished", true, "Succeeded", ""));
        assert_eq!(finished(&w, Phase::Succeeded, "", now), None);
        assert_eq!(release_finalizer(&w).unwrap()["metadata"]["finalizers"], serde_json::json!(["other"]));
        w.metadata.finalizers = Some(vec!["other".into()]);
        assert_eq!(release_finalizer(&w), None);
    }
}
