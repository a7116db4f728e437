//! Everything a job's appliance consists of at one CS-2 count, built once per reconcile pass from one plan.

use crds::{PlanStatus, TrainingJob};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::config_map::config_map;
use super::hash::fnv;
use super::memoryx::memoryx;
use super::network_policy::network_policy;
use super::plan::plan;
use super::pods::engine::engine_pods;
use super::pods::input::input_pods;
use super::pods::swarmx::swarmx_pods;
use super::services::services;
use super::settings::Settings;
use crate::Error;

/// Everything a job's appliance consists of at one CS-2 count, built once per reconcile pass from one plan:
/// what the pass applies and what it compares the existing pods with.
#[derive(Clone, Debug)]
pub struct Desired {
    /// The plan the objects were built from, as the status shows it.
    pub plan: PlanStatus,
    /// `job.yaml` for the data plane.
    pub config: ConfigMap,
    /// The headless Services of MemoryX, SwarmX and the engines.
    pub services: Vec<Service>,
    /// MemoryX's StatefulSet.
    pub memoryx: StatefulSet,
    /// The SwarmX tree's pods (root first), then one engine pod per CS-2, then the input workers.
    pub pods: Vec<Pod>,
    /// Who may reach the job's pods, and whom they may reach.
    pub network_policy: NetworkPolicy,
}

/// Builds the job's whole appliance for `cs2` CS-2s (the allocated count), or says why the plan refuses it.
pub fn desired(job: &TrainingJob, settings: &Settings, cs2: u32) -> Result<Desired, Error> {
    let (plan, status) = plan(job, cs2, settings.fan_out)?;
    let config = config_map(job, cs2)?;
    let config_hash = fnv(&serde_json::to_vec(&config.data).map_err(|e| Error::Serialize(e.to_string()))?);
    let mut pods = swarmx_pods(job, settings, &plan, &config_hash)?;
    pods.extend(engine_pods(job, settings, &plan, &config_hash)?);
    pods.extend(input_pods(job, settings, &plan, &config_hash)?);
    Ok(Desired {
        plan: status,
        memoryx: memoryx(job, settings, &plan, &config_hash)?,
        services: services(job)?,
        network_policy: network_policy(job, &settings.operator)?,
        config,
        pods,
    })
}

#[cfg(test)]
mod tests {
    use crds::contract::{EngineArgs, HTTP_PORT, InputArgs, MemoryxArgs, Role, SwarmxArgs};

    use crate::children::site::grpc_port;
    use crate::children::testing::{build, containers, engine_args, input_args, job, memoryx_args, parse, settings};

    #[test]
    fn every_argv_the_operator_builds_parses_with_the_programs_parsers() {
        let j = job(4);
        for n in [1, 4] {
            let d = build(&j, &settings(true), n);
            let all = containers(&d);
            // MemoryX, the tree, an engine per CS-2 and its input worker.
            assert_eq!(all.len(), 1 + d.plan.swarmx.nodes.len() + 2 * n as usize);
            for c in &all {
                let program = c.command.as_ref().unwrap()[0].as_str();
                let role = Role::ALL.into_iter().find(|r| r.binary() == program).expect("a role's program");
                let http = match role {
                    Role::Memoryx => {
                        let a: MemoryxArgs = parse(c);
                        assert_eq!(a, memoryx_args(&j, n));
                        a.common.http
                    }
                    Role::Swarmx => {
                        let a: SwarmxArgs = parse(c);
                        assert_eq!(a.listen.port(), grpc_port(Role::Swarmx));
                        a.common.http
                    }
                    Role::Engine => {
                        let a: EngineArgs = parse(c);
                        assert_eq!(a, engine_args(&j, a.index));
                        assert_eq!(a.inputs.len(), 1, "one input worker per CS-2 by default");
                        a.common.http
                    }
                    Role::Input => {
                        let a: InputArgs = parse(c);
                        assert_eq!(a, input_args(&j, a.index));
                        assert_eq!(a.data_root, None, "no volume, no data root");
                        a.common.http
                    }
                };
                assert_eq!(http.port(), HTTP_PORT, "the probe and the Service reach the port the program serves");
                let ports: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
                assert!(ports.contains(&i32::from(HTTP_PORT)));
            }
        }
    }
}
