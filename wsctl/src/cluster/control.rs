//! `wsctl cancel`, `suspend` and `resume`: the user's levers on a job, each a single API call followed by a
//! bounded wait for the operator to act on it, so the command returns when the change has happened.

use std::time::Duration;

use crds::Phase;
use kube::api::{DeleteParams, Patch, PatchParams};

use super::{Cluster, Error, progress, watch};

/// Deletes the job (its finalizer makes the operator remove the children) and, with a deadline, waits for it
/// to be gone.
pub async fn cancel(cluster: &Cluster, name: &str, wait: Option<Duration>) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let action = format!("delete TrainingJob {ns}/{name}");
    cluster.jobs().delete(name, &DeleteParams::default()).await.map_err(Error::api(action, ns, name))?;
    println!("trainingjob {ns}/{name} deletion requested");
    let Some(timeout) = wait else { return Ok(()) };
    let what = format!("TrainingJob {ns}/{name} and its children to be removed");
    watch::until(cluster, name, timeout, &what, |job| job.is_none().then_some(Ok(()))).await?;
    println!("trainingjob {ns}/{name} deleted");
    Ok(())
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
