//! The SwarmX tree's pods, root first, as the plan lays the tree out.

use crds::TrainingJob;
use crds::contract::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::pod;
use crate::Error;
use crate::children::container::container;
use crate::children::names;
use crate::children::pod_security::restricted_pod;
use crate::children::settings::Settings;
use crate::children::site::ClusterSite;
use crate::children::volumes::role_volumes;

/// The SwarmX tree's pods, root first, as the plan lays the tree out: each broadcasts what its parent sends to
/// its children and sums what they return.
pub(crate) fn swarmx_pods(
    job: &TrainingJob,
    settings: &Settings,
    plan: &Plan,
    config: &str,
) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    plan.swarmx
        .nodes()
        .map(|node| {
            let c = container(
                job,
                settings,
                &Wiring::of(plan).swarmx(&ClusterSite::of(job), node),
                job.spec.resources.swarmx.clone(),
                vec![],
            );
            let spec = restricted_pod(vec![c], role_volumes(job));
            pod(
                job,
                names::swarmx(&name, node.level, node.index),
                Role::Swarmx,
                names::swarmx_service(&name),
                spec,
                config,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crds::contract::{Role, SwarmxArgs};
    use kube::ResourceExt;

    use crate::children::names;
    use crate::children::plan::plan;
    use crate::children::testing::{build, job, parse, role_pods, settings};

    #[test]
    fn the_pods_follow_the_plans_tree() {
        let j = job(8);
        let d = build(&j, &settings(false), 8);
        let (plan, _) = plan(&j, 8, 2).unwrap();
        assert_eq!(plan.swarmx.depth(), 3);
        let names: Vec<String> = role_pods(&d, Role::Swarmx).iter().map(|p| p.name_any()).collect();
        let want: Vec<String> = plan.swarmx.nodes().map(|n| names::swarmx("mnist", n.level, n.index)).collect();
        assert_eq!(names, want);
        assert_eq!(d.plan.swarmx.nodes, want);
        for (pod, node) in role_pods(&d, Role::Swarmx).iter().zip(plan.swarmx.nodes()) {
            let a: SwarmxArgs = parse(&pod.spec.as_ref().unwrap().containers[0]);
            assert_eq!(a.children.len(), node.children.len());
        }
    }
}
