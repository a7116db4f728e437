//! The reads and writes of Kueue's objects for one job: its Workload (created when missing), where it waits, the
//! flavors it was admitted to, and what the job's controller writes back (`PodsReady`, `Finished`, an evicted
//! reservation cleared, Kueue's finalizer removed, the Workloads of a deleted job let go).

use std::collections::BTreeMap;

use crds::conditions::ConditionType;
use crds::{TrainingJob, TrainingJobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};

use super::api::localqueues::LocalQueue;
use super::api::resourceflavors::{ResourceFlavor, ResourceFlavorSpec};
use super::api::visibility::PendingWorkloadsSummary;
use super::api::workloads::Workload;
use super::api::{GROUP, VERSION};
use super::seen::{self, FINISHED_MANAGER, PODS_READY_MANAGER, Queueing, Seen};
use super::workload::{self, JOB_UID_LABEL, PRIORITY_LABEL, Priority, queue_of};
use crate::Error;
use crate::admission::PriorityClasses;
use crate::children::desired::Desired;

/// What the operator read of Kueue for one job labelled for it.
#[derive(Clone, Debug)]
pub struct Reading {
    /// The job's Workload, when it exists.
    pub workload: Option<Workload>,
    /// What it says (or why none can exist).
    pub seen: Seen,
    /// Where it waits.
    pub queueing: Queueing,
    /// The flavors of each pod set's admission, by pod set (role), while admitted.
    pub flavors: BTreeMap<String, Vec<ResourceFlavorSpec>>,
}

/// Whether this cluster serves Kueue's Workloads (and the operator may read them): asked once at start.
pub async fn installed(client: &Client) -> bool {
    let api: Api<Workload> = Api::all(client.clone());
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::info!(error = %e, "Kueue's Workloads are not served here: jobs labelled for Kueue will wait");
            false
        }
    }
}

/// Reads Kueue's side of `job` (labelled for `local_queue`); `installed` says whether Kueue was there when the
/// operator started (without it, a Workload's change wakes no pass: the job moves at the operator's poll).
pub async fn read(client: &Client, job: &TrainingJob, local_queue: &str, installed: bool) -> Result<Reading, Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let mut queueing = Queueing { local_queue: local_queue.into(), ..Default::default() };
    // Kueue may have come after the operator started: ask again (only for jobs labelled for it).
    if !installed && !self::installed(client).await {
        let message = format!(
            "the job is labelled {}={local_queue} but this cluster does not serve Kueue's Workloads \
             ({GROUP}/{VERSION}): install Kueue, or remove the label to use the \
             operator's own queue",
            workload::QUEUE_LABEL
        );
        let seen = Seen::Pending { message: Some(message) };
        return Ok(Reading { workload: None, seen, queueing, flavors: BTreeMap::new() });
    }
    let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
    let found = workloads.get_opt(&workload::name(&job.name_any(), &uid)).await?;
    let seen = seen::seen(found.as_ref());
    if matches!(seen, Seen::Pending { .. } | Seen::Missing) {
        match Api::<LocalQueue>::namespaced(client.clone(), &ns).get_opt(local_queue).await {
            Ok(Some(q)) => queueing.cluster_queue = q.spec.cluster_queue,
            Ok(None) => queueing.missing = true,
            // Not allowed to read it (an older chart's grants): say what is known.
            Err(e) => tracing::debug!(error = %e, "cannot read the LocalQueue"),
        }
        if let Some(w) = &found {
            queueing.position = position(client, &ns, local_queue, &w.name_any()).await;
        }
    }
    let flavors = match (&seen, &found) {
        (Seen::Admitted { .. }, Some(w)) => flavors(client, w).await?,
        _ => BTreeMap::new(),
    };
    Ok(Reading { workload: found, seen, queueing, flavors })
}

/// The Workload's place in its ClusterQueue (1 = next), from Kueue's visibility API; `None` when it does not
/// answer (an older Kueue, the API not registered) or does not list it.
async fn position(client: &Client, ns: &str, local_queue: &str, name: &str) -> Option<u32> {
    let url =
        format!("/apis/visibility.kueue.x-k8s.io/{VERSION}/namespaces/{ns}/localqueues/{local_queue}/pendingworkloads");
    let request = http::Request::get(url).body(Vec::new()).ok()?;
    let summary: PendingWorkloadsSummary = match client.request(request).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "Kueue's visibility API did not answer");
            return None;
        }
    };
    let at = summary.items.iter().find(|p| p.metadata.name.as_deref() == Some(name))?;
    u32::try_from(at.position_in_cluster_queue).ok().map(|p| p + 1)
}

/// The flavors of each pod set's assignment.
async fn flavors(client: &Client, w: &Workload) -> Result<BTreeMap<String, Vec<ResourceFlavorSpec>>, Error> {
    let api: Api<ResourceFlavor> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    let assignments = w.status.as_ref().and_then(|s| s.admission.as_ref()).map(|a| a.pod_set_assignments.clone());
    for a in assignments.flatten().unwrap_or_default() {
        let Some(set) = a.name.clone() else { continue };
        let mut names: Vec<&String> = a.flavors.iter().flat_map(|f| f.values()).collect();
        names.sort();
        names.dedup();
        let mut specs = Vec::new();
        for n in names {
            if let Some(f) = api.get_opt(n).await? {
                specs.push(f.spec);
            }
        }
        out.insert(set, specs);
    }
    Ok(out)
}

/// The job's priority for Kueue: its `WorkloadPriorityClass` label, else its `spec.priorityClassName`; `Err`
/// says what is missing.
async fn priority(client: &Client, job: &TrainingJob, classes: &PriorityClasses) -> Result<Option<Priority>, String> {
    if let Some(name) = job.labels().get(PRIORITY_LABEL) {
        let gvk = GroupVersionKind::gvk(GROUP, VERSION, "WorkloadPriorityClass");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
        let found = api.get_opt(name).await.map_err(|e| format!("cannot read WorkloadPriorityClass '{name}': {e}"))?;
        let value = found.and_then(|c| c.data.get("value")?.as_i64()).and_then(|v| i32::try_from(v).ok());
        return match value {
            Some(v) => Ok(Some(Priority::workload_class(name, v))),
            None => Err(format!(
                "its label {PRIORITY_LABEL} names WorkloadPriorityClass '{name}', which does not exist: create it or \
                 fix the label"
            )),
        };
    }
    Ok(job
        .spec
        .priority_class_name
        .as_deref()
        .and_then(|name| classes.value_of(Some(name)).map(|v| Priority::pod_class(name, v))))
}

/// Creates the job's Workload when it has none (`desired` is its appliance at `spec.cs2`); returns the
/// reading as it then stands. A priority class that does not exist is said in the reading, and nothing is created.
pub async fn ensure(
    client: &Client,
    job: &TrainingJob,
    desired: &Desired,
    classes: &PriorityClasses,
    mut reading: Reading,
) -> Result<Reading, Error> {
    if reading.seen != Seen::Missing {
        return Ok(reading);
    }
    let priority = match priority(client, job, classes).await {
        Ok(p) => p,
        Err(message) => {
            reading.seen = Seen::Pending { message: Some(message) };
            return Ok(reading);
        }
    };
    let w = workload::workload(job, desired, priority)?;
    let api: Api<Workload> = Api::namespaced(client.clone(), &job.namespace().unwrap_or_default());
    let created = match api.create(&PostParams::default(), &w).await {
        Ok(w) => w,
        // Another pass created it meanwhile.
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(&w.name_any()).await?,
        Err(e) => return Err(e.into()),
    };
    tracing::info!(job = %job.name_any(), workload = %created.name_any(), queue = ?queue_of(job), "Kueue Workload created");
    reading.seen = seen::seen(Some(&created));
    reading.workload = Some(created);
    Ok(reading)
}

/// What the job's controller owes Kueue after a pass that leaves the job with `status` and `existing` pods:
/// `PodsReady` while admitted, the reservation of an evicted Workload cleared once the job's CS-2 pods are gone,
/// `Finished` (with the job's own last word) and the finalizer at the end.
pub async fn report(
    client: &Client,
    job: &TrainingJob,
    reading: &Reading,
    status: &TrainingJobStatus,
    existing: &[Pod],
) -> Result<(), Error> {
    let Some(w) = &reading.workload else { return Ok(()) };
    let (phase, holds) = (status.phase, status.allocated_cs2.unwrap_or(0));
    let api: Api<Workload> = Api::namespaced(client.clone(), &job.namespace().unwrap_or_default());
    let now = Timestamp::now();
    let name = w.name_any();
    let apply = |manager: &str| PatchParams::apply(manager).force();
    if let Some(p) = phase.filter(|p| p.is_terminal()) {
        let last = [ConditionType::Complete, ConditionType::Failed];
        let said = status.conditions.iter().find(|c| last.iter().any(|t| t.of(c)) && c.status == "True");
        let message = said.map(|c| c.message.clone()).unwrap_or_default();
        if let Some(body) = seen::finished(w, p, &message, now) {
            api.patch_status(&name, &apply(FINISHED_MANAGER), &Patch::Apply(&body)).await?;
        }
        if let Some(body) = seen::release_finalizer(w) {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
        return Ok(());
    }
    if let Some(body) = seen::activation(job, w) {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        tracing::info!(job = %job.name_any(), workload = %name, suspend = job.spec.suspend, "Workload (de)activated");
    }
    match &reading.seen {
        Seen::Admitted { .. } => {
            if let Some(body) = seen::pods_ready(w, phase, now) {
                api.patch_status(&name, &apply(PODS_READY_MANAGER), &Patch::Apply(&body)).await?;
            }
        }
        Seen::Evicted { .. } if holds == 0 && !cs2_pods_left(existing) => {
            if let Some(body) = seen::clear_reservation(w, now) {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
                tracing::info!(job = %job.name_any(), workload = %name, "evicted: reservation given back to Kueue");
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether any of the job's pods but MemoryX's (which holds no CS-2) still exists.
fn cs2_pods_left(existing: &[Pod]) -> bool {
    existing.iter().any(|p| {
        p.labels().get(crds::contract::ROLE_LABEL).map(String::as_str) != Some(crds::contract::Role::Memoryx.as_str())
    })
}

/// Lets go of the Workloads of the deleted job `uid` in `ns`: Kueue's finalizer removed, then deleted (their
/// owner reference would have the garbage collector do it too, once the finalizer is gone).
pub async fn forget(client: &Client, ns: &str, uid: &str) -> Result<(), Error> {
    let api: Api<Workload> = Api::namespaced(client.clone(), ns);
    let listed = match api.list(&ListParams::default().labels(&format!("{JOB_UID_LABEL}={uid}"))).await {
        Ok(l) => l.items,
        // Kueue is not installed (404), or the chart grants no Workloads (403, an older chart): nothing the
        // operator made to let go of, and the job's deletion must not wait on it.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for w in listed {
        if let Some(body) = seen::release_finalizer(&w) {
            api.patch(&w.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
        match api.delete(&w.name_any(), &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
