//! One engine pod per CS-2, which requests a CS-2 when nodes advertise them.

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::Role;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::pod;
use crate::Error;
use crate::children::container::{container, memory_request};
use crate::children::names;
use crate::children::placement;
use crate::children::pod_security::restricted_pod;
use crate::children::settings::Settings;
use crate::children::site::ClusterSite;
use crate::children::volumes::volumes_of;

/// The extended resource a node advertises for each CS-2 it is attached to.
pub const CS2_RESOURCE: &str = "weightstream.dev/cs2";

/// One engine pod per CS-2, named by index so a replacement keeps its identity. It requests one
/// `weightstream.dev/cs2` when nodes advertise that resource, so the scheduler places it on a CS-2's host.
pub(crate) fn engine_pods(
    job: &TrainingJob,
    settings: &Settings,
    plan: &Plan,
    config: &str,
) -> Result<Vec<Pod>, Error> {
    let cs2 = plan.cs2;
    // An engine holds its SRAM's worth at most, and a pipelined one MemoryX's state besides (its replica).
    let replica = if plan.execution_mode == crds::ExecutionMode::Pipelined { plan.memoryx_bytes } else { 0 };
    let default = memory_request(plan.peak_engine_bytes + replica);
    let name = job.name_any();
    (0..cs2)
        .map(|i| {
            let mut resources = job.spec.resources.engine.clone().or_else(|| default.clone()).unwrap_or_default();
            if settings.request_cs2 {
                let one = Quantity("1".into());
                resources.limits.get_or_insert_with(BTreeMap::new).insert(CS2_RESOURCE.into(), one.clone());
                resources.requests.get_or_insert_with(BTreeMap::new).insert(CS2_RESOURCE.into(), one);
            }
            let resources = (resources != ResourceRequirements::default()).then_some(resources);
            let (volumes, mounts) = volumes_of(job, plan, Role::Engine);
            let c = container(job, settings, &Wiring::of(plan).engine(&ClusterSite::of(job), i), resources, mounts);
            let mut spec = restricted_pod(vec![c], volumes);
            spec.topology_spread_constraints = Some(placement::spread(&name, Role::Engine));
            pod(job, names::engine(&name, i), Role::Engine, names::engine_service(&name), spec, config)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::contract::EngineArgs;

    use crate::children::testing::{build, job, parse, role_pods, settings};

    #[test]
    fn engines_are_named_by_index_and_find_their_config() {
        let j = job(4);
        let pods = role_pods(&build(&j, &settings(false), 4), Role::Engine);
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["mnist-engine-0", "mnist-engine-1", "mnist-engine-2", "mnist-engine-3"]);
        let a: EngineArgs = parse(&pods[2].spec.as_ref().unwrap().containers[0]);
        assert_eq!((a.index, a.common.job.display().to_string()), (2, "/etc/weightstream/job.yaml".to_string()));
        let spec = pods[2].spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("mnist-engine-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("mnist-engine"));
        assert_eq!(spec.containers[0].command.as_ref().unwrap(), &["sim-wse"]);
        let r = spec.containers[0].resources.clone().expect("a memory request from the plan");
        assert!(
            r.requests.as_ref().is_some_and(|q| q.contains_key("memory") && !q.contains_key(CS2_RESOURCE)),
            "no cs2 request when no node advertises it"
        );
        assert!(r.limits.is_none());
    }

    #[test]
    fn engines_request_a_cs2_only_when_nodes_advertise_it() {
        let pods = role_pods(&build(&job(2), &settings(true), 2), Role::Engine);
        let r = pods[0].spec.as_ref().unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()[CS2_RESOURCE], Quantity("1".into()));
        assert_eq!(r.requests.unwrap()[CS2_RESOURCE], Quantity("1".into()));
    }
}
