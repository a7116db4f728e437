//! A job's Events as `wsctl` shows them (the dashboard, `logs export`): those of the job and of its objects (its
//! pods, its StatefulSet, pods already gone), read from the namespace's newest `limit`, oldest first.

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::{Cluster, Error};

/// When `e` last happened (RFC 3339), for ordering; empty when it does not say.
pub fn when(e: &Event) -> String {
    let last = e.last_timestamp.as_ref().map(|t| t.0.to_string());
    last.or_else(|| e.event_time.as_ref().map(|t| t.0.to_string())).unwrap_or_default()
}

/// The Events of job `job` and its objects among the namespace's first `limit`, oldest first.
pub async fn of_job(cluster: &Cluster, job: &str, pods: &[Pod], limit: u32) -> Result<Vec<Event>, Error> {
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let action = format!("list the Events of namespace {}", cluster.namespace);
    let list = api.list(&ListParams::default().limit(limit)).await.map_err(Error::other(action))?;
    let names: std::collections::BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
    let prefix = format!("{job}-");
    let mut mine: Vec<Event> = list
        .items
        .into_iter()
        .filter(|e| {
            let name = e.involved_object.name.as_deref().unwrap_or_default();
            name == job || names.contains(name) || name.starts_with(&prefix)
        })
        .collect();
    mine.sort_by_cached_key(when);
    Ok(mine)
}
