//! The pods the operator manages itself (the SwarmX tree, the engines, the input workers), one module per role,
//! and what they share: named for their place so a replacement takes it, never restarted in place, and
//! annotated with the hash of their spec and configuration so a change replaces them.

pub mod engine;
pub mod input;
pub mod swarmx;

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::Role;
use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::hash::{fnv, spec_hash};
use super::metadata::meta;
use crate::Error;

/// Annotation holding a hash of a pod's desired spec and of the configuration it reads at start: pods are
/// immutable, so a pod whose hash differs from the desired one (a rescaled tree, a new image, a new CS-2 count
/// in `job.yaml`) is replaced rather than patched.
pub const SPEC_HASH_ANNOTATION: &str = "weightstream.dev/spec-hash";

/// How long a process the kubelet stops has before it is killed, when it has nothing to save: a frozen process
/// cannot use a grace period, and a live one exits at once.
pub(crate) const STATELESS_GRACE_SECONDS: i64 = 2;

/// A pod of `role` named `name`, found through `service`, from its `spec`, annotated with the hash of the spec
/// and of the `config` hash it reads at start.
pub(crate) fn pod(
    job: &TrainingJob,
    name: String,
    role: Role,
    service: String,
    spec: PodSpec,
    config: &str,
) -> Result<Pod, Error> {
    let mut spec = spec;
    spec.hostname = Some(name.clone());
    spec.subdomain = Some(service);
    // A failed pod is replaced by the operator (same name, same DNS), which counts it against restartLimit.
    spec.restart_policy = Some("Never".into());
    // With nothing to restart, the kubelet kills a pod whose liveness probe fails as a whole, with the pod's
    // grace period rather than the probe's: left at the default, a frozen engine would hold its replacement
    // back 30 s. These roles keep no state a stop could save (MemoryX checkpoints) and exit on SIGTERM.
    spec.termination_grace_period_seconds = Some(STATELESS_GRACE_SECONDS);
    // The scheduler (preemption) and priority-scoped quotas see the priority admission ordered the job by.
    spec.priority_class_name.clone_from(&job.spec.priority_class_name);
    let hash = fnv(format!("{}/{config}", spec_hash(&spec)?).as_bytes());
    let mut m = meta(job, name, Some(role))?;
    m.annotations = Some(BTreeMap::from([(SPEC_HASH_ANNOTATION.to_string(), hash)]));
    Ok(Pod { metadata: m, spec: Some(spec), ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::testing::{build, config_hash, job, role_pods, settings};

    #[test]
    fn a_changed_tree_changes_the_pod_hash() {
        let j = job(4);
        let s = settings(false);
        let root = |n| role_pods(&build(&j, &s, n), Role::Swarmx)[0].clone();
        let h = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH_ANNOTATION].clone();
        assert_ne!(h(&root(4)), h(&root(2)));
        assert_eq!(h(&root(4)), h(&root(4)));
    }

    #[test]
    fn a_new_cs2_count_replaces_every_pod_and_restarts_memoryx() {
        // Engine 0's own spec is the same at 2 and 4 engines, but its shard (from job.yaml) is not.
        let j = job(4);
        let s = settings(false);
        let h = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH_ANNOTATION].clone();
        let engine0 = |n| role_pods(&build(&j, &s, n), Role::Engine)[0].clone();
        assert_ne!(h(&engine0(4)), h(&engine0(2)));
        assert_ne!(config_hash(&j, 4), config_hash(&j, 2));
        assert_eq!(config_hash(&j, 4), config_hash(&j, 4));
    }
}
