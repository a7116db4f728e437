//! MemoryX: the StatefulSet of the plan's weight servers, each with a checkpoint volume of its own, and the
//! arguments they run with.

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::{MemoryxArgs, Role};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, PodTemplateSpec, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::checkpoints::{CHECKPOINT_DIR, claim_template, retention, volume_name};
use super::container::{container, memory_request};
use super::hash::spec_hash;
use super::metadata::{labels, meta};
use super::names;
use super::placement;
use super::pod_security::restricted_pod;
use super::pods::SPEC_HASH_ANNOTATION;
use super::settings::Settings;
use super::site::ClusterSite;
use super::volumes::volumes_of;
use crate::Error;

/// Annotation on MemoryX's pod template with the hash of its configuration: a rescale changes `job.yaml`, which
/// changes the template, so the StatefulSet restarts MemoryX, which resumes from its checkpoint at the new size.
pub const CONFIG_HASH_ANNOTATION: &str = "weightstream.dev/config-hash";

/// The environment variable through which each weight server learns its index (`--server-index`'s).
pub const SERVER_INDEX_ENV: &str = "WS_SERVER_INDEX";

/// The label the StatefulSet controller puts on each of its pods with the pod's ordinal (Kubernetes 1.28+).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// MemoryX's arguments in a pod, as the plan wires it: the coordinator drives the SwarmX root, and
/// every weight server is told the others' addresses; the checkpoints and the run's records go to the pod's
/// volume and MemoryX lingers after the job so the operator reads Succeeded or Failed. Every pod of the
/// StatefulSet has the same template, so the index is not here: each learns it from its pod's
/// [`POD_INDEX_LABEL`] through [`SERVER_INDEX_ENV`].
pub fn memoryx_args(job: &TrainingJob, plan: &Plan) -> MemoryxArgs {
    let (site, wiring) = (ClusterSite::of(job), Wiring::of(plan));
    MemoryxArgs {
        checkpoint_dir: Some(CHECKPOINT_DIR.into()),
        out: Some(std::path::Path::new(CHECKPOINT_DIR).join(crds::contract::RUN_FOLDER)),
        linger: true,
        ..wiring.memoryx(&site, wiring.weight_server_addresses(&site))
    }
}

/// MemoryX: a StatefulSet of the plan's weight servers (scaled to zero while the job holds no CS-2s), each with
/// its own checkpoint volume that outlives its pod, so a server's restart, a resume or a rescale continues from
/// the last checkpoint of its slice. Server 0 is also the job's coordinator: it drives the training loop
/// through the SwarmX root (a one-engine job's engine) and reaches the others on their weight-server port. Each
/// server's default memory request is its memory budget (the plan's `memory_bytes`), not the whole state, plus
/// the layers the coordinator holds in transit (`coordinator_transit_bytes`): the servers share one pod
/// template, and server 0 is the hub. `config_hash` is the hash of what the servers read at start: a change (a rescale) rolls them.
pub fn memoryx(job: &TrainingJob, settings: &Settings, plan: &Plan, config_hash: &str) -> Result<StatefulSet, Error> {
    let name = job.name_any();
    let servers = plan.memoryx.servers.max(1);
    let (volumes, mut mounts) = volumes_of(job, plan, Role::Memoryx);
    mounts.push(VolumeMount { name: volume_name(job)?, mount_path: CHECKPOINT_DIR.into(), ..Default::default() });
    let mut c = container(
        job,
        settings,
        &memoryx_args(job, plan),
        job.spec
            .resources
            .memoryx
            .clone()
            .or_else(|| memory_request(plan.memoryx.memory_bytes + plan.coordinator_transit_bytes)),
        mounts,
    );
    c.env = Some(vec![EnvVar {
        name: SERVER_INDEX_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: format!("metadata.labels['{POD_INDEX_LABEL}']"),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let replicas = i32::try_from(servers).map_err(|_| Error::Plan(format!("{servers} weight servers are too many")))?;
    let mut pod_spec = restricted_pod(vec![c], volumes);
    pod_spec.priority_class_name.clone_from(&job.spec.priority_class_name);
    pod_spec.affinity = Some(placement::apart(&name, Role::Memoryx));
    // Evicted or drained, MemoryX finishes the step in flight and checkpoints it before it exits: its grace
    // period is the plan's time for that, so the job resumes with no step lost.
    pod_spec.termination_grace_period_seconds = Some(i64::try_from(plan.stop_seconds()).unwrap_or(i64::MAX));
    let hash = spec_hash(&pod_spec)?;
    Ok(StatefulSet {
        metadata: meta(job, names::memoryx(&name), Some(Role::Memoryx))?,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(names::memoryx(&name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector { match_labels: Some(labels(&name, Some(Role::Memoryx))), ..Default::default() },
            persistent_volume_claim_retention_policy: Some(retention(job)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&name, Some(Role::Memoryx))),
                    annotations: Some(BTreeMap::from([
                        (SPEC_HASH_ANNOTATION.to_string(), hash),
                        (CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string()),
                    ])),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            volume_claim_templates: Some(vec![claim_template(job, settings)?]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::contract::{HTTP_PORT, SwarmxArgs};
    use k8s_openapi::api::core::v1::Pod;

    use crate::children::plan::plan;
    use crate::children::site::weight_server_address;
    use crate::children::testing::{build, job, memoryx_args, parse, role_pods, settings};

    #[test]
    fn the_tree_wires_memoryx_to_the_root_and_leaves_to_engines() {
        let d = build(&job(4), &settings(false), 4);
        let c = &d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        let a: MemoryxArgs = parse(c);
        assert_eq!(a.stage, "https://mnist-swarmx-0-0.mnist-swarmx.ml.svc:7100");
        assert_eq!(a.checkpoint_dir.as_deref(), Some(std::path::Path::new(CHECKPOINT_DIR)));
        let run = std::path::Path::new(CHECKPOINT_DIR).join(crds::contract::RUN_FOLDER);
        assert_eq!(a.out, Some(run), "the records on the volume");
        assert!(a.linger, "MemoryX must keep serving its final status");
        let pods = role_pods(&d, Role::Swarmx);
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["mnist-swarmx-0-0", "mnist-swarmx-1-0", "mnist-swarmx-1-1"]);
        let children = |p: &Pod| parse::<SwarmxArgs>(&p.spec.as_ref().unwrap().containers[0]).children;
        assert_eq!(
            children(&pods[0]),
            ["https://mnist-swarmx-1-0.mnist-swarmx.ml.svc:7100", "https://mnist-swarmx-1-1.mnist-swarmx.ml.svc:7100"]
        );
        assert_eq!(
            children(&pods[2]),
            ["https://mnist-engine-2.mnist-engine.ml.svc:7200", "https://mnist-engine-3.mnist-engine.ml.svc:7200"]
        );
        let claim = &d.memoryx.spec.as_ref().unwrap().volume_claim_templates.as_ref().unwrap()[0];
        assert_eq!(
            claim.spec.as_ref().unwrap().resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "1Gi"
        );
    }

    #[test]
    fn one_engine_is_driven_by_memoryx_with_no_swarmx_pod_between() {
        let d = build(&job(1), &settings(false), 1);
        let c = &d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(parse::<MemoryxArgs>(c).stage, "https://mnist-engine-0.mnist-engine.ml.svc:7200");
        assert!(role_pods(&d, Role::Swarmx).is_empty());
        assert_eq!((d.plan.swarmx.depth, d.plan.swarmx.nodes.len()), (0, 0));
        assert_eq!(role_pods(&d, Role::Engine).len(), 1);
    }

    /// `spec.memoryx.servers` weight servers: a StatefulSet of that many, one volume each, each learning its
    /// index from its pod's ordinal label, all given the other servers' addresses and the weights port.
    #[test]
    fn memoryx_is_a_statefulset_of_weight_servers() {
        let mut j = job(4);
        j.spec.memoryx.servers = Some(3);
        let d = build(&j, &settings(true), 4);
        let sts = d.memoryx.spec.clone().unwrap();
        assert_eq!(sts.replicas, Some(3));
        assert_eq!(sts.volume_claim_templates.as_ref().map(Vec::len), Some(1), "a volume per server");
        let pod = sts.template.spec.clone().unwrap();
        let c = &pod.containers[0];
        let a: MemoryxArgs = parse(c);
        assert_eq!(a, memoryx_args(&j, 4));
        assert_eq!(
            a.weight_servers,
            ["https://mnist-memoryx-1.mnist-memoryx.ml.svc:7400", "https://mnist-memoryx-2.mnist-memoryx.ml.svc:7400"]
        );
        assert_eq!(a.weight_servers[0], weight_server_address("mnist", "ml", 1));
        assert_eq!(a.listen, "0.0.0.0:7400".parse().unwrap());
        assert_eq!(a.server_index, 0, "the index is the pod's, from its environment");
        assert_eq!(a.tier_dir, None, "the tier lives beside the checkpoints");
        let env = c.env.clone().unwrap_or_default();
        let index = env.iter().find(|e| e.name == SERVER_INDEX_ENV).expect("WS_SERVER_INDEX");
        let field = index.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.clone());
        assert_eq!(field.as_deref(), Some("metadata.labels['apps.kubernetes.io/pod-index']"));
        let ports: Vec<(String, i32)> =
            c.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();
        assert_eq!(ports, [("weights".to_string(), 7400), ("http".to_string(), i32::from(HTTP_PORT))]);
        let svc = d.services.iter().find(|s| s.name_any() == "mnist-memoryx").unwrap();
        let svc_ports: Vec<i32> = svc.spec.as_ref().unwrap().ports.iter().flatten().map(|p| p.port).collect();
        assert_eq!(svc_ports, [7400, i32::from(HTTP_PORT)]);
        // One server: no others to reach, the same port.
        let one = build(&job(4), &settings(true), 4).memoryx.spec.unwrap();
        assert_eq!(one.replicas, Some(1));
        let a: MemoryxArgs = parse(&one.template.spec.unwrap().containers[0]);
        assert!(a.weight_servers.is_empty());
        // The plan chooses the count from the budget when servers is unset.
        let mut k = job(4);
        let (p, _) = plan(&k, 4, 2).unwrap();
        k.spec.memoryx.memory_bytes = Some(p.memoryx.server_bytes.div_ceil(2));
        k.spec.checkpoint.volume_size = "1Gi".into();
        let (q, _) = plan(&k, 4, 2).unwrap();
        assert_eq!(
            build(&k, &settings(true), 4).memoryx.spec.unwrap().replicas,
            Some(i32::try_from(q.memoryx.servers).unwrap())
        );
        assert!(q.memoryx.servers >= 2);
    }

    /// Each server asks for its own memory budget (plus the program's), not the whole state.
    #[test]
    fn each_weight_server_requests_its_memory_budget() {
        let request = |j: &TrainingJob| {
            let sts = build(j, &settings(false), 2).memoryx.spec.unwrap();
            let r = sts.template.spec.unwrap().containers[0].resources.clone().unwrap();
            r.requests.unwrap()["memory"].0.clone()
        };
        let mut j = job(2);
        // Layers of like size, so a server's budget can be below its slice and above twice a layer's slice (with
        // its staged gradient).
        j.spec.model.layers = vec![784, 64, 512, 512, 512, 512, 512, 10];
        j.spec.checkpoint.volume_size = "10Gi".into();
        let (p, _) = plan(&j, 2, 2).unwrap();
        let mib = |p: &Plan| {
            format!("{}Mi", (p.memoryx.memory_bytes + p.coordinator_transit_bytes + (128 << 20)).div_ceil(1 << 20))
        };
        assert!(p.coordinator_transit_bytes >= 3 * 4 * 512 * 512, "three of the largest layer: {p:?}");
        assert_eq!(request(&j), mib(&p));
        j.spec.memoryx.servers = Some(4);
        let (q, _) = plan(&j, 2, 2).unwrap();
        assert_eq!(request(&j), mib(&q));
        assert!(q.memoryx.memory_bytes < p.memoryx.memory_bytes / 3, "a quarter of the state each");
        j.spec.memoryx.memory_bytes = Some(q.memoryx.min_memory_bytes);
        let (t, _) = plan(&j, 2, 2).unwrap();
        assert_eq!(t.memoryx.memory_bytes, q.memoryx.min_memory_bytes);
        assert_eq!(request(&j), mib(&t));
        assert!(t.memoryx.disk_bytes > 0, "{:?}", t.memoryx);
    }
}
