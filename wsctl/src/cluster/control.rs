//! `wsctl cancel`, `suspend`, `resume`, `set-priority` and `label`: the user's levers on a job, each a single API
//! call (the first three followed by a bounded wait for the operator to act on it, so the command returns when
//! the change has happened).

use std::time::Duration;

use crds::contract::{JOB_LABEL, JOB_UID_LABEL};
use crds::{Phase, RetainPolicy};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
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

/// Sets `spec.priorityClassName` to `class`, which orders the operator's queue (and, with preemption allowed,
/// decides whom a waiting job may preempt). The class must exist; when the user may not read PriorityClasses
/// the operator's own check (`PriorityClassNotFound`) stands in.
pub async fn set_priority(cluster: &Cluster, name: &str, class: &str) -> Result<(), Error> {
    let ns = &cluster.namespace;
    if !crds::is_dns_subdomain(class) {
        return Err(Error::Invalid(format!(
            "'{class}' is not a PriorityClass name (lowercase letters, digits, '-' and '.'): `kubectl get \
             priorityclasses` lists those there are"
        )));
    }
    let job = cluster.job(name).await?;
    if let Some(p) = job.status.as_ref().and_then(|s| s.phase).filter(|p| p.is_terminal()) {
        return Err(Error::Invalid(format!("TrainingJob {ns}/{name} has {p}: its priority no longer matters")));
    }
    let classes: Api<PriorityClass> = Api::all(cluster.client.clone());
    let value = match classes.get_opt(class).await {
        Ok(Some(c)) => Some(c.value),
        Ok(None) => {
            return Err(Error::Invalid(format!(
                "PriorityClass '{class}' does not exist: `kubectl get priorityclasses` lists those there are"
            )));
        }
        Err(kube::Error::Api(s)) if s.code == 403 => None,
        Err(e) => return Err(Error::other(format!("read PriorityClass {class}"))(e)),
    };
    let patch = serde_json::json!({ "spec": { "priorityClassName": class } });
    let action = format!("set the priority of TrainingJob {ns}/{name}");
    cluster
        .jobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::api(action, ns, name))?;
    match value {
        Some(v) => println!("trainingjob {ns}/{name} priorityClassName set to {class} (value {v})"),
        None => {
            println!("trainingjob {ns}/{name} priorityClassName set to {class} (the operator checks that it exists)")
        }
    }
    Ok(())
}

/// What `wsctl label` does to one label: `KEY=VALUE` sets it, `KEY-` removes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelChange {
    /// Set `key` to `value`.
    Set(String, String),
    /// Remove `key`.
    Remove(String),
}

impl std::str::FromStr for LabelChange {
    type Err = String;

    fn from_str(s: &str) -> Result<LabelChange, String> {
        let bad = || format!("'{s}' is not a label change: write KEY=VALUE to set a label, KEY- to remove one");
        match s.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok(LabelChange::Set(k.into(), v.into())),
            Some(_) => Err(bad()),
            None => {
                s.strip_suffix('-').filter(|k| !k.is_empty()).map(|k| LabelChange::Remove(k.into())).ok_or_else(bad)
            }
        }
    }
}

/// The merge patch of `metadata.labels` that `changes` make to a job labelled `current`: a label it has is
/// changed only with `overwrite`, as kubectl does.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    changes: &[LabelChange],
    overwrite: bool,
) -> Result<serde_json::Value, String> {
    let mut labels = serde_json::Map::new();
    for c in changes {
        match c {
            LabelChange::Set(k, v) => {
                if let Some(old) = current.get(k).filter(|old| *old != v && !overwrite) {
                    return Err(format!("it has {k}={old} already: --overwrite replaces it"));
                }
                labels.insert(k.clone(), serde_json::Value::String(v.clone()));
            }
            LabelChange::Remove(k) => {
                labels.insert(k.clone(), serde_json::Value::Null);
            }
        }
    }
    Ok(serde_json::json!({ "metadata": { "labels": labels } }))
}

/// Sets or removes labels on job `name` (the API server checks their syntax). A label such as
/// `kueue.x-k8s.io/queue-name` is how a job is put under a queue of a cluster's own.
pub async fn label(cluster: &Cluster, name: &str, changes: &[LabelChange], overwrite: bool) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let job = cluster.job(name).await?;
    let patch = label_patch(job.labels(), changes, overwrite)
        .map_err(|why| Error::Invalid(format!("TrainingJob {ns}/{name}: {why}")))?;
    let action = format!("label TrainingJob {ns}/{name}");
    cluster
        .jobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::api(action, ns, name))?;
    println!("trainingjob {ns}/{name} labeled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label changes parse as kubectl writes them; a label the job has changes only with --overwrite; removals
    /// are nulls in the merge patch.
    #[test]
    fn label_changes_parse_and_patch_as_kubectl_does() {
        let set: LabelChange = "team=ml".parse().unwrap();
        let empty: LabelChange = "tier=".parse().unwrap();
        let gone: LabelChange = "old-".parse().unwrap();
        assert_eq!(set, LabelChange::Set("team".into(), "ml".into()));
        assert_eq!(empty, LabelChange::Set("tier".into(), String::new()));
        assert_eq!(gone, LabelChange::Remove("old".into()));
        for bad in ["team", "=ml", "-", ""] {
            let e = bad.parse::<LabelChange>().unwrap_err();
            assert!(e.contains("KEY=VALUE") && e.contains(&format!("'{bad}'")), "{e}");
        }
        let current: BTreeMap<String, String> = [("team".to_string(), "web".to_string())].into();
        let e = label_patch(&current, std::slice::from_ref(&set), false).unwrap_err();
        assert!(e.contains("team=web already") && e.contains("--overwrite"), "{e}");
        let p = label_patch(&current, &[set.clone(), gone.clone()], true).unwrap();
        assert_eq!(p, serde_json::json!({ "metadata": { "labels": { "team": "ml", "old": null } } }));
        // Setting the value it has already is no change, and needs no --overwrite.
        let same: LabelChange = "team=web".parse().unwrap();
        assert!(label_patch(&current, &[same], false).is_ok());
    }

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
