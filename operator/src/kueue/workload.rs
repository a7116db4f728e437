//! The Workload a job labelled for Kueue waits as, built from the appliance the plan gives it at `spec.cs2`: one
//! pod set per role (MemoryX's servers, the SwarmX tree, the engines, the input workers) with the pods' own
//! requests, the engines' set allowed down to `spec.minCs2` (partial admission), and the job's priority; and
//! the flavors of an admission put on the pods.

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::{ROLE_LABEL, Role};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::api::resourceflavors::ResourceFlavorSpec;
use super::api::workloads::{
    Workload, WorkloadPodSets, WorkloadPriorityClassRef, WorkloadPriorityClassRefGroup, WorkloadPriorityClassRefKind,
    WorkloadSpec,
};
use crate::Error;
use crate::children::desired::Desired;

/// The label that puts a job under Kueue: the LocalQueue it waits in.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label naming a job's `WorkloadPriorityClass`.
pub const PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// The Workload's label naming the job's uid, by which the operator finds a deleted job's Workloads.
pub const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// Kueue's finalizer on a Workload whose job may still hold quota; the job's controller removes it.
pub const RESOURCE_IN_USE: &str = "kueue.x-k8s.io/resource-in-use";
/// The longest name a Workload may have (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The LocalQueue `job` waits in, when Kueue admits it.
pub fn queue_of(job: &TrainingJob) -> Option<&str> {
    job.labels().get(QUEUE_LABEL).map(String::as_str).filter(|q| !q.is_empty())
}

/// The Workload's name, as Kueue's own job integrations name theirs: `trainingjob-<job>`, cut to fit, then the
/// first 5 hex digits of a SHA-1 of the job's kind, group, name and uid, so a namesake job gets another one.
pub fn name(job: &str, uid: &str) -> String {
    let kind = TrainingJob::kind(&());
    let group = TrainingJob::group(&());
    let hash = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{kind}\n{group}\n{job}\n{uid}").as_bytes(),
    );
    let hex: String = hash.as_ref().iter().take(3).map(|b| format!("{b:02x}")).collect();
    let mut prefix = format!("{}-{job}", kind.to_lowercase());
    prefix.truncate(MAX_NAME - 6);
    format!("{prefix}-{}", &hex[..5])
}

/// A job's priority as Kueue orders it: a `WorkloadPriorityClass` (the job's `kueue.x-k8s.io/priority-class`
/// label) or else its `spec.priorityClassName`, with the class's value.
#[derive(Clone, Debug, PartialEq)]
pub struct Priority {
    /// The class.
    pub class: WorkloadPriorityClassRef,
    /// Its value.
    pub value: i32,
}

impl Priority {
    /// A `WorkloadPriorityClass` of `value`.
    pub fn workload_class(name: &str, value: i32) -> Priority {
        let class = WorkloadPriorityClassRef {
            group: WorkloadPriorityClassRefGroup::KueueXK8sIo,
            kind: WorkloadPriorityClassRefKind::WorkloadPriorityClass,
            name: name.into(),
        };
        Priority { class, value }
    }

    /// A Kubernetes `PriorityClass` of `value`.
    pub fn pod_class(name: &str, value: i32) -> Priority {
        let class = WorkloadPriorityClassRef {
            group: WorkloadPriorityClassRefGroup::SchedulingK8sIo,
            kind: WorkloadPriorityClassRefKind::PriorityClass,
            name: name.into(),
        };
        Priority { class, value }
    }
}

/// The template of a pod set: the pod's spec and labels, without what belongs to one pod (name, owner).
fn template(labels: Option<BTreeMap<String, String>>, spec: Option<PodSpec>) -> PodTemplateSpec {
    PodTemplateSpec { metadata: Some(ObjectMeta { labels, ..Default::default() }), spec }
}

/// The Workload of `job`, whose appliance at `spec.cs2` is `desired`, owned by the job.
pub fn workload(job: &TrainingJob, desired: &Desired, priority: Option<Priority>) -> Result<Workload, Error> {
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let mut pod_sets = Vec::new();
    let sts = desired.memoryx.spec.as_ref().ok_or(Error::MissingField("MemoryX's StatefulSet spec"))?;
    pod_sets.push(WorkloadPodSets {
        name: Some(Role::Memoryx.as_str().into()),
        count: Some(sts.replicas.unwrap_or(1)),
        template: template(sts.template.metadata.as_ref().and_then(|m| m.labels.clone()), sts.template.spec.clone()),
        ..Default::default()
    });
    for role in [Role::Swarmx, Role::Engine, Role::Input] {
        let of_role: Vec<&Pod> = desired
            .pods
            .iter()
            .filter(|p| p.labels().get(ROLE_LABEL).map(String::as_str) == Some(role.as_str()))
            .collect();
        let Some(first) = of_role.first() else { continue };
        let count = i32::try_from(of_role.len()).map_err(|_| Error::Plan("too many pods for a Workload".into()))?;
        let min = job.spec.min_cs2() as i32;
        pod_sets.push(WorkloadPodSets {
            name: Some(role.as_str().into()),
            count: Some(count),
            min_count: (role == Role::Engine && min < count).then_some(min),
            template: template(first.metadata.labels.clone(), first.spec.clone()),
            ..Default::default()
        });
    }
    let mut labels = BTreeMap::from([(JOB_UID_LABEL.to_string(), uid.clone())]);
    labels.extend(crate::children::metadata::labels(&job.name_any(), None));
    Ok(Workload {
        metadata: ObjectMeta {
            name: Some(name(&job.name_any(), &uid)),
            namespace: job.namespace(),
            labels: Some(labels),
            finalizers: Some(vec![RESOURCE_IN_USE.into()]),
            owner_references: Some(vec![crate::children::metadata::owner(job)?]),
            ..Default::default()
        },
        spec: WorkloadSpec {
            queue_name: queue_of(job).map(str::to_string),
            pod_sets: Some(pod_sets),
            priority: priority.as_ref().map(|p| p.value),
            priority_class_ref: priority.map(|p| p.class),
            active: Some(true),
            ..Default::default()
        },
        status: None,
    })
}

/// Puts the flavors an admission assigned on the pods: each pod set's flavors (by role) add their node labels to
/// its pods' node selector and their tolerations to its pods' tolerations, MemoryX's template included.
pub fn place(desired: &mut Desired, flavors: &BTreeMap<String, Vec<ResourceFlavorSpec>>) {
    let put = |spec: &mut PodSpec, of: &[ResourceFlavorSpec]| {
        for f in of {
            if let Some(labels) = f.node_labels.as_ref().filter(|l| !l.is_empty()) {
                spec.node_selector.get_or_insert_default().extend(labels.clone());
            }
            let tolerations = spec.tolerations.get_or_insert_default();
            for t in f.tolerations.iter().flatten() {
                if !tolerations.contains(t) {
                    tolerations.push(t.clone());
                }
            }
        }
    };
    if let (Some(of), Some(spec)) =
        (flavors.get(Role::Memoryx.as_str()), desired.memoryx.spec.as_mut().and_then(|s| s.template.spec.as_mut()))
    {
        put(spec, of);
    }
    for pod in &mut desired.pods {
        let role = pod.labels().get(ROLE_LABEL).cloned().unwrap_or_default();
        if let (Some(of), Some(spec)) = (flavors.get(&role), pod.spec.as_mut()) {
            put(spec, of);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::testing::{build, job, settings};

    fn labelled(cs2: u32, min: Option<u32>) -> TrainingJob {
        let mut j = job(cs2);
        j.spec.min_cs2 = min;
        j.metadata.labels = Some(BTreeMap::from([(QUEUE_LABEL.into(), "team".into())]));
        j
    }

    /// Every role of the appliance is a pod set with its pods' count and requests; the engines' set may shrink
    /// to spec.minCs2; the Workload is the job's (owner, uid label, Kueue's finalizer) and waits in its queue.
    #[test]
    fn the_workload_has_a_pod_set_per_role_with_the_pods_requests() {
        let j = labelled(4, Some(2));
        let d = build(&j, &settings(true), 4);
        let w = workload(&j, &d, Some(Priority::pod_class("high", 1000))).unwrap();
        let pod_sets = w.spec.pod_sets.clone().unwrap();
        let sets: Vec<(&str, i32, Option<i32>)> =
            pod_sets.iter().map(|s| (s.name.as_deref().unwrap(), s.count.unwrap(), s.min_count)).collect();
        let engines = d.pods.iter().filter(|p| p.labels()[ROLE_LABEL] == "engine").count() as i32;
        assert_eq!(engines, 4);
        assert!(sets.contains(&("engine", 4, Some(2))), "{sets:?}");
        assert!(sets.iter().any(|s| s.0 == "memoryx") && sets.iter().any(|s| s.0 == "swarmx"), "{sets:?}");
        let engine = pod_sets.iter().find(|s| s.name.as_deref() == Some("engine")).unwrap();
        let pod = d.pods.iter().find(|p| p.labels()[ROLE_LABEL] == "engine").unwrap();
        let requests = |s: &PodSpec| s.containers[0].resources.clone().and_then(|r| r.requests);
        assert_eq!(requests(engine.template.spec.as_ref().unwrap()), requests(pod.spec.as_ref().unwrap()));
        assert_eq!(w.spec.queue_name.as_deref(), Some("team"));
        assert_eq!(
            (w.spec.priority, w.spec.priority_class_ref.unwrap().kind),
            (Some(1000), WorkloadPriorityClassRefKind::PriorityClass)
        );
        assert_eq!(w.metadata.finalizers, Some(vec![RESOURCE_IN_USE.to_string()]));
        assert_eq!(w.metadata.labels.unwrap()[JOB_UID_LABEL], j.uid().unwrap());
        assert_eq!(w.metadata.owner_references.unwrap()[0].controller, Some(true));
        // A job that cannot shrink asks for no partial admission.
        let w = workload(&labelled(2, None), &build(&labelled(2, None), &settings(true), 2), None).unwrap();
        assert!(w.spec.pod_sets.unwrap().iter().all(|s| s.min_count.is_none()));
        assert_eq!((w.spec.priority, w.spec.priority_class_ref), (None, None));
    }

    /// Kueue's naming: kind, name, 5 hex digits of the uid's hash; a long name is cut to a valid length.
    #[test]
    fn workload_names_follow_kueue_and_fit() {
        let n = name("gpt", "uid-1");
        assert!(n.starts_with("trainingjob-gpt-") && n.len() == "trainingjob-gpt-".len() + 5, "{n}");
        assert_ne!(n, name("gpt", "uid-2"));
        assert!(name(&"x".repeat(253), "u").len() <= MAX_NAME);
    }

    /// An admission's flavors reach the pods of their pod set: node labels into the selector, tolerations once.
    #[test]
    fn flavors_put_node_labels_and_tolerations_on_their_pod_sets() {
        let j = labelled(2, None);
        let mut d = build(&j, &settings(true), 2);
        let toleration = k8s_openapi::api::core::v1::Toleration {
            key: Some("weightstream.dev/cs2".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        let flavor = ResourceFlavorSpec {
            node_labels: Some(BTreeMap::from([("pool".to_string(), "cs2".to_string())])),
            tolerations: Some(vec![toleration.clone()]),
            ..Default::default()
        };
        let flavors = BTreeMap::from([("engine".to_string(), vec![flavor.clone(), flavor])]);
        place(&mut d, &flavors);
        for p in &d.pods {
            let spec = p.spec.as_ref().unwrap();
            let engine = p.labels()[ROLE_LABEL] == "engine";
            let selected =
                spec.node_selector.as_ref().is_some_and(|s| s.get("pool").map(String::as_str) == Some("cs2"));
            assert_eq!(selected, engine, "{}", p.name_any());
            if engine {
                assert_eq!(spec.tolerations.iter().flatten().filter(|t| **t == toleration).count(), 1);
            }
        }
    }
}
