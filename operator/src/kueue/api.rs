//! Kueue's objects as the operator reads and writes them (`kueue.x-k8s.io/v1beta2`, Kueue v0.19): the fields of
//! `Workload`, `ResourceFlavor` and `LocalQueue` a job integration uses, spelled as Kueue's CRD schemas spell
//! them. Fields the operator does not use are not declared; serde skips them when reading, and the operator
//! never writes a whole object it read (only its own fields, by server-side apply or a merge patch).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version the operator speaks (served and stored by Kueue since v0.16).
pub const VERSION: &str = "v1beta2";

/// A unit of admission: the pods a job will run, grouped in pod sets, waiting for quota in a LocalQueue.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Workload",
    namespaced,
    status = "WorkloadStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// The LocalQueue (in the Workload's namespace) it waits in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    /// The pods, by set; at most 18 sets.
    pub pod_sets: Vec<PodSet>,
    /// The priority class the priority came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_ref: Option<PriorityClassRef>,
    /// The priority (required with `priorityClassRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// `false` deactivates the Workload (Kueue evicts it and does not requeue it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
}

/// Pods that share one template.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// A DNS label, unique in the Workload.
    pub name: String,
    /// How many pods.
    pub count: i32,
    /// The fewest pods the set can run with (partial admission); on at most one set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<i32>,
    /// The pods' template: their requests are what quota is counted in.
    pub template: PodTemplateSpec,
}

/// A `WorkloadPriorityClass` (group `kueue.x-k8s.io`) or a `PriorityClass` (group `scheduling.k8s.io`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct PriorityClassRef {
    /// The class's API group.
    pub group: String,
    /// The class's kind.
    pub kind: String,
    /// The class's name.
    pub name: String,
}

/// What Kueue (and the job's controller) say about the Workload.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// `QuotaReserved`, `Admitted`, `Evicted`, `Preempted`, `Requeued`, `PodsReady`, `Finished`, ...
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Where and with how much it was admitted, while it holds quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
}

/// A quota reservation.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The ClusterQueue whose quota it holds.
    pub cluster_queue: String,
    /// One per pod set.
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

/// The flavors and count admitted for one pod set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    /// The pod set's name.
    pub name: String,
    /// The ResourceFlavor assigned to each resource.
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    /// The pods admitted (fewer than the set's count under partial admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
}

/// A kind of nodes quota is counted for; the pods admitted to it get its node labels and tolerations.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(group = "kueue.x-k8s.io", version = "v1beta2", kind = "ResourceFlavor", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    /// Added to the pods' node selector.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// Added to the pods' tolerations.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

/// A namespace's queue, which feeds a ClusterQueue.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(group = "kueue.x-k8s.io", version = "v1beta2", kind = "LocalQueue", namespaced, schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct LocalQueueSpec {
    /// The ClusterQueue it feeds.
    #[serde(default)]
    pub cluster_queue: String,
}

/// One pending Workload as Kueue's visibility API lists it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PendingWorkload {
    /// Its name and namespace.
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    /// 0 for the next one the ClusterQueue admits.
    #[serde(default)]
    pub position_in_cluster_queue: i32,
    /// 0 for the LocalQueue's next one.
    #[serde(default)]
    pub position_in_local_queue: i32,
}

/// The visibility API's answer (`.../localqueues/{name}/pendingworkloads`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PendingWorkloadsSummary {
    /// The pending Workloads, in order.
    #[serde(default)]
    pub items: Vec<PendingWorkload>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Workload as Kueue v0.19 stores it after admission decodes into these types, fields unknown here
    /// skipped, and what the operator reads from it survives.
    #[test]
    fn an_admitted_workload_from_kueue_decodes() {
        let stored = serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "trainingjob-a-1b2c3", "namespace": "ml", "uid": "u",
                         "finalizers": ["kueue.x-k8s.io/resource-in-use"]},
            "spec": {"queueName": "team", "active": true, "priority": 0,
                     "podSets": [{"name": "engine", "count": 4, "minCount": 2,
                                  "template": {"spec": {"containers": [{"name": "sim-wse"}]}}}]},
            "status": {
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "engine", "count": 2, "flavors": {"weightstream.dev/cs2": "cs2"},
                     "resourceUsage": {"weightstream.dev/cs2": "2"}}]},
                "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok",
                                "lastTransitionTime": "2026-11-29T20:00:00Z", "observedGeneration": 1}],
                "requeueState": {"count": 1},
                "resourceRequests": [{"name": "engine", "resources": {"cpu": "1"}}]
            }
        });
        let w: Workload = serde_json::from_value(stored).unwrap();
        assert_eq!(w.spec.pod_sets[0].min_count, Some(2));
        let a = w.status.unwrap().admission.unwrap();
        assert_eq!((a.cluster_queue.as_str(), a.pod_set_assignments[0].count), ("cq", Some(2)));
        assert_eq!(a.pod_set_assignments[0].flavors["weightstream.dev/cs2"], "cs2");
    }
}
