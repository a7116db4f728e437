//! `wsctl cancel`, `suspend` and `resume`: the user's levers on a job, each a single API call followed by a
//! bounded wait for the operator to act on it, so the command returns when the change has happened.

use std::time::Duration;

use crds::Phase;
use kube::api::{DeleteParams, Patch, PatchParams};

use super::{Cluster, Error, progress, watch};

/// Deletes the job (its finalizer makes the operator remove the children) and, with a deadline, waits for it
/// to be gone and then for its pods and volumes (what the operator deleted may still be terminating), so a job
/// submitted again under the same name right away starts clean.
pub async fn cancel(cluster: &Cluster, name: &str, wait: Option<Duration>) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let action = format!("delete TrainingJob {ns}/{name}");
    cluster.jobs().delete(name, &DeleteParams::default()).await.map_err(Error::api(action, ns, name))?;
    println!("trainingjob {ns}/{name} deletion requested");
    let Some(timeout) = wait else { return Ok(()) };
    let started = tokio::time::Instant::now();
    let what = format!("TrainingJob {ns}/{name} and its children to be removed");
    watch::until(cluster, name, timeout, &what, |job| job.is_none().then_some(Ok(()))).await?;
    children_gone(cluster, name, started + timeout, &what).await?;
    println!("trainingjob {ns}/{name} deleted");
    Ok(())
}

/// Waits until no pod and no volume claim of job `name` is left (terminating ones included), until `deadline`.
async fn children_gone(cluster: &Cluster, name: &str, deadline: tokio::time::Instant, what: &str) -> Result<(), Error> {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::api::{Api, ListParams};
    use kube::ResourceExt;
    let ns = &cluster.namespace;
    let selector = ListParams::default().labels(&format!("{}={name}", crds::contract::JOB_LABEL));
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let started = tokio::time::Instant::now();
    loop {
        let list = |action: &str| Error::api(format!("list the {action} of TrainingJob {ns}/{name}"), ns, name);
        let left: Vec<String> = pods
            .list(&selector)
            .await
            .map_err(list("pods"))?
            .items
            .iter()
            .map(|p| format!("pod {}", p.name_any()))
            .chain(claims.list(&selector).await.map_err(list("volume claims"))?.items.iter().map(|c| format!("volume claim {}", c.name_any())))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let last = Some(format!("still there: {}", left.join(", ")));
            return Err(Error::Timeout { after: started.elapsed(), what: what.into(), last });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sets `spec.suspend` to `suspend` and, with a deadline, waits until the status agrees: Suspended (the
/// checkpoint is written and the CS-2s are free), or for a resume, any phase but Suspended.
pub async fn suspend(cluster: &Cluster, name: &str, suspend: bool, wait: Option<Duration>) -> Result<(), Error> {
    let ns = cluster.namespace.clone();
    let job = cluster.job(name).await?;
    let verb = if suspend { "suspend" } else { "resume" };
    if let Some(p) = job.status.as_ref().and_then(|s| s.phase).filter(|p| p.is_terminal()) {
        return Err(Error::Invalid(format!("TrainingJob {ns}/{name} has {p}: there is nothing to {verb}")));
    }
    let patch = serde_json::json!({ "spec": { "suspend": suspend } });
    let action = format!("{verb} TrainingJob {ns}/{name}");
    cluster.jobs().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(Error::api(action, &ns, name))?;
    println!("trainingjob {ns}/{name} {verb} requested");
    let Some(timeout) = wait else { return Ok(()) };
    let what = if suspend { format!("TrainingJob {ns}/{name} to be Suspended") } else { format!("TrainingJob {ns}/{name} to leave Suspended") };
    let job = watch::until(cluster, name, timeout, &what, |job| {
        let Some(job) = job else { return Some(Err(Error::Deleted { namespace: ns.clone(), name: name.into() })) };
        let phase = job.status.as_ref().and_then(|s| s.phase);
        match phase {
            Some(Phase::Failed) => {
                Some(Err(Error::JobFailed { namespace: ns.clone(), name: name.into(), message: progress::failure(job) }))
            }
            Some(Phase::Suspended) if suspend => Some(Ok(job.clone())),
            // The operator has seen the resume once the phase moves on from Suspended.
            Some(p) if !suspend && p != Phase::Suspended => Some(Ok(job.clone())),
            Some(Phase::Succeeded) => Some(Ok(job.clone())),
            _ => None,
        }
    })
    .await?;
    println!("{name}: {}", progress::line(&job));
    Ok(())
}
