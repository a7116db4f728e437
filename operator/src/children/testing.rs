//! Fixtures for the children's tests: a job, the operator's settings, its appliance built, and what each role's
//! container argv parses to with the program's own parser.

use crds::TrainingJob;
use crds::contract::{EngineArgs, InputArgs, MemoryxArgs, ROLE_LABEL, Role, RoleArgs};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::desired::{Desired, desired};
use super::memoryx::CONFIG_HASH_ANNOTATION;
use super::plan::plan;
use super::settings::{OperatorPeer, Settings};
use super::site::ClusterSite;

/// The MNIST MLP job `mnist` in namespace `ml` on `cs2` CS-2s, with a uid as the API server gives it.
pub(crate) fn job(cs2: u32) -> TrainingJob {
    let mut j = crds::testing::mlp_job("mnist", "ml", cs2);
    j.metadata.uid = Some("1234-abcd".into());
    j
}

/// The operator's settings, with engines requesting a CS-2 when `request_cs2`.
pub(crate) fn settings(request_cs2: bool) -> Settings {
    Settings {
        default_image: "weightstream/runtime:0.1.0".into(),
        fan_out: 2,
        request_cs2,
        operator: OperatorPeer::default(),
    }
}

/// The appliance of `j` on `n` CS-2s.
pub(crate) fn build(j: &TrainingJob, s: &Settings, n: u32) -> Desired {
    desired(j, s, n).unwrap()
}

/// The pods of `role` among the appliance's.
pub(crate) fn role_pods(d: &Desired, role: Role) -> Vec<Pod> {
    d.pods.iter().filter(|p| p.labels()[ROLE_LABEL] == role.as_str()).cloned().collect()
}

/// Every container of the appliance, MemoryX's first.
pub(crate) fn containers(d: &Desired) -> Vec<Container> {
    let sts = d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers.clone();
    sts.into_iter().chain(d.pods.iter().flat_map(|p| p.spec.as_ref().unwrap().containers.clone())).collect()
}

/// The plan of `j` as the operator makes it (its CS-2s, a fan-out of 2).
pub(crate) fn plan_of(j: &TrainingJob) -> Plan {
    plan_at(j, j.spec.cs2)
}

/// The plan of `j` on `cs2` allocated CS-2s.
pub(crate) fn plan_at(j: &TrainingJob, cs2: u32) -> Plan {
    plan(j, cs2, 2).expect("a plan").0
}

/// MemoryX's arguments as the operator wires `j` on `cs2` allocated CS-2s (one has no SwarmX tree).
pub(crate) fn memoryx_args(j: &TrainingJob, cs2: u32) -> MemoryxArgs {
    super::memoryx::memoryx_args(j, &plan_at(j, cs2))
}

/// Engine `index`'s arguments as the operator wires `j`.
pub(crate) fn engine_args(j: &TrainingJob, index: u32) -> EngineArgs {
    Wiring::of(&plan_of(j)).engine(&ClusterSite::of(j), index)
}

/// Input worker `index`'s arguments as the operator wires `j`.
pub(crate) fn input_args(j: &TrainingJob, index: u32) -> InputArgs {
    Wiring::of(&plan_of(j)).input(&ClusterSite::of(j), index)
}

/// Parses a container's argv with the parser of the program it runs.
pub(crate) fn parse<A: RoleArgs>(c: &Container) -> A {
    let argv = std::iter::once(c.command.as_ref().unwrap()[0].clone()).chain(c.args.clone().unwrap());
    A::try_parse_from(argv).unwrap_or_else(|e| panic!("{} does not parse {:?}: {e}", A::ROLE.binary(), c.args))
}

/// The configuration hash on MemoryX's pod template of `j` on `n` CS-2s.
pub(crate) fn config_hash(j: &TrainingJob, n: u32) -> String {
    let sts = build(j, &settings(false), n).memoryx;
    sts.spec.unwrap().template.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
}
