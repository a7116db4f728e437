//! The metadata every child carries: the labels by which the operator, `wsctl` and the NetworkPolicy find a
//! job's objects, and the owner reference that makes the job their controller.

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::{JOB_LABEL, ROLE_LABEL, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::Error;

/// The labels of job `job`'s children (and of `role`'s pods): what the operator, `wsctl`, the Services and the
/// NetworkPolicy select them by.
pub(crate) fn labels(job: &str, role: Option<Role>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "weightstream".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "weightstream-operator".to_string()),
        (JOB_LABEL.to_string(), job.to_string()),
    ]);
    if let Some(role) = role {
        l.insert(ROLE_LABEL.to_string(), role.as_str().to_string());
    }
    l
}

/// The job as its children's controlling owner.
pub(crate) fn owner(job: &TrainingJob) -> Result<OwnerReference, Error> {
    let mut o = job.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))?;
    // Foreground deletion of the job waits for its children, and the garbage collector removes them.
    o.block_owner_deletion = Some(true);
    Ok(o)
}

/// The metadata of the child `name` of `job`: its namespace, labels and owner.
pub(crate) fn meta(job: &TrainingJob, name: String, role: Option<Role>) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: job.namespace(),
        labels: Some(labels(&job.name_any(), role)),
        owner_references: Some(vec![owner(job)?]),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use crds::contract::JOB_LABEL;

    use crate::children::testing::{build, job, settings};

    #[test]
    fn every_child_is_owned_by_the_job_with_blocking_deletion() {
        let d = build(&job(4), &settings(false), 4);
        let mut metas = vec![d.config.metadata.clone(), d.memoryx.metadata.clone(), d.network_policy.metadata.clone()];
        metas.extend(d.services.iter().map(|x| x.metadata.clone()));
        metas.extend(d.pods.iter().map(|x| x.metadata.clone()));
        assert_eq!(metas.len(), 3 + 4 + 3 + 4 + 4);
        for m in metas {
            let o = &m.owner_references.as_ref().unwrap()[0];
            assert_eq!((o.kind.as_str(), o.name.as_str(), o.uid.as_str()), ("TrainingJob", "mnist", "1234-abcd"));
            assert_eq!((o.controller, o.block_owner_deletion), (Some(true), Some(true)));
            assert_eq!(m.labels.unwrap()[JOB_LABEL], "mnist");
            assert_eq!(m.namespace.as_deref(), Some("ml"));
        }
    }
}
