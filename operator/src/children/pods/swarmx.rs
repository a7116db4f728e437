//! The SwarmX tree's pods, root first, as the plan lays the tree out.

use crds::TrainingJob;
use crds::contract::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::pod;
use crate::Error;
use crate::children::container::{container, memory_request};
use crate::children::names;
use crate::children::pod_security::restricted_pod;
use crate::children::settings::Settings;
use crate::children::site::ClusterSite;
use crate::children::volumes::role_volumes;

/// The SwarmX tree's pods, root first, as the plan lays the tree out: each broadcasts what its parent sends to
/// its children and sums what they return. When the root streams straight from the weight servers
/// ([`plan::memoryx::streams_from_servers`]) it holds the layers in transit the coordinator would otherwise
/// hold, and its default memory request says so.
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
            let streams = node.level == 0 && plan::memoryx::streams_from_servers(plan.memoryx.servers, plan.cs2);
            let default = streams.then(|| memory_request(plan.coordinator_transit_bytes)).flatten();
            let c = container(
                job,
                settings,
                &Wiring::of(plan).swarmx(&ClusterSite::of(job), node),
                job.spec.resources.swarmx.clone().or(default),
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

    /// With weight servers besides the coordinator, the root streams straight from them: it reserves the
    /// layers in transit, and the other nodes nothing of their own.
    #[test]
    fn a_root_streaming_from_the_servers_reserves_the_layers_in_transit() {
        let requested = |d: &crate::children::desired::Desired| -> Vec<Option<String>> {
            role_pods(d, Role::Swarmx)
                .iter()
                .map(|p| {
                    let r = p.spec.as_ref().unwrap().containers[0].resources.clone();
                    r.and_then(|r| r.requests).map(|q| q["memory"].0.clone())
                })
                .collect()
        };
        let mut j = job(4);
        assert!(requested(&build(&j, &settings(false), 4)).iter().all(Option::is_none), "one server: no transit");
        j.spec.memoryx.servers = Some(2);
        let d = build(&j, &settings(false), 4);
        let (plan, _) = plan(&j, 4, 2).unwrap();
        let mib = (plan.coordinator_transit_bytes + (128 << 20)).div_ceil(1 << 20);
        let got = requested(&d);
        assert_eq!(got[0], Some(format!("{mib}Mi")), "the root");
        assert!(got[1..].iter().all(Option::is_none), "{got:?}");
    }
}
