//! The appliance a job gets, as Kubernetes objects: pure functions from the job (and what the operator decided
//! about it) to the ConfigMap, Services, the MemoryX StatefulSet, the SwarmX tree's pods and one engine pod per
//! CS-2. Being pure, they are unit-tested without a cluster, and reconcile only applies what they return.

use std::collections::BTreeMap;

use crds::{PlanStatus, PullPolicy, SwarmxTree, TrainingJob};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, Pod, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::Error;

/// Label every child carries with its job's name, so the operator finds (and cleans up) a job's children by
/// selector even where owner references are not honoured.
pub const JOB_LABEL: &str = "weightstream.dev/job";
/// Label naming a child's role (`memoryx`, `swarmx`, `engine`), for selectors and for people.
pub const ROLE_LABEL: &str = "weightstream.dev/role";
/// Annotation holding a hash of a pod's desired spec and of the configuration it reads at start: pods are
/// immutable, so a pod whose hash differs from the desired one (a rescaled tree, a new image, a new CS-2 count
/// in `job.yaml`) is replaced rather than patched.
pub const SPEC_HASH_ANNOTATION: &str = "weightstream.dev/spec-hash";
/// Annotation on MemoryX's pod template with the hash of its configuration: a rescale changes `job.yaml`, which
/// changes the template, so the StatefulSet restarts MemoryX, which resumes from its checkpoint at the new size.
pub const CONFIG_HASH_ANNOTATION: &str = "weightstream.dev/config-hash";
/// The extended resource a node advertises for each CS-2 it is attached to.
pub const CS2_RESOURCE: &str = "weightstream.dev/cs2";
/// Where every role finds the job manifest and plan.
pub const CONFIG_DIR: &str = "/etc/weightstream";
/// Where MemoryX keeps its checkpoints (a persistent volume, so restarts and resumes continue from them).
pub const CHECKPOINT_DIR: &str = "/var/lib/weightstream/checkpoints";
/// A SwarmX node's port.
pub const SWARMX_PORT: i32 = 7100;
/// An engine's port.
pub const ENGINE_PORT: i32 = 7200;
/// Every role's HTTP port: `/healthz`, `/metrics`, and MemoryX's `/status` and `/checkpoint`.
pub const HTTP_PORT: i32 = 8080;

/// What the operator knows beyond the job itself when it builds children.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The data-plane image when the job does not name one.
    pub default_image: String,
    /// Children per SwarmX node.
    pub fan_out: u32,
    /// Whether nodes advertise `weightstream.dev/cs2`, so engine pods may request it (a pod requesting a
    /// resource no node has would never schedule).
    pub request_cs2: bool,
}

/// The names of a job's children, derived from the job name alone so they are stable across restarts and a
/// replacement takes its predecessor's place (and DNS name).
pub mod names {
    /// The ConfigMap with the job manifest and plan.
    pub fn config(job: &str) -> String {
        format!("{job}-config")
    }
    /// MemoryX's StatefulSet and its headless Service.
    pub fn memoryx(job: &str) -> String {
        format!("{job}-memoryx")
    }
    /// The headless Service of the SwarmX pods.
    pub fn swarmx_service(job: &str) -> String {
        format!("{job}-swarmx")
    }
    /// SwarmX node `index` at `level` of the tree (level 0 is the root).
    pub fn swarmx(job: &str, level: usize, index: usize) -> String {
        format!("{job}-swarmx-{level}-{index}")
    }
    /// The headless Service of the engine pods.
    pub fn engine_service(job: &str) -> String {
        format!("{job}-engine")
    }
    /// Engine `index`: one per CS-2.
    pub fn engine(job: &str, index: u32) -> String {
        format!("{job}-engine-{index}")
    }
}

/// The SwarmX tree for `engines` engines with `fan_out` children per node: widths of each level, root first.
/// Leaves take up to `fan_out` engines each; inner nodes up to `fan_out` nodes; the root is one node.
pub fn tree_levels(engines: u32, fan_out: u32) -> Vec<u32> {
    let fan_out = fan_out.max(2);
    let mut widths = vec![engines.max(1).div_ceil(fan_out)];
    while let Some(&w) = widths.last() {
        if w <= 1 {
            break;
        }
        widths.push(w.div_ceil(fan_out));
    }
    widths.reverse();
    widths
}

/// One SwarmX node and where its children are.
#[derive(Clone, Debug, PartialEq)]
pub struct SwarmxNode {
    /// Its pod name.
    pub name: String,
    /// Addresses of its children (SwarmX nodes one level down, or engines under a leaf).
    pub children: Vec<String>,
}

/// Every node of the SwarmX tree, root first, with its children's addresses.
pub fn swarmx_nodes(job: &str, namespace: &str, engines: u32, fan_out: u32) -> Vec<SwarmxNode> {
    let fan_out = fan_out.max(2);
    let levels = tree_levels(engines, fan_out);
    let mut nodes = Vec::new();
    for (level, &width) in levels.iter().enumerate() {
        let below = levels.get(level + 1).copied();
        for i in 0..width {
            let first = i * fan_out;
            let children = match below {
                Some(w) => (first..(first + fan_out).min(w))
                    .map(|j| swarmx_address(job, namespace, level + 1, j as usize))
                    .collect(),
                None => (first..(first + fan_out).min(engines)).map(|e| engine_address(job, namespace, e)).collect(),
            };
            nodes.push(SwarmxNode { name: names::swarmx(job, level, i as usize), children });
        }
    }
    nodes
}

/// The URL of SwarmX node (`level`, `index`) through its headless Service's per-pod DNS name.
pub fn swarmx_address(job: &str, namespace: &str, level: usize, index: usize) -> String {
    let pod = names::swarmx(job, level, index);
    format!("http://{pod}.{}.{namespace}.svc:{SWARMX_PORT}", names::swarmx_service(job))
}

/// The URL of engine `index`.
pub fn engine_address(job: &str, namespace: &str, index: u32) -> String {
    let pod = names::engine(job, index);
    format!("http://{pod}.{}.{namespace}.svc:{ENGINE_PORT}", names::engine_service(job))
}

/// MemoryX's HTTP endpoint (`/status`, `/checkpoint`), through its Service: what the operator polls.
pub fn memoryx_http(job: &str, namespace: &str) -> String {
    format!("http://{}.{namespace}.svc:{HTTP_PORT}", names::memoryx(job))
}

/// Children per SwarmX node unless configured: the simulated engine's cost model assumes the same fan-out
/// (`sim_wse::preset::SWARMX_FANOUT`), so the tree the operator builds is the one the estimates price.
pub const DEFAULT_FAN_OUT: u32 = 8;

/// The SRAM of each engine: the spec's override, else the preset's, from the one table of engine figures
/// (`sim_wse::preset`), so the operator plans with the same numbers the engines enforce.
pub fn sram_bytes(job: &TrainingJob) -> u64 {
    sim_wse::preset::sram_bytes(&job.spec.engine)
}

/// The plan for the job at `cs2` engines (the allocated count, which differs from the spec while a rescale
/// waits), in the terms of the status. A job whose shard cannot fit an engine is refused here.
pub fn plan(job: &TrainingJob, cs2: u32, fan_out: u32) -> Result<(runtime::plan::Plan, PlanStatus), Error> {
    let mut spec = job.spec.clone();
    spec.cs2 = cs2;
    let plan = runtime::plan::Plan::new(&spec, sram_bytes(job)).map_err(|e| Error::Plan(e.to_string()))?;
    let name = job.name_any();
    let ns = job.namespace().unwrap_or_default();
    let levels = tree_levels(cs2, fan_out);
    let status = PlanStatus {
        cs2,
        shard: plan.shard as u64,
        memoryx_bytes: plan.memoryx_bytes,
        engine_sram_bytes: plan.engine_sram_bytes,
        peak_engine_bytes: plan.peak_engine_bytes,
        execution_mode: plan.execution_mode,
        step_bytes: plan.step_bytes,
        swarmx: SwarmxTree {
            fan_out: fan_out.max(2),
            depth: levels.len() as u32,
            nodes: swarmx_nodes(&name, &ns, cs2, fan_out).into_iter().map(|n| n.name).collect(),
        },
        engines: (0..cs2).map(|i| names::engine(&name, i)).collect(),
    };
    Ok((plan, status))
}

fn labels(job: &str, role: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "weightstream".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "weightstream-operator".to_string()),
        (JOB_LABEL.to_string(), job.to_string()),
    ]);
    if let Some(role) = role {
        l.insert(ROLE_LABEL.to_string(), role.to_string());
    }
    l
}

fn owner(job: &TrainingJob) -> Result<OwnerReference, Error> {
    let mut o = job.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))?;
    // Foreground deletion of the job waits for its children, and the garbage collector removes them.
    o.block_owner_deletion = Some(true);
    Ok(o)
}

fn meta(job: &TrainingJob, name: String, role: Option<&str>) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: job.namespace(),
        labels: Some(labels(&job.name_any(), role)),
        owner_references: Some(vec![owner(job)?]),
        ..Default::default()
    })
}

/// The ConfigMap every role mounts: the job manifest as the data plane reads it (with the CS-2 count the
/// appliance is assembled for) and the plan as JSON.
pub fn config_map(job: &TrainingJob, cs2: u32, plan: &runtime::plan::Plan) -> Result<ConfigMap, Error> {
    // Only what the data plane reads: the fields that concern the operator alone (suspension, priority, the
    // restart limit, images and resources) are left at their defaults, so changing them — suspending above
    // all — does not change the configuration hash and replace running pods.
    let defaults: crds::TrainingJobSpec = serde_json::from_value(serde_json::json!({
        "model": job.spec.model,
        "data": job.spec.data,
        "training": job.spec.training,
    }))
    .map_err(|e| Error::Serialize(e.to_string()))?;
    let spec = crds::TrainingJobSpec {
        cs2,
        suspend: defaults.suspend,
        restart_limit: defaults.restart_limit,
        priority: defaults.priority,
        images: defaults.images,
        resources: defaults.resources,
        ..job.spec.clone()
    };
    let manifest = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "TrainingJob",
        "metadata": { "name": job.name_any(), "namespace": job.namespace() },
        "spec": spec,
    });
    let job_yaml = serde_yaml::to_string(&manifest).map_err(|e| Error::Serialize(e.to_string()))?;
    let plan_json = serde_json::to_string_pretty(plan).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(ConfigMap {
        metadata: meta(job, names::config(&job.name_any()), None)?,
        data: Some(BTreeMap::from([("job.yaml".to_string(), job_yaml), ("plan.json".to_string(), plan_json)])),
        ..Default::default()
    })
}

/// A headless Service for one role: it gives each pod a stable DNS name (`<pod>.<service>`), which is how the
/// roles find each other.
pub fn headless_service(job: &TrainingJob, name: String, role: &str, ports: &[(&str, i32)]) -> Result<Service, Error> {
    Ok(Service {
        metadata: meta(job, name, Some(role))?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels(&job.name_any(), Some(role))),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: Some((*n).to_string()),
                        port: *p,
                        target_port: Some(IntOrString::Int(*p)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The three headless Services: MemoryX, SwarmX and engines.
pub fn services(job: &TrainingJob) -> Result<Vec<Service>, Error> {
    let name = job.name_any();
    Ok(vec![
        // MemoryX only dials out (to the SwarmX root); its Service carries the HTTP port the operator polls.
        headless_service(job, names::memoryx(&name), "memoryx", &[("http", HTTP_PORT)])?,
        headless_service(job, names::swarmx_service(&name), "swarmx", &[("fabric", SWARMX_PORT), ("http", HTTP_PORT)])?,
        headless_service(job, names::engine_service(&name), "engine", &[("engine", ENGINE_PORT), ("http", HTTP_PORT)])?,
    ])
}

fn image(job: &TrainingJob, settings: &Settings) -> String {
    job.spec.images.runtime.clone().unwrap_or_else(|| settings.default_image.clone())
}

fn pull_policy(job: &TrainingJob) -> String {
    match job.spec.images.pull_policy.unwrap_or(PullPolicy::IfNotPresent) {
        PullPolicy::Always => "Always",
        PullPolicy::IfNotPresent => "IfNotPresent",
        PullPolicy::Never => "Never",
    }
    .into()
}

fn container(
    job: &TrainingJob,
    settings: &Settings,
    role: &str,
    args: Vec<String>,
    port: Option<(&str, i32)>,
    resources: Option<ResourceRequirements>,
    extra_mounts: Vec<VolumeMount>,
) -> Container {
    let mut mounts = vec![VolumeMount {
        name: "config".into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    mounts.extend(extra_mounts);
    Container {
        name: role.into(),
        image: Some(image(job, settings)),
        image_pull_policy: Some(pull_policy(job)),
        command: Some(vec![role_binary(role).into()]),
        args: Some(args),
        ports: Some(
            port.into_iter()
                .map(|(n, p)| ContainerPort { name: Some(n.into()), container_port: p, ..Default::default() })
                .chain([ContainerPort { name: Some("http".into()), container_port: HTTP_PORT, ..Default::default() }])
                .collect(),
        ),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(HTTP_PORT),
                ..Default::default()
            }),
            period_seconds: Some(2),
            ..Default::default()
        }),
        resources,
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

fn role_binary(role: &str) -> &'static str {
    match role {
        "memoryx" => "memoryx",
        "swarmx" => "swarmx",
        _ => "sim-wse",
    }
}

fn config_volume(job: &TrainingJob) -> Volume {
    Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource { name: names::config(&job.name_any()), ..Default::default() }),
        ..Default::default()
    }
}

fn job_file() -> String {
    format!("{CONFIG_DIR}/job.yaml")
}

/// MemoryX: a one-replica StatefulSet (zero while the job holds no CS-2s) whose checkpoint volume outlives its
/// pod, so a MemoryX restart, a resume or a rescale continues from the last checkpoint. It is also the job's
/// coordinator: it drives the training loop through the SwarmX root.
pub fn memoryx(job: &TrainingJob, settings: &Settings, replicas: i32, cs2: u32) -> Result<StatefulSet, Error> {
    let name = job.name_any();
    let ns = job.namespace().unwrap_or_default();
    let args = vec![
        "--job".into(),
        job_file(),
        "--swarmx".into(),
        swarmx_address(&name, &ns, 0, 0),
        "--checkpoint-dir".into(),
        CHECKPOINT_DIR.into(),
        "--http".into(),
        format!("0.0.0.0:{HTTP_PORT}"),
        "--json-logs".into(),
        // Keep answering /status after the job ends, so the operator reads Succeeded or Failed (an exit would
        // be restarted by the StatefulSet and counted as a failure).
        "--linger".into(),
    ];
    let c = container(
        job,
        settings,
        "memoryx",
        args,
        None,
        job.spec.resources.memoryx.clone(),
        vec![VolumeMount { name: "checkpoints".into(), mount_path: CHECKPOINT_DIR.into(), ..Default::default() }],
    );
    let pod_spec = PodSpec { containers: vec![c], volumes: Some(vec![config_volume(job)]), ..Default::default() };
    let mut template_labels = labels(&name, Some("memoryx"));
    let hash = spec_hash(&pod_spec)?;
    let config = config_hash(job, cs2, settings.fan_out)?;
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("checkpoints".into()),
            labels: Some(labels(&name, Some("memoryx"))),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: job.spec.checkpoint.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(job.spec.checkpoint.volume_size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    template_labels.insert(ROLE_LABEL.into(), "memoryx".into());
    Ok(StatefulSet {
        metadata: meta(job, names::memoryx(&name), Some("memoryx"))?,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(names::memoryx(&name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector { match_labels: Some(labels(&name, Some("memoryx"))), ..Default::default() },
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Delete".into()),
                when_scaled: Some("Retain".into()),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(template_labels),
                    annotations: Some(BTreeMap::from([
                        (SPEC_HASH_ANNOTATION.to_string(), hash),
                        (CONFIG_HASH_ANNOTATION.to_string(), config),
                    ])),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn pod(job: &TrainingJob, name: String, role: &str, service: String, spec: PodSpec, config: &str) -> Result<Pod, Error> {
    let mut spec = spec;
    spec.hostname = Some(name.clone());
    spec.subdomain = Some(service);
    // A failed pod is replaced by the operator (same name, same DNS), which counts it against restartLimit.
    spec.restart_policy = Some("Never".into());
    let hash = fnv(format!("{}/{config}", spec_hash(&spec)?).as_bytes());
    let mut m = meta(job, name, Some(role))?;
    m.annotations = Some(BTreeMap::from([(SPEC_HASH_ANNOTATION.to_string(), hash)]));
    Ok(Pod { metadata: m, spec: Some(spec), ..Default::default() })
}

/// The SwarmX tree's pods, root first: each broadcasts what its parent sends to its children and sums what they
/// return.
pub fn swarmx_pods(job: &TrainingJob, settings: &Settings, cs2: u32) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    let ns = job.namespace().unwrap_or_default();
    let config = config_hash(job, cs2, settings.fan_out)?;
    swarmx_nodes(&name, &ns, cs2, settings.fan_out)
        .into_iter()
        .map(|node| {
            let args = vec![
                "--job".into(),
                job_file(),
                "--listen".into(),
                format!("0.0.0.0:{SWARMX_PORT}"),
                "--children".into(),
                node.children.join(","),
                "--http".into(),
                format!("0.0.0.0:{HTTP_PORT}"),
                "--json-logs".into(),
            ];
            let c = container(
                job,
                settings,
                "swarmx",
                args,
                Some(("fabric", SWARMX_PORT)),
                job.spec.resources.swarmx.clone(),
                vec![],
            );
            let spec = PodSpec { containers: vec![c], volumes: Some(vec![config_volume(job)]), ..Default::default() };
            pod(job, node.name, "swarmx", names::swarmx_service(&name), spec, &config)
        })
        .collect()
}

/// One engine pod per CS-2, named by index so a replacement keeps its identity. It requests one
/// `weightstream.dev/cs2` when nodes advertise that resource, so the scheduler places it on a CS-2's host.
pub fn engine_pods(job: &TrainingJob, settings: &Settings, cs2: u32) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    let config = config_hash(job, cs2, settings.fan_out)?;
    (0..cs2)
        .map(|i| {
            let args = vec![
                "--job".into(),
                job_file(),
                "--index".into(),
                i.to_string(),
                "--listen".into(),
                format!("0.0.0.0:{ENGINE_PORT}"),
                "--http".into(),
                format!("0.0.0.0:{HTTP_PORT}"),
                "--json-logs".into(),
            ];
            let mut resources = job.spec.resources.engine.clone().unwrap_or_default();
            if settings.request_cs2 {
                let one = Quantity("1".into());
                resources.limits.get_or_insert_with(BTreeMap::new).insert(CS2_RESOURCE.into(), one.clone());
                resources.requests.get_or_insert_with(BTreeMap::new).insert(CS2_RESOURCE.into(), one);
            }
            let resources = (resources != ResourceRequirements::default()).then_some(resources);
            let c = container(job, settings, "engine", args, Some(("engine", ENGINE_PORT)), resources, vec![]);
            let spec = PodSpec { containers: vec![c], volumes: Some(vec![config_volume(job)]), ..Default::default() };
            pod(job, names::engine(&name, i), "engine", names::engine_service(&name), spec, &config)
        })
        .collect()
}

/// A stable hash (FNV-1a over the JSON) of a pod spec: the same spec hashes the same in every operator build,
/// so an operator upgrade does not replace running pods.
pub fn spec_hash(spec: &PodSpec) -> Result<String, Error> {
    let json = serde_json::to_vec(spec).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(fnv(&json))
}

/// A stable hash of the ConfigMap data the roles read at start for `cs2` engines: `job.yaml` and `plan.json`.
pub fn config_hash(job: &TrainingJob, cs2: u32, fan_out: u32) -> Result<String, Error> {
    let (plan, _) = plan(job, cs2, fan_out)?;
    let data = config_map(job, cs2, &plan)?.data;
    let json = serde_json::to_vec(&data).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(fnv(&json))
}

fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cs2: u32) -> TrainingJob {
        let mut j = crds::parse_training_job(&format!(
            r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {{name: mnist, namespace: ml, uid: 1234-abcd}}
spec:
  cs2: {cs2}
  model: {{kind: mlp, layers: [784, 64, 10], sparsity: 0.5}}
  data: {{kind: mnist, path: /data/mnist}}
  training: {{batchSize: 64, steps: 10, optimizer: {{kind: sgd, learningRate: 0.1}}}}
  engine: {{preset: tiny}}
"#
        ))
        .expect("valid job");
        j.metadata.uid = Some("1234-abcd".into());
        j
    }

    fn settings(request_cs2: bool) -> Settings {
        Settings { default_image: "weightstream/runtime:0.1.0".into(), fan_out: 2, request_cs2 }
    }

    fn args(pod: &Pod) -> Vec<String> {
        pod.spec.as_ref().unwrap().containers[0].args.clone().unwrap()
    }

    #[test]
    fn tree_has_one_root_and_enough_leaves() {
        assert_eq!(tree_levels(1, 8), vec![1]);
        assert_eq!(tree_levels(8, 8), vec![1]);
        assert_eq!(tree_levels(9, 8), vec![1, 2]);
        assert_eq!(tree_levels(64, 8), vec![1, 8]);
        assert_eq!(tree_levels(65, 8), vec![1, 2, 9]);
        assert_eq!(tree_levels(4, 2), vec![1, 2]);
        assert_eq!(tree_levels(5, 2), vec![1, 2, 3]);
    }

    #[test]
    fn every_engine_has_exactly_one_parent_and_every_node_but_the_root_one_parent() {
        for (engines, fan_out) in [(1, 2), (4, 2), (5, 2), (17, 4), (64, 8), (65, 8)] {
            let nodes = swarmx_nodes("j", "ns", engines, fan_out);
            let mut children: Vec<&String> = nodes.iter().flat_map(|n| &n.children).collect();
            let total = children.len();
            children.sort();
            children.dedup();
            assert_eq!(children.len(), total, "a child with two parents for {engines}/{fan_out}");
            for e in 0..engines {
                assert!(children.contains(&&engine_address("j", "ns", e)), "engine {e} unreached");
            }
            assert_eq!(total, engines as usize + nodes.len() - 1, "{engines}/{fan_out}");
            assert!(nodes.iter().all(|n| !n.children.is_empty() && n.children.len() <= fan_out as usize));
            assert_eq!(nodes[0].name, "j-swarmx-0-0");
        }
    }

    #[test]
    fn engines_are_named_by_index_and_find_their_config() {
        let j = job(4);
        let pods = engine_pods(&j, &settings(false), 4).unwrap();
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["mnist-engine-0", "mnist-engine-1", "mnist-engine-2", "mnist-engine-3"]);
        let a = args(&pods[2]);
        assert_eq!(
            a,
            ["--job", "/etc/weightstream/job.yaml", "--index", "2", "--listen", "0.0.0.0:7200", "--http", "0.0.0.0:8080", "--json-logs"]
        );
        let spec = pods[2].spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("mnist-engine-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("mnist-engine"));
        assert_eq!(spec.containers[0].command.as_ref().unwrap(), &["sim-wse"]);
        assert!(spec.containers[0].resources.is_none(), "no cs2 request when no node advertises it");
    }

    #[test]
    fn engines_request_a_cs2_only_when_nodes_advertise_it() {
        let pods = engine_pods(&job(2), &settings(true), 2).unwrap();
        let r = pods[0].spec.as_ref().unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()[CS2_RESOURCE], Quantity("1".into()));
        assert_eq!(r.requests.unwrap()[CS2_RESOURCE], Quantity("1".into()));
    }

    #[test]
    fn every_child_is_owned_by_the_job_with_blocking_deletion() {
        let j = job(4);
        let s = settings(false);
        let (p, _) = plan(&j, 4, 2).unwrap();
        let mut metas = vec![config_map(&j, 4, &p).unwrap().metadata, memoryx(&j, &s, 1, 4).unwrap().metadata];
        metas.extend(services(&j).unwrap().into_iter().map(|x| x.metadata));
        metas.extend(swarmx_pods(&j, &s, 4).unwrap().into_iter().map(|x| x.metadata));
        metas.extend(engine_pods(&j, &s, 4).unwrap().into_iter().map(|x| x.metadata));
        assert_eq!(metas.len(), 2 + 3 + 3 + 4);
        for m in metas {
            let o = &m.owner_references.as_ref().unwrap()[0];
            assert_eq!((o.kind.as_str(), o.name.as_str(), o.uid.as_str()), ("TrainingJob", "mnist", "1234-abcd"));
            assert_eq!((o.controller, o.block_owner_deletion), (Some(true), Some(true)));
            assert_eq!(m.labels.unwrap()[JOB_LABEL], "mnist");
            assert_eq!(m.namespace.as_deref(), Some("ml"));
        }
    }

    #[test]
    fn the_tree_wires_memoryx_to_the_root_and_leaves_to_engines() {
        let j = job(4);
        let s = settings(false);
        let sts = memoryx(&j, &s, 1, 4).unwrap();
        let c = &sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        let a = c.args.clone().unwrap();
        let swarmx_at = a.iter().position(|x| x == "--swarmx").unwrap();
        assert_eq!(a[swarmx_at + 1], "http://mnist-swarmx-0-0.mnist-swarmx.ml.svc:7100");
        assert!(a.contains(&CHECKPOINT_DIR.to_string()));
        assert!(a.contains(&"--linger".to_string()), "MemoryX must keep serving its final status");
        let pods = swarmx_pods(&j, &s, 4).unwrap();
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["mnist-swarmx-0-0", "mnist-swarmx-1-0", "mnist-swarmx-1-1"]);
        let root = args(&pods[0]);
        assert_eq!(
            root[5],
            "http://mnist-swarmx-1-0.mnist-swarmx.ml.svc:7100,http://mnist-swarmx-1-1.mnist-swarmx.ml.svc:7100"
        );
        assert_eq!(
            args(&pods[2])[5],
            "http://mnist-engine-2.mnist-engine.ml.svc:7200,http://mnist-engine-3.mnist-engine.ml.svc:7200"
        );
        let claim = &sts.spec.as_ref().unwrap().volume_claim_templates.as_ref().unwrap()[0];
        assert_eq!(claim.spec.as_ref().unwrap().resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0, "1Gi");
    }

    #[test]
    fn config_map_carries_the_allocated_size_and_the_plan() {
        let j = job(4);
        let (p, status) = plan(&j, 2, 2).unwrap();
        let cm = config_map(&j, 2, &p).unwrap();
        let data = cm.data.unwrap();
        let parsed = crds::parse_training_job(&data["job.yaml"]).expect("the data plane can parse it");
        assert_eq!(parsed.spec.cs2, 2);
        assert_eq!(parsed.spec.model, j.spec.model);
        let plan_json: serde_json::Value = serde_json::from_str(&data["plan.json"]).unwrap();
        assert_eq!(plan_json["cs2"], 2);
        assert_eq!(plan_json["shard"], 32);
        assert_eq!(status.engines, ["mnist-engine-0", "mnist-engine-1"]);
        assert_eq!(status.swarmx.nodes, ["mnist-swarmx-0-0"]);
        assert_eq!(status.swarmx.depth, 1);
        assert_eq!(status.memoryx_bytes, p.memoryx_bytes);
    }

    #[test]
    fn suspending_or_reprioritising_does_not_change_what_the_pods_read() {
        let j = job(4);
        let before = config_hash(&j, 4, 2).unwrap();
        let mut k = j.clone();
        k.spec.suspend = true;
        k.spec.priority = 7;
        k.spec.restart_limit = 9;
        assert_eq!(config_hash(&k, 4, 2).unwrap(), before, "no pod is replaced by a suspend");
        k.spec.training.seed += 1;
        assert_ne!(config_hash(&k, 4, 2).unwrap(), before, "training changes do reach the pods");
    }

    #[test]
    fn a_job_too_big_for_the_engine_is_refused_with_the_reason() {
        let mut j = job(1);
        j.spec.engine.sram_bytes = Some(1024);
        let err = plan(&j, 1, 2).unwrap_err().to_string();
        assert!(err.contains("SRAM") || err.contains("sram") || err.contains("bytes"), "{err}");
    }

    #[test]
    fn images_and_resources_follow_the_spec() {
        let mut j = job(1);
        j.spec.images.runtime = Some("registry.local/ws:dev".into());
        j.spec.images.pull_policy = Some(PullPolicy::Never);
        let pods = engine_pods(&j, &settings(false), 1).unwrap();
        let c = &pods[0].spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.local/ws:dev"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        let default = engine_pods(&job(1), &settings(false), 1).unwrap();
        assert_eq!(default[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("weightstream/runtime:0.1.0"));
    }

    #[test]
    fn a_changed_tree_changes_the_pod_hash() {
        let j = job(4);
        let s = settings(false);
        let root4 = &swarmx_pods(&j, &s, 4).unwrap()[0];
        let root2 = &swarmx_pods(&j, &s, 2).unwrap()[0];
        let again = &swarmx_pods(&j, &s, 4).unwrap()[0];
        let h = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH_ANNOTATION].clone();
        assert_ne!(h(root4), h(root2));
        assert_eq!(h(root4), h(again));
    }

    #[test]
    fn a_new_cs2_count_replaces_every_pod_and_restarts_memoryx() {
        // Engine 0's own spec is the same at 2 and 4 engines, but its shard (from job.yaml) is not.
        let j = job(4);
        let s = settings(false);
        let h = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH_ANNOTATION].clone();
        assert_ne!(h(&engine_pods(&j, &s, 4).unwrap()[0]), h(&engine_pods(&j, &s, 2).unwrap()[0]));
        let tmpl = |n| {
            memoryx(&j, &s, 1, n).unwrap().spec.unwrap().template.metadata.unwrap().annotations.unwrap()
                [CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(tmpl(4), tmpl(2));
        assert_eq!(tmpl(4), tmpl(4));
    }
}
