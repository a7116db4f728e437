//! Where the scheduler should put a job's pods on a cluster of several nodes: engines spread over the nodes
//! (a node lost takes as few CS-2s of the job as can be), MemoryX's weight servers apart from each other (a node
//! lost takes one slice of the weights, and each server has a node's memory and network link to itself). Both
//! are preferences: a single node, or a pool that fits only one way, still runs the job.

use crds::contract::Role;
use k8s_openapi::api::core::v1::WeightedPodAffinityTerm;
use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodAntiAffinity, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::metadata::labels;

/// The node label the spreading counts by: one domain per node.
pub const NODE_TOPOLOGY: &str = "kubernetes.io/hostname";

/// The pods of `role` of job `job`, as the constraints select them.
fn selector(job: &str, role: Role) -> LabelSelector {
    LabelSelector { match_labels: Some(labels(job, Some(role))), ..Default::default() }
}

/// Spread `role`'s pods of `job` evenly over the nodes (at most one more on any node than on another that
/// could take it), preferring an uneven placement to none.
pub(crate) fn spread(job: &str, role: Role) -> Vec<TopologySpreadConstraint> {
    vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: NODE_TOPOLOGY.into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(selector(job, role)),
        ..Default::default()
    }]
}

/// Keep `role`'s pods of `job` on different nodes when there are nodes enough, else share.
pub(crate) fn apart(job: &str, role: Role) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: PodAffinityTerm {
                    label_selector: Some(selector(job, role)),
                    topology_key: NODE_TOPOLOGY.into(),
                    ..Default::default()
                },
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use crds::contract::{JOB_LABEL, ROLE_LABEL};

    use crate::children::testing::{build, job, role_pods, settings};

    use super::*;

    /// Engines spread over nodes and weight servers keep apart, each counting only its own job's pods of its
    /// role, and neither ever forbids a placement.
    #[test]
    fn engines_spread_and_weight_servers_keep_apart_by_preference() {
        let mut j = job(4);
        j.spec.memoryx.servers = Some(3);
        let d = build(&j, &settings(true), 4);
        let name = j.metadata.name.clone().unwrap_or_default();
        let engines = role_pods(&d, Role::Engine);
        assert_eq!(engines.len(), 4);
        for p in &engines {
            let c = &p.spec.as_ref().unwrap().topology_spread_constraints.as_ref().unwrap()[0];
            let how = (c.max_skew, c.topology_key.as_str(), c.when_unsatisfiable.as_str());
            assert_eq!(how, (1, NODE_TOPOLOGY, "ScheduleAnyway"));
            let sel = c.label_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
            assert_eq!((&sel[JOB_LABEL], sel[ROLE_LABEL].as_str()), (&name, "engine"));
        }
        let template = d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let anti = template.affinity.as_ref().unwrap().pod_anti_affinity.as_ref().unwrap();
        assert!(anti.required_during_scheduling_ignored_during_execution.is_none(), "a preference, not a rule");
        let term = &anti.preferred_during_scheduling_ignored_during_execution.as_ref().unwrap()[0].pod_affinity_term;
        assert_eq!(term.topology_key, NODE_TOPOLOGY);
        let sel = term.label_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
        assert_eq!((&sel[JOB_LABEL], sel[ROLE_LABEL].as_str()), (&name, "memoryx"));
    }
}
