//! `wsctl cancel`, `suspend` and `resume`: the user's levers on a job, each a single API call followed by a
//! bounded wait for the operator to act on it, so the command returns when the change has happened.

use std::time::Duration;

use crds::contract::{JOB_LABEL, JOB_UID_LABEL};
use crds::{Phase, RetainPolicy};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use super::{Cluster, Error, progress, watch};

/// Deletes the job (its finalizer makes the operator remove the children) and, with a deadline, waits for it
/// to be gone and then for its pods (what the operator deleted may still be terminating), so a job submitted
/// again under the same name right away starts clean. Its checkpoint claims are kept (`spec.checkpoint.retain:
/// Retain`, the default), and it says where and how to read or delete them; with `Delete` it waits for them to go
/// too.
pub async fn cancel(cluster: &Cluster, name: &str, wait: Option<Duration>) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let job = cluster.job(name).await?;
    let (retain, uid) = (job.spec.checkpoint.retain, job.uid().unwrap_or_default());
    let claims = claims_of(cluster, name, &uid).await?;
    let action = format!("delete TrainingJob {ns}/{name}");
    cluster.jobs().delete(name, &DeleteParams::default()).await.map_err(Error::api(action, ns, name))?;
    println!("trainingjob {ns}/{name} deletion requested");
    println!("{}", kept(ns, name, &uid, retain, &claims));
    let Some(timeout) = wait else { return Ok(()) };
    let started = tokio::time::Instant::now();
    let what = format!("TrainingJob {ns}/{name} and its children to be removed");
    watch::until(cluster, name, timeout, &what, |job| job.is_none().then_some(Ok(()))).await?;
    let claims_go = (retain == RetainPolicy::Delete).then_some(uid.as_str());
    children_gone(cluster, name, claims_go, started + timeout, &what).await?;
    println!("trainingjob {ns}/{name} deleted");
    Ok(())
}

/// The names of job `name`'s checkpoint claims (those labelled with its `uid`).
async fn claims_of(cluster: &Cluster, name: &str, uid: &str) -> Result<Vec<String>, Error> {
    let ns = &cluster.namespace;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let selector = ListParams::default().labels(&format!("{JOB_LABEL}={name},{JOB_UID_LABEL}={uid}"));
    let list = claims.list(&selector).await.map_err(Error::api(
        format!("list the volume claims of TrainingJob {ns}/{name}"),
        ns,
        name,
    ))?;
    Ok(list.items.iter().map(|c| c.name_any()).collect())
}

/// What a cancel keeps of job `name` (uid `uid`): its checkpoint claims under `Retain`, with how to read and
/// how to delete them; nothing under `Delete`.
pub fn kept(ns: &str, name: &str, uid: &str, retain: RetainPolicy, claims: &[String]) -> String {
    match (retain, claims) {
        (RetainPolicy::Delete, _) => "its checkpoints are deleted with it (spec.checkpoint.retain: Delete)".into(),
        (RetainPolicy::Retain, []) => "it wrote no checkpoint volume (it never ran): nothing is kept".into(),
        (RetainPolicy::Retain, claims) => format!(
            "checkpoints kept in claim {} (spec.checkpoint.retain: Retain): `wsctl checkpoint pull {name} -n {ns}` fetches \
             the newest; delete them with `kubectl delete pvc -n {ns} -l {JOB_UID_LABEL}={uid}`",
            claims.join(", ")
        ),
    }
}

/// Waits until no pod of job `name` is left (terminating ones included), nor, with `claims_of` (the job's uid),
/// a volume claim of that job, until `deadline`.
async fn children_gone(
    cluster: &Cluster,
    name: &str,
    claims_of: Option<&str>,
    deadline: tokio::time::Instant,
    what: &str,
) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let selector = ListParams::default().labels(&format!("{JOB_LABEL}={name}"));
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let started = tokio::time::Instant::now();
    loop {
        let list = |action: &str| Error::api(format!("list the {action} of TrainingJob {ns}/{name}"), ns, name);
        let mut left: Vec<String> = pods
            .list(&selector)
            .await
            .map_err(list("pods"))?
            .items
            .iter()
            .map(|p| format!("pod {}", p.name_any()))
            .collect();
        if let Some(uid) = claims_of {
            let theirs = ListParams::default().labels(&format!("{JOB_LABEL}={name},{JOB_UID_LABEL}={uid}"));
            let found = claims.list(&theirs).await.map_err(list("volume claims"))?.items;
            left.extend(found.iter().map(|c| format!("volume claim {}", c.name_any())));
        }
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
    cluster
        .jobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::api(action, &ns, name))?;
    println!("trainingjob {ns}/{name} {verb} requested");
    let Some(timeout) = wait else { return Ok(()) };
    let what = if suspend {
        format!("TrainingJob {ns}/{name} to be Suspended")
    } else {
        format!("TrainingJob {ns}/{name} to leave Suspended")
    };
    let job = watch::until(cluster, name, timeout, &what, |job| {
        let Some(job) = job else { return Some(Err(Error::Deleted { namespace: ns.clone(), name: name.into() })) };
        let phase = job.status.as_ref().and_then(|s| s.phase);
        match phase {
            Some(Phase::Failed) => Some(Err(Error::JobFailed {
                namespace: ns.clone(),
                name: name.into(),
                message: progress::failure(job),
            })),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cancel says which claims it keeps and the commands that read and delete them, or that it keeps none.
    #[test]
    fn cancel_says_what_it_keeps() {
        let claims = vec!["checkpoints-u1-mnist-memoryx-0".to_string(), "checkpoints-u1-mnist-memoryx-1".to_string()];
        let kept_two = kept("ml", "mnist", "u1", RetainPolicy::Retain, &claims);
        for part in [
            "checkpoints-u1-mnist-memoryx-0, checkpoints-u1-mnist-memoryx-1",
            "wsctl checkpoint pull mnist -n ml",
            "kubectl delete pvc -n ml -l weightstream.dev/job-uid=u1",
        ] {
            assert!(kept_two.contains(part), "{kept_two}");
        }
        assert!(kept("ml", "mnist", "u1", RetainPolicy::Delete, &claims).contains("deleted with it"));
        assert!(kept("ml", "mnist", "u1", RetainPolicy::Retain, &[]).contains("nothing is kept"));
    }
}
