//! The answer of Kueue's visibility API (`visibility.kueue.x-k8s.io`, `.../localqueues/{name}/pendingworkloads`):
//! the Workloads waiting in a LocalQueue, in order. It is an aggregated API, not a CRD, so there is no schema to
//! generate these from; the fields are spelled as Kueue's Go types spell them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// One pending Workload as Kueue's visibility API lists it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PendingWorkload {
    /// Its name and namespace.
    pub metadata: ObjectMeta,
    /// 0 for the next one the ClusterQueue admits.
    #[serde(default)]
    pub position_in_cluster_queue: i32,
    /// 0 for the LocalQueue's next one.
    #[serde(default)]
    pub position_in_local_queue: i32,
}

/// The visibility API's answer.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PendingWorkloadsSummary {
    /// The pending Workloads, in order.
    #[serde(default)]
    pub items: Vec<PendingWorkload>,
}
