//! The appliance a job gets, as Kubernetes objects: pure functions from the job (and what the operator decided
//! about it) to the ConfigMap, Services, the MemoryX StatefulSet, the SwarmX tree's pods and one engine pod per
//! CS-2. Being pure, they are unit-tested without a cluster, and reconcile only applies what they return.

use std::collections::BTreeMap;

use std::net::SocketAddr;

use crds::contract::{CommonArgs, MemoryxArgs, Role, RoleArgs, DATA_MOUNT, HTTP_PORT, JOB_LABEL, METRICS_SCRAPER_LABEL, ROLE_LABEL};
use crds::{PlanStatus, PullPolicy, SwarmxTreeStatus, TrainingJob};
use plan::appliance::Plan;
use plan::wiring::{Component, Site, Wiring};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, KeyToPath, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort,
    Secret, SecretVolumeSource, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::Error;

/// Annotation holding a hash of a pod's desired spec and of the configuration it reads at start: pods are
/// immutable, so a pod whose hash differs from the desired one (a rescaled tree, a new image, a new CS-2 count
/// in `job.yaml`) is replaced rather than patched.
pub const SPEC_HASH_ANNOTATION: &str = "weightstream.dev/spec-hash";
/// Annotation on MemoryX's pod template with the hash of its configuration: a rescale changes `job.yaml`, which
/// changes the template, so the StatefulSet restarts MemoryX, which resumes from its checkpoint at the new size.
pub const CONFIG_HASH_ANNOTATION: &str = "weightstream.dev/config-hash";
/// The extended resource a node advertises for each CS-2 it is attached to.
pub const CS2_RESOURCE: &str = "weightstream.dev/cs2";
/// Where every role finds the job manifest.
pub const CONFIG_DIR: &str = "/etc/weightstream";
/// Where every role finds the job's TLS identity (the per-job Secret's `ca.crt`, `tls.crt`, `tls.key`).
pub const IDENTITY_DIR: &str = "/var/run/weightstream/identity";
/// Annotation on the identity Secret naming the uid of the job it was issued for: a job recreated under the
/// same name gets a new identity, never its predecessor's.
pub const IDENTITY_UID_ANNOTATION: &str = "weightstream.dev/job-uid";
/// Where MemoryX keeps its checkpoints (a persistent volume, so restarts and resumes continue from them).
pub const CHECKPOINT_DIR: &str = "/var/lib/weightstream/checkpoints";

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
    /// The operator's own pods, which every job's NetworkPolicy admits (the operator polls MemoryX).
    pub operator: OperatorPeer,
}

/// Where the operator's own pods run and the labels they carry: the chart passes both (the namespace through
/// the downward API, the labels rendered from the same helper that labels its Deployment's pods), so a job's
/// NetworkPolicy admits exactly the operator that manages it.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorPeer {
    /// The operator's namespace (`POD_NAMESPACE`); it also holds the leader Lease.
    pub namespace: String,
    /// Labels every operator pod carries (the chart's selector labels).
    pub labels: BTreeMap<String, String>,
}

impl Default for OperatorPeer {
    /// The chart's defaults: namespace `weightstream-system`, pods labelled `app.kubernetes.io/component: operator`.
    fn default() -> Self {
        OperatorPeer {
            namespace: crate::DEFAULT_NAMESPACE.into(),
            labels: BTreeMap::from([("app.kubernetes.io/component".to_string(), "operator".to_string())]),
        }
    }
}

impl OperatorPeer {
    /// Parses `key=value,key=value` (the `--operator-pod-labels` flag), refusing an empty list or a pair
    /// without `=`: a policy whose peer selector is empty would admit every pod of the operator's namespace.
    pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, Error> {
        let mut labels = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("operator pod label '{pair}' is not key=value")))?;
            if k.trim().is_empty() {
                return Err(Error::Config(format!("operator pod label '{pair}' has no key")));
            }
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        if labels.is_empty() {
            return Err(Error::Config("the operator's pod labels are empty: a NetworkPolicy would admit every pod of its namespace".into()));
        }
        Ok(labels)
    }
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
        format!("{job}-{}", plan::wiring::Component::Swarmx { level, index }.name())
    }
    /// The Secret with the job's TLS identity.
    pub fn identity(job: &str) -> String {
        format!("{job}-identity")
    }
    /// The headless Service of the engine pods.
    pub fn engine_service(job: &str) -> String {
        format!("{job}-engine")
    }
    /// Engine `index`: one per CS-2.
    pub fn engine(job: &str, index: u32) -> String {
        format!("{job}-{}", plan::wiring::Component::Engine(index).name())
    }
    /// The headless Service of the input workers.
    pub fn input_service(job: &str) -> String {
        format!("{job}-input")
    }
    /// Input worker `index`: `spec.data.workers` per CS-2, engine `e`'s in a contiguous block.
    pub fn input(job: &str, index: u32) -> String {
        format!("{job}-{}", plan::wiring::Component::Input(index).name())
    }
    /// The job's NetworkPolicy.
    pub fn network_policy(job: &str) -> String {
        format!("{job}-network")
    }
}

/// The URL of SwarmX node (`level`, `index`) through its headless Service's per-pod DNS name.
pub fn swarmx_address(job: &str, namespace: &str, level: usize, index: usize) -> String {
    let pod = names::swarmx(job, level, index);
    format!("https://{pod}.{}.{namespace}.svc:{}", names::swarmx_service(job), grpc_port(Role::Swarmx))
}

/// The URL of engine `index`.
pub fn engine_address(job: &str, namespace: &str, index: u32) -> String {
    let pod = names::engine(job, index);
    format!("https://{pod}.{}.{namespace}.svc:{}", names::engine_service(job), grpc_port(Role::Engine))
}

/// The URL of input worker `index`.
pub fn input_address(job: &str, namespace: &str, index: u32) -> String {
    let pod = names::input(job, index);
    format!("https://{pod}.{}.{namespace}.svc:{}", names::input_service(job), grpc_port(Role::Input))
}

/// The URL of weight server `index`'s gRPC service (its slice of every layer), through MemoryX's headless
/// Service's per-pod DNS name: the StatefulSet's pod `<job>-memoryx-<index>`.
pub fn weight_server_address(job: &str, namespace: &str, index: u32) -> String {
    let set = names::memoryx(job);
    format!("https://{set}-{index}.{set}.{namespace}.svc:{}", grpc_port(Role::Memoryx))
}

/// The cluster as the wiring's [`Site`]: a job's components reach each other by their pods' DNS names on the
/// roles' fixed ports, read the job and identity where the pod mounts them, and the input workers find the
/// data volume at [`DATA_MOUNT`].
pub struct ClusterSite {
    job: String,
    namespace: String,
    data_volume: bool,
}

impl ClusterSite {
    /// The site of `job`'s pods.
    pub fn of(job: &TrainingJob) -> ClusterSite {
        ClusterSite { job: job.name_any(), namespace: job.namespace().unwrap_or_default(), data_volume: job.spec.data.volume.is_some() }
    }
}

impl Site for ClusterSite {
    fn common(&self) -> CommonArgs {
        common_args()
    }

    fn listen(&self, role: Role) -> SocketAddr {
        listen(role)
    }

    fn address(&self, to: Component) -> String {
        let (job, ns) = (self.job.as_str(), self.namespace.as_str());
        match to {
            Component::Input(i) => input_address(job, ns, i),
            Component::Engine(i) => engine_address(job, ns, i),
            Component::Swarmx { level, index } => swarmx_address(job, ns, level, index),
            Component::WeightServer(i) => weight_server_address(job, ns, i),
        }
    }

    fn data_root(&self) -> Option<std::path::PathBuf> {
        self.data_volume.then(|| DATA_MOUNT.into())
    }
}

/// MemoryX's HTTP endpoint (`/status`, `/checkpoint`): what the operator polls. It is weight server 0's, the
/// coordinator's, by its pod's DNS name: the Service's name would resolve to every weight server, and only the
/// coordinator knows the job's progress.
pub fn memoryx_http(job: &str, namespace: &str) -> String {
    let set = names::memoryx(job);
    format!("https://{set}-0.{set}.{namespace}.svc:{HTTP_PORT}")
}

/// The names the job's certificate carries besides the fixed one: MemoryX's Service and every weight server's,
/// SwarmX node's, engine's and input worker's pod DNS name (the operator calls the coordinator by its pod's
/// name, the coordinator calls the other weight servers by theirs).
pub fn identity_names(job: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{}.{namespace}.svc", names::memoryx(job)),
        format!("*.{}.{namespace}.svc", names::memoryx(job)),
        format!("*.{}.{namespace}.svc", names::swarmx_service(job)),
        format!("*.{}.{namespace}.svc", names::engine_service(job)),
        format!("*.{}.{namespace}.svc", names::input_service(job)),
    ]
}

/// The job's identity Secret from freshly issued material (see [`wire::identity`]): every file, the
/// operator's client certificate among them; the pods mount only the roles' three files.
pub fn identity_secret(job: &TrainingJob, issued: &wire::identity::Issued) -> Result<Secret, Error> {
    let mut m = meta(job, names::identity(&job.name_any()), None)?;
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    m.annotations = Some(BTreeMap::from([(IDENTITY_UID_ANNOTATION.to_string(), uid)]));
    Ok(Secret {
        metadata: m,
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(issued.files().into_iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    })
}

/// Whether `secret` is the identity of this very job (same uid), not a leftover of a deleted namesake.
pub fn identity_belongs_to(secret: &Secret, job: &TrainingJob) -> bool {
    let uid = secret.annotations().get(IDENTITY_UID_ANNOTATION);
    uid.is_some() && uid.cloned() == job.uid()
}

fn grpc_port(role: Role) -> u16 {
    role.grpc_port().map_or(0, |(_, p)| p)
}

/// Refuses a checkpoint volume that cannot hold what weight server 0 (the coordinator) keeps on it: the
/// checkpoints the job keeps and the one being written, each of the whole state (the coordinator writes every
/// server's slice, so a checkpoint can be pulled from one place and resumed on any number of servers), plus its
/// disk tier (the part of its slice beyond its memory budget). Every server has a volume of this size (the
/// StatefulSet's claim template); such a job would otherwise fail at its first full disk, hours in, instead of now.
fn check_volume(c: &crds::CheckpointSpec, m: &plan::memoryx::MemoryxPlan) -> Result<(), Error> {
    let volume = crds::quantity_bytes(&c.volume_size)
        .ok_or_else(|| Error::Plan(format!("spec.checkpoint.volumeSize '{}' is not a quantity", c.volume_size)))?;
    let state = m.server_bytes.saturating_mul(u64::from(m.servers));
    let checkpoints = state.saturating_mul(u64::from(c.keep) + 1);
    let needed = checkpoints.saturating_add(m.disk_bytes);
    if volume < needed {
        return Err(Error::Plan(format!(
            "spec.checkpoint.volumeSize {} is smaller than what the coordinator (weight server 0 of {}) keeps on its \
             volume: {} checkpoints of the whole state ({} kept + 1 being written, {checkpoints} bytes) and its disk \
             tier ({} bytes), {needed} bytes in all: raise volumeSize, lower spec.checkpoint.keep or raise \
             spec.memoryx.memoryBytes",
            c.volume_size,
            m.servers,
            u64::from(c.keep) + 1,
            c.keep,
            m.disk_bytes
        )));
    }
    Ok(())
}

/// The job's spec as it runs on `cs2` CS-2s (the allocated count). An elastic job on fewer than it asks for runs
/// the full job's shards as micro-batches, so its curve stays the full job's; at its full size that is already
/// the spec's own micro-batch. The fewest CS-2s it may shrink to are checked where the spec's own size is.
fn at_size(spec: &crds::TrainingJobSpec, cs2: u32) -> crds::TrainingJobSpec {
    let mut running = spec.clone();
    if spec.min_cs2.is_some() && cs2 < spec.cs2 {
        running.training.micro_batch_size = Some(spec.micro_batch());
    }
    running.cs2 = cs2;
    running.min_cs2 = spec.min_cs2.filter(|&m| m <= cs2);
    running
}

/// The plan for the job at `cs2` engines (the allocated count, which differs from the spec while a rescale
/// waits), and the same in the terms of the status. A job whose shard cannot fit an engine is refused here.
pub fn plan(job: &TrainingJob, cs2: u32, fan_out: u32) -> Result<(Plan, PlanStatus), Error> {
    let spec = at_size(&job.spec, cs2);
    let plan = Plan::for_spec(&spec, fan_out).map_err(|e| match e {
        // The plan's own refusal says what to change; its "plan:" prefix would only repeat ours.
        plan::error::Error::Plan(why) => Error::Plan(why),
        other => Error::Plan(other.to_string()),
    })?;
    check_volume(&spec.checkpoint, &plan.memoryx)?;
    let name = job.name_any();
    let status = PlanStatus {
        cs2,
        shard: plan.shard as u64,
        memoryx_bytes: plan.memoryx_bytes,
        engine_sram_bytes: plan.engine_sram_bytes,
        peak_engine_bytes: plan.peak_engine_bytes,
        execution_mode: plan.execution_mode,
        step_bytes: plan.step_bytes,
        swarmx: SwarmxTreeStatus {
            fan_out: plan.swarmx.fan_out,
            depth: plan.swarmx.depth(),
            nodes: plan.swarmx.nodes().map(|n| names::swarmx(&name, n.level, n.index)).collect(),
        },
        engines: (0..cs2).map(|i| names::engine(&name, i)).collect(),
    };
    Ok((plan, status))
}

fn labels(job: &str, role: Option<Role>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "weightstream".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "weightstream-operator".to_string()),
        (JOB_LABEL.to_string(), job.to_string()),
    ]);
    if let Some(role) = role {
        l.insert(ROLE_LABEL.to_string(), role.as_str().to_string());
    }
    l
}

fn owner(job: &TrainingJob) -> Result<OwnerReference, Error> {
    let mut o = job.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))?;
    // Foreground deletion of the job waits for its children, and the garbage collector removes them.
    o.block_owner_deletion = Some(true);
    Ok(o)
}

fn meta(job: &TrainingJob, name: String, role: Option<Role>) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: job.namespace(),
        labels: Some(labels(&job.name_any(), role)),
        owner_references: Some(vec![owner(job)?]),
        ..Default::default()
    })
}

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

/// The job's NetworkPolicy: the data plane's endpoints take plaintext calls that read (`Snapshot`, `/status`)
/// and replace (`Prime`, `Apply`, `/checkpoint`) the job's state, so its pods accept traffic only from
/// - the same job's pods (the SwarmX tree and the engines call each other on every port);
/// - the operator's pods ([`OperatorPeer`]), on the HTTP port only (it polls `/status` and asks for
///   checkpoints there);
/// - pods in namespaces labelled [`METRICS_SCRAPER_LABEL`]` = "true"`, on the HTTP port only (`/metrics`,
///   `/healthz`): a cluster admin labels the monitoring namespace so Prometheus can scrape the roles. Any pod
///   in such a namespace reaches the HTTP port, so only admins should be able to label namespaces.
///
/// Egress is limited too, to the same job's pods and DNS (port 53 anywhere: the roles find each other by
/// name): the data plane talks to nothing else, so a compromised role cannot reach the API server, another
/// tenant or the node's metadata endpoints. Kubelet probes come from the node, which policy agents admit.
pub fn network_policy(job: &TrainingJob, operator: &OperatorPeer) -> Result<NetworkPolicy, Error> {
    let name = job.name_any();
    let same_job = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(JOB_LABEL.to_string(), name.clone())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let port = |protocol: &str, port: u16| NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(i32::from(port))),
        ..Default::default()
    };
    let namespace_named = |ns: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())])),
        ..Default::default()
    };
    let operator_pods = NetworkPolicyPeer {
        namespace_selector: Some(namespace_named(&operator.namespace)),
        pod_selector: Some(LabelSelector { match_labels: Some(operator.labels.clone()), ..Default::default() }),
        ..Default::default()
    };
    let scrapers = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(METRICS_SCRAPER_LABEL.to_string(), "true".to_string())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(NetworkPolicy {
        metadata: meta(job, names::network_policy(&name), None)?,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(JOB_LABEL.to_string(), name.clone())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule { from: Some(vec![same_job.clone()]), ports: None },
                NetworkPolicyIngressRule {
                    from: Some(vec![operator_pods, scrapers]),
                    ports: Some(vec![port("TCP", HTTP_PORT)]),
                },
            ]),
            egress: Some(vec![
                NetworkPolicyEgressRule { to: Some(vec![same_job]), ports: None },
                NetworkPolicyEgressRule { to: None, ports: Some(vec![port("UDP", 53), port("TCP", 53)]) },
            ]),
        }),
    })
}

/// The ConfigMap every role mounts: the job manifest as the data plane reads it, with the CS-2 count the
/// appliance is assembled for. The roles compute the plan from it themselves, so only what they read is here
/// and hashed into the pods: a new operator whose plan gains a field restarts no running job.
pub fn config_map(job: &TrainingJob, cs2: u32) -> Result<ConfigMap, Error> {
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
        suspend: defaults.suspend,
        restart_limit: defaults.restart_limit,
        priority: defaults.priority,
        priority_class_name: defaults.priority_class_name,
        active_deadline_seconds: defaults.active_deadline_seconds,
        min_cs2: defaults.min_cs2,
        images: defaults.images,
        resources: defaults.resources,
        ..at_size(&job.spec, cs2)
    };
    let manifest = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "TrainingJob",
        // The uid lets MemoryX tell this job's checkpoints from those of an earlier job of the same name.
        "metadata": { "name": job.name_any(), "namespace": job.namespace(), "uid": job.uid() },
        "spec": spec,
    });
    let job_yaml = serde_yaml::to_string(&manifest).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(ConfigMap {
        metadata: meta(job, names::config(&job.name_any()), None)?,
        data: Some(BTreeMap::from([(JOB_FILE.to_string(), job_yaml)])),
        ..Default::default()
    })
}

/// The ConfigMap key, and file name under [`CONFIG_DIR`], of the job manifest.
const JOB_FILE: &str = "job.yaml";

/// A headless Service for one role: it gives each pod a stable DNS name (`<pod>.<service>`), which is how the
/// roles find each other.
fn headless_service(job: &TrainingJob, name: String, role: Role) -> Result<Service, Error> {
    let ports = role.grpc_port().into_iter().chain([("http", HTTP_PORT)]);
    Ok(Service {
        metadata: meta(job, name, Some(role))?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels(&job.name_any(), Some(role))),
            ports: Some(
                ports
                    .map(|(n, p)| ServicePort {
                        name: Some(n.to_string()),
                        port: i32::from(p),
                        target_port: Some(IntOrString::Int(i32::from(p))),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The four headless Services: MemoryX (its weight servers' gRPC port, by which the coordinator reaches the
/// other servers, and the HTTP port the operator polls), SwarmX, engines and input workers.
pub fn services(job: &TrainingJob) -> Result<Vec<Service>, Error> {
    let name = job.name_any();
    Ok(vec![
        headless_service(job, names::memoryx(&name), Role::Memoryx)?,
        headless_service(job, names::swarmx_service(&name), Role::Swarmx)?,
        headless_service(job, names::engine_service(&name), Role::Engine)?,
        headless_service(job, names::input_service(&name), Role::Input)?,
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

/// The arguments every role gets in a pod: the mounted manifest, the HTTP port on all interfaces, JSON logs.
fn common_args() -> CommonArgs {
    CommonArgs {
        http: SocketAddr::from(([0, 0, 0, 0], HTTP_PORT)),
        json_logs: true,
        ..CommonArgs::new(format!("{CONFIG_DIR}/{JOB_FILE}"), IDENTITY_DIR)
    }
}

/// Where a role's gRPC service listens in its pod.
fn listen(role: Role) -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], grpc_port(role)))
}

/// The role's container running `args`, rendered from the contract's type.
fn container<A: RoleArgs>(
    job: &TrainingJob,
    settings: &Settings,
    args: &A,
    resources: Option<ResourceRequirements>,
    extra_mounts: Vec<VolumeMount>,
) -> Container {
    let role = A::ROLE;
    let mut mounts = vec![
        VolumeMount { name: "config".into(), mount_path: CONFIG_DIR.into(), read_only: Some(true), ..Default::default() },
        VolumeMount { name: "identity".into(), mount_path: IDENTITY_DIR.into(), read_only: Some(true), ..Default::default() },
    ];
    mounts.extend(extra_mounts);
    let port = |(n, p): (&str, u16)| ContainerPort { name: Some(n.into()), container_port: i32::from(p), ..Default::default() };
    Container {
        name: role.as_str().into(),
        image: Some(image(job, settings)),
        image_pull_policy: Some(pull_policy(job)),
        command: Some(vec![role.binary().into()]),
        args: Some(args.argv()),
        ports: Some(role.grpc_port().into_iter().chain([("http", HTTP_PORT)]).map(port).collect()),
        readiness_probe: Some(Probe { http_get: Some(healthz()), period_seconds: Some(2), ..Default::default() }),
        // Liveness is judged only once the program serves its health (up to 5 minutes for a slow start: a
        // busy node, a large pretrained model read before training).
        startup_probe: Some(Probe { http_get: Some(healthz()), period_seconds: Some(2), failure_threshold: Some(150), ..Default::default() }),
        // A frozen process (SIGSTOP, a hung host) stops answering while its pod still runs: the kubelet kills
        // it after three missed checks (about 15 s), without waiting out a grace period it cannot use. An engine,
        // SwarmX node or input worker then fails and the operator replaces it, counted against restartLimit;
        // a weight server restarts in place, counted the same way. Checks are cheap and answered off the
        // compute threads, so a busy component is never taken for a frozen one.
        liveness_probe: Some(Probe {
            http_get: Some(healthz()),
            period_seconds: Some(5),
            timeout_seconds: Some(5),
            failure_threshold: Some(3),
            termination_grace_period_seconds: Some(STATELESS_GRACE_SECONDS),
            ..Default::default()
        }),
        resources,
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every role's health endpoint, for the kubelet's probes: over TLS like every endpoint; the kubelet verifies
/// no certificate and `/healthz` asks for none.
fn healthz() -> HTTPGetAction {
    HTTPGetAction {
        path: Some("/healthz".into()),
        port: IntOrString::Int(i32::from(HTTP_PORT)),
        scheme: Some("HTTPS".into()),
        ..Default::default()
    }
}

/// What the scheduler reserves for a role by default: the memory the plan says it holds, plus room for the
/// program, its data and its buffers. Only a request: a limit guessed wrong would kill a healthy job, so limits
/// stay with `spec.resources`, which replaces this default whole.
fn memory_request(plan_bytes: u64) -> Option<ResourceRequirements> {
    const PROGRAM: u64 = 128 << 20;
    let mib = (plan_bytes.saturating_add(PROGRAM)).div_ceil(1 << 20);
    Some(ResourceRequirements {
        requests: Some(BTreeMap::from([("memory".to_string(), Quantity(format!("{mib}Mi")))])),
        ..Default::default()
    })
}

/// The user the runtime image runs as (`images/build.sh`); also the group that owns the checkpoint volume.
pub const RUNTIME_UID: i64 = 65532;

/// A pod spec for `containers` that passes Pod Security "restricted": non-root, the runtime's default seccomp
/// profile, no service-account token (the data plane never talks to the API server), and the checkpoint
/// volume's files owned by the runtime's group so MemoryX can write them.
fn restricted_pod(containers: Vec<Container>, volumes: Vec<Volume>) -> PodSpec {
    PodSpec {
        containers,
        volumes: Some(volumes),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUNTIME_UID),
            run_as_group: Some(RUNTIME_UID),
            fs_group: Some(RUNTIME_UID),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What every role's pod mounts: the job manifest and the roles' part of the job's identity (readable by the
/// runtime's group only; the operator's key is not among the items).
fn role_volumes(job: &TrainingJob) -> Vec<Volume> {
    let items = wire::identity::MOUNTED
        .iter()
        .map(|f| KeyToPath { key: f.to_string(), path: f.to_string(), ..Default::default() })
        .collect();
    vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource { name: names::config(&job.name_any()), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "identity".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::identity(&job.name_any())),
                items: Some(items),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// The environment variable through which each weight server learns its index (`--server-index`'s).
pub const SERVER_INDEX_ENV: &str = "WS_SERVER_INDEX";
/// The label the StatefulSet controller puts on each of its pods with the pod's ordinal (Kubernetes 1.28+).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// MemoryX's arguments in a pod, as the plan wires it: the coordinator drives the SwarmX root, and
/// every weight server is told the others' addresses; the checkpoints go to the pod's volume and MemoryX
/// lingers after the job so the operator reads Succeeded or Failed. Every pod of the StatefulSet has the same
/// template, so the index is not here: each learns it from its pod's [`POD_INDEX_LABEL`] through
/// [`SERVER_INDEX_ENV`].
pub fn memoryx_args(job: &TrainingJob, plan: &Plan) -> MemoryxArgs {
    let (site, wiring) = (ClusterSite::of(job), Wiring::of(plan));
    MemoryxArgs {
        checkpoint_dir: Some(CHECKPOINT_DIR.into()),
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
    mounts.push(VolumeMount { name: "checkpoints".into(), mount_path: CHECKPOINT_DIR.into(), ..Default::default() });
    let mut c = container(
        job,
        settings,
        &memoryx_args(job, plan),
        job.spec.resources.memoryx.clone().or_else(|| memory_request(plan.memoryx.memory_bytes + plan.coordinator_transit_bytes)),
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
    // Evicted or drained, MemoryX finishes the step in flight and checkpoints it before it exits: its grace
    // period is the plan's time for that, so the job resumes with no step lost.
    pod_spec.termination_grace_period_seconds = Some(i64::try_from(plan.stop_seconds()).unwrap_or(i64::MAX));
    let hash = spec_hash(&pod_spec)?;
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("checkpoints".into()),
            labels: Some(labels(&name, Some(Role::Memoryx))),
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
    Ok(StatefulSet {
        metadata: meta(job, names::memoryx(&name), Some(Role::Memoryx))?,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(names::memoryx(&name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector { match_labels: Some(labels(&name, Some(Role::Memoryx))), ..Default::default() },
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Delete".into()),
                when_scaled: Some("Retain".into()),
            }),
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
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// How long a process the kubelet stops has before it is killed, when it has nothing to save: a frozen process
/// cannot use a grace period, and a live one exits at once.
const STATELESS_GRACE_SECONDS: i64 = 2;

fn pod(job: &TrainingJob, name: String, role: Role, service: String, spec: PodSpec, config: &str) -> Result<Pod, Error> {
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

/// The SwarmX tree's pods, root first, as the plan lays the tree out: each broadcasts what its parent sends to
/// its children and sums what they return.
fn swarmx_pods(job: &TrainingJob, settings: &Settings, plan: &Plan, config: &str) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    plan.swarmx
        .nodes()
        .map(|node| {
            let c = container(job, settings, &Wiring::of(plan).swarmx(&ClusterSite::of(job), node), job.spec.resources.swarmx.clone(), vec![]);
            let spec = restricted_pod(vec![c], role_volumes(job));
            pod(job, names::swarmx(&name, node.level, node.index), Role::Swarmx, names::swarmx_service(&name), spec, config)
        })
        .collect()
}

/// The pod volumes and the container's mounts of a component of `role`: the job's own ([`role_volumes`]), and
/// the data volume, read-only at [`DATA_MOUNT`], for the roles that read it: input workers (the data), and
/// the roles that read a pretrained folder in it ([`Plan::reads_pretrained`]). No other pod mounts it, so a
/// job's data is read by the role that prepares it and by no other.
fn volumes_of(job: &TrainingJob, plan: &Plan, role: Role) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = role_volumes(job);
    let mut mounts = Vec::new();
    if let Some(claim) = job.spec.data.volume.as_ref().filter(|_| role == Role::Input || plan.reads_pretrained(role)) {
        volumes.push(Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim.clone(), read_only: Some(true) }),
            ..Default::default()
        });
        mounts.push(VolumeMount { name: "data".into(), mount_path: DATA_MOUNT.into(), read_only: Some(true), ..Default::default() });
    }
    (volumes, mounts)
}

/// The input workers, `spec.data.workers` per CS-2, which read the data volume (read-only).
fn input_pods(job: &TrainingJob, settings: &Settings, plan: &Plan, config: &str) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    (0..plan.input_workers)
        .map(|i| {
            let (volumes, mounts) = volumes_of(job, plan, Role::Input);
            let c = container(job, settings, &Wiring::of(plan).input(&ClusterSite::of(job), i), job.spec.resources.input.clone(), mounts);
            let spec = restricted_pod(vec![c], volumes);
            pod(job, names::input(&name, i), Role::Input, names::input_service(&name), spec, config)
        })
        .collect()
}

/// One engine pod per CS-2, named by index so a replacement keeps its identity. It requests one
/// `weightstream.dev/cs2` when nodes advertise that resource, so the scheduler places it on a CS-2's host.
fn engine_pods(job: &TrainingJob, settings: &Settings, plan: &Plan, config: &str) -> Result<Vec<Pod>, Error> {
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
            let spec = restricted_pod(vec![c], volumes);
            pod(job, names::engine(&name, i), Role::Engine, names::engine_service(&name), spec, config)
        })
        .collect()
}

/// A stable hash (FNV-1a over the JSON) of a pod spec: the same spec hashes the same in every operator build,
/// so an operator upgrade does not replace running pods.
pub fn spec_hash(spec: &PodSpec) -> Result<String, Error> {
    let json = serde_json::to_vec(spec).map_err(|e| Error::Serialize(e.to_string()))?;
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
    use crds::contract::{EngineArgs, InputArgs, SwarmxArgs};

    fn job(cs2: u32) -> TrainingJob {
        let mut j = crds::testing::mlp_job("mnist", "ml", cs2);
        j.metadata.uid = Some("1234-abcd".into());
        j
    }

    fn settings(request_cs2: bool) -> Settings {
        Settings { default_image: "weightstream/runtime:0.1.0".into(), fan_out: 2, request_cs2, operator: OperatorPeer::default() }
    }

    fn build(j: &TrainingJob, s: &Settings, n: u32) -> Desired {
        desired(j, s, n).unwrap()
    }

    fn role_pods(d: &Desired, role: Role) -> Vec<Pod> {
        d.pods.iter().filter(|p| p.labels()[ROLE_LABEL] == role.as_str()).cloned().collect()
    }

    fn containers(d: &Desired) -> Vec<Container> {
        let sts = d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers.clone();
        sts.into_iter().chain(d.pods.iter().flat_map(|p| p.spec.as_ref().unwrap().containers.clone())).collect()
    }

    /// The plan of `j` as the operator makes it (its CS-2s, a fan-out of 2).
    fn plan_of(j: &TrainingJob) -> Plan {
        plan_at(j, j.spec.cs2)
    }

    /// The plan of `j` on `cs2` allocated CS-2s.
    fn plan_at(j: &TrainingJob, cs2: u32) -> Plan {
        plan(j, cs2, 2).expect("a plan").0
    }

    /// MemoryX's arguments as the operator wires `j` on `cs2` allocated CS-2s (one has no SwarmX tree).
    fn memoryx_args(j: &TrainingJob, cs2: u32) -> MemoryxArgs {
        super::memoryx_args(j, &plan_at(j, cs2))
    }

    /// Engine `index`'s arguments as the operator wires `j`.
    fn engine_args(j: &TrainingJob, index: u32) -> EngineArgs {
        Wiring::of(&plan_of(j)).engine(&ClusterSite::of(j), index)
    }

    /// Input worker `index`'s arguments as the operator wires `j`.
    fn input_args(j: &TrainingJob, index: u32) -> InputArgs {
        Wiring::of(&plan_of(j)).input(&ClusterSite::of(j), index)
    }

    /// Parses a container's argv with the parser of the program it runs.
    fn parse<A: RoleArgs>(c: &Container) -> A {
        let argv = std::iter::once(c.command.as_ref().unwrap()[0].clone()).chain(c.args.clone().unwrap());
        A::try_parse_from(argv).unwrap_or_else(|e| panic!("{} does not parse {:?}: {e}", A::ROLE.binary(), c.args))
    }

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

    /// With `spec.data.volume` and two workers per CS-2, each engine is fed by its own two workers, and only the
    /// input pods mount the claim, read-only, where their `--data-root` says.
    #[test]
    fn input_workers_alone_mount_the_data_volume_read_only() {
        let mut j = job(2);
        j.spec.data.volume = Some("corpus".into());
        j.spec.data.workers = 2;
        let d = build(&j, &settings(false), 2);
        let inputs = role_pods(&d, Role::Input);
        assert_eq!(inputs.len(), 4);
        for (i, p) in inputs.iter().enumerate() {
            let spec = p.spec.as_ref().unwrap();
            let claim = spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone()).expect("the data claim");
            assert_eq!((claim.claim_name.as_str(), claim.read_only), ("corpus", Some(true)));
            let c = &spec.containers[0];
            let mount = c.volume_mounts.iter().flatten().find(|m| m.name == "data").expect("mounted");
            assert_eq!((mount.mount_path.as_str(), mount.read_only), (DATA_MOUNT, Some(true)));
            let a: InputArgs = parse(c);
            assert_eq!((a.index, a.data_root.as_deref()), (i as u32, Some(std::path::Path::new(DATA_MOUNT))));
        }
        for p in d.pods.iter().filter(|p| p.labels()[ROLE_LABEL] != Role::Input.as_str()) {
            let mounts_data = p.spec.as_ref().unwrap().volumes.iter().flatten().any(|v| v.persistent_volume_claim.is_some());
            assert!(!mounts_data, "{} mounts the data volume", p.name_any());
        }
        let engines = role_pods(&d, Role::Engine);
        let a: EngineArgs = parse(&engines[1].spec.as_ref().unwrap().containers[0]);
        assert_eq!(a.inputs, vec![input_address("mnist", "ml", 2), input_address("mnist", "ml", 3)]);
        assert!(a.inputs[0].starts_with("https://mnist-input-2.mnist-input.ml.svc:7300"), "{:?}", a.inputs);
    }

    /// A job starting from a pretrained folder in its data volume: every weight server mounts the volume
    /// read-only and reads the folder under its `--data-root`; engines do so only when they prune a pipelined
    /// replica by magnitude (sparse), and SwarmX never.
    #[test]
    fn the_readers_of_a_pretrained_folder_mount_the_data_volume_read_only() {
        let mut j = job(2);
        j.spec.data = crds::DataSpec { kind: crds::DataKind::Text, path: "moby.txt".into(), volume: Some("corpus".into()), ..j.spec.data.clone() };
        j.spec.model = crds::ModelSpec {
            kind: crds::ModelKind::Llama,
            width: Some(64),
            heads: Some(4),
            kv_heads: Some(2),
            blocks: Some(2),
            intermediate_size: Some(96),
            context_length: Some(32),
            from: Some("models/tiny".into()),
            ..crds::ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, 0.0)
        };
        j.spec.memoryx.servers = Some(2);
        let mounts_data = |spec: &PodSpec| {
            let claim = spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone());
            let mount = spec.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "data").cloned();
            match (claim, mount) {
                (Some(c), Some(m)) => {
                    assert_eq!((c.claim_name.as_str(), c.read_only, m.mount_path.as_str(), m.read_only), ("corpus", Some(true), DATA_MOUNT, Some(true)));
                    true
                }
                (None, None) => false,
                other => panic!("a claim without its mount or the reverse: {other:?}"),
            }
        };
        for (mode, sparsity, engines_read) in [(crds::ExecutionMode::WeightStreaming, 0.5, false), (crds::ExecutionMode::Pipelined, 0.0, false), (crds::ExecutionMode::Pipelined, 0.5, true)] {
            j.spec.execution_mode = mode;
            j.spec.model.sparsity = sparsity;
            let d = build(&j, &settings(false), 2);
            let mx = d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            assert!(mounts_data(mx), "{mode:?}: MemoryX reads the folder");
            let a: MemoryxArgs = parse(&mx.containers[0]);
            assert_eq!(a.data_root.as_deref(), Some(std::path::Path::new(DATA_MOUNT)));
            for e in role_pods(&d, Role::Engine) {
                let spec = e.spec.as_ref().unwrap();
                assert_eq!(mounts_data(spec), engines_read, "{mode:?} sparsity {sparsity}: {}", e.name_any());
                let a: EngineArgs = parse(&spec.containers[0]);
                assert_eq!(a.data_root.is_some(), engines_read);
            }
            assert!(role_pods(&d, Role::Swarmx).iter().all(|p| !mounts_data(p.spec.as_ref().unwrap())));
        }
    }

    /// The checks of Pod Security "restricted" (v1.34) that a pod spec can fail, as the API server applies them.
    fn restricted_violations(spec: &PodSpec) -> Vec<String> {
        let mut v = Vec::new();
        let pod = spec.security_context.clone().unwrap_or_default();
        fn seccomp(p: &Option<SeccompProfile>) -> Option<&str> {
            p.as_ref().map(|p| p.type_.as_str())
        }
        if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
            v.push("host namespaces".into());
        }
        for vol in spec.volumes.iter().flatten() {
            let allowed = vol.config_map.is_some() || vol.secret.is_some() || vol.empty_dir.is_some()
                || vol.persistent_volume_claim.is_some() || vol.projected.is_some() || vol.downward_api.is_some();
            if !allowed {
                v.push(format!("volume {} of a restricted type", vol.name));
            }
        }
        for c in &spec.containers {
            let sc = c.security_context.clone().unwrap_or_default();
            if sc.allow_privilege_escalation != Some(false) {
                v.push(format!("{}: allowPrivilegeEscalation", c.name));
            }
            if sc.privileged == Some(true) {
                v.push(format!("{}: privileged", c.name));
            }
            let drops_all = sc.capabilities.as_ref().and_then(|k| k.drop.as_ref()).is_some_and(|d| d.iter().any(|x| x == "ALL"));
            let adds = sc.capabilities.as_ref().and_then(|k| k.add.as_ref()).is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE"));
            if !drops_all || adds {
                v.push(format!("{}: capabilities", c.name));
            }
            if sc.run_as_non_root.or(pod.run_as_non_root) != Some(true) {
                v.push(format!("{}: runAsNonRoot", c.name));
            }
            if sc.run_as_user.or(pod.run_as_user) == Some(0) {
                v.push(format!("{}: runAsUser 0", c.name));
            }
            if !matches!(seccomp(&sc.seccomp_profile).or(seccomp(&pod.seccomp_profile)), Some("RuntimeDefault" | "Localhost")) {
                v.push(format!("{}: seccompProfile", c.name));
            }
            if c.ports.iter().flatten().any(|p| p.host_port.is_some()) {
                v.push(format!("{}: hostPort", c.name));
            }
        }
        v
    }

    #[test]
    fn every_pod_passes_pod_security_restricted() {
        let d = build(&job(4), &settings(true), 4);
        let mut specs = vec![d.memoryx.spec.clone().unwrap().template.spec.unwrap()];
        specs.extend(d.pods.iter().map(|p| p.spec.clone().unwrap()));
        assert_eq!(specs.len(), 1 + 3 + 4 + 4, "MemoryX, the tree, the engines and their input workers");
        for spec in specs {
            assert_eq!(restricted_violations(&spec), Vec::<String>::new(), "{:?}", spec.hostname);
            assert_eq!(spec.automount_service_account_token, Some(false), "no API token in the data plane");
            assert!(spec.containers.iter().all(|c| c.security_context.as_ref().and_then(|s| s.read_only_root_filesystem) == Some(true)));
            assert_eq!(spec.security_context.and_then(|s| s.fs_group), Some(RUNTIME_UID), "MemoryX can write its volume");
        }
    }

    /// A frozen pod is found by the kubelet (a liveness probe on every container, on the port the program
    /// serves health on), and MemoryX's pod is given the plan's time to checkpoint when it is stopped.
    #[test]
    fn every_container_is_probed_for_liveness_and_memoryx_has_time_to_checkpoint() {
        let j = job(4);
        let d = build(&j, &settings(true), 4);
        let memoryx = d.memoryx.spec.clone().unwrap().template.spec.unwrap();
        assert_eq!(memoryx.termination_grace_period_seconds, Some(plan_of(&j).stop_seconds() as i64));
        assert!(plan_of(&j).stop_seconds() >= 30);
        for c in containers(&d) {
            let probe = c.liveness_probe.as_ref().unwrap_or_else(|| panic!("{} has no liveness probe", c.name));
            let http = probe.http_get.as_ref().expect("an HTTP probe");
            assert_eq!((http.path.as_deref(), &http.port, http.scheme.as_deref()), (Some("/healthz"), &IntOrString::Int(i32::from(HTTP_PORT)), Some("HTTPS")));
            let window = probe.period_seconds.unwrap() * probe.failure_threshold.unwrap();
            assert!(window <= 20 && probe.timeout_seconds.unwrap() >= 5, "{}: found within 20 s, a busy one not mistaken", c.name);
        }
        // A frozen engine, SwarmX node or input worker is killed by its pod's grace period (restartPolicy
        // Never), so that one must be as short as its probe's, or its replacement waits out 30 s.
        for p in &d.pods {
            let spec = p.spec.as_ref().expect("a pod spec");
            let probe = spec.containers[0].liveness_probe.as_ref().and_then(|l| l.termination_grace_period_seconds);
            assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "{}", p.name_any());
            assert_eq!(spec.termination_grace_period_seconds, probe, "{}: killed as soon as its probe fails", p.name_any());
            assert!(probe.is_some_and(|g| g <= 5), "{}", p.name_any());
        }
    }

    fn matches(selector: &Option<LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
        let s = selector.as_ref().expect("a selector");
        assert!(s.match_expressions.is_none(), "the evaluator reads matchLabels only");
        s.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// A pod somewhere: its namespace's labels (as the API server sets them) and its own.
    struct Peer {
        ns: BTreeMap<String, String>,
        pod: BTreeMap<String, String>,
    }

    fn peer(ns: &str, ns_labels: &[(&str, &str)], pod: &[(&str, &str)]) -> Peer {
        let mut n: BTreeMap<String, String> = ns_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        n.insert("kubernetes.io/metadata.name".into(), ns.into());
        Peer { ns: n, pod: pod.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// NetworkPolicy semantics for matchLabels peers: a peer with only a podSelector is in the policy's own
    /// namespace; with a namespaceSelector (and a podSelector) both must match; a rule without ports allows all.
    fn peer_matches(p: &NetworkPolicyPeer, policy_ns: &str, who: &Peer) -> bool {
        assert!(p.ip_block.is_none());
        let ns_ok = match &p.namespace_selector {
            Some(_) => matches(&p.namespace_selector, &who.ns),
            None => who.ns["kubernetes.io/metadata.name"] == policy_ns,
        };
        ns_ok && (p.pod_selector.is_none() || matches(&p.pod_selector, &who.pod))
    }

    fn port_allowed(ports: &Option<Vec<NetworkPolicyPort>>, proto: &str, port: u16) -> bool {
        ports.as_ref().is_none_or(|ps| {
            ps.iter().any(|p| {
                p.protocol.as_deref().unwrap_or("TCP") == proto
                    && p.port.as_ref().is_none_or(|x| *x == IntOrString::Int(i32::from(port)))
            })
        })
    }

    fn ingress_allowed(np: &NetworkPolicy, from: &Peer, port: u16) -> bool {
        let ns = np.metadata.namespace.as_deref().unwrap();
        np.spec.as_ref().unwrap().ingress.iter().flatten().any(|r| {
            port_allowed(&r.ports, "TCP", port) && r.from.as_ref().is_none_or(|f| f.iter().any(|p| peer_matches(p, ns, from)))
        })
    }

    fn egress_allowed(np: &NetworkPolicy, to: Option<&Peer>, proto: &str, port: u16) -> bool {
        let ns = np.metadata.namespace.as_deref().unwrap();
        np.spec.as_ref().unwrap().egress.iter().flatten().any(|r| {
            port_allowed(&r.ports, proto, port)
                && r.to.as_ref().is_none_or(|t| to.is_some_and(|to| t.iter().any(|p| peer_matches(p, ns, to))))
        })
    }

    #[test]
    fn the_network_policy_admits_the_job_the_operator_and_scrapers_only() {
        let d = build(&job(4), &settings(false), 4);
        let np = &d.network_policy;
        let spec = np.spec.as_ref().unwrap();
        assert_eq!(np.metadata.name.as_deref(), Some("mnist-network"));
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
        // It selects every pod of the job (MemoryX's template included) and no other job's.
        let mut pod_labels: Vec<BTreeMap<String, String>> = d.pods.iter().map(|p| p.labels().clone()).collect();
        pod_labels.push(d.memoryx.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap());
        assert_eq!(pod_labels.len(), 1 + 3 + 4 + 4);
        assert!(pod_labels.iter().all(|l| matches(&spec.pod_selector, l)));
        assert!(!matches(&spec.pod_selector, &labels("other", Some(Role::Engine))));

        let (http, engine, fabric) = (HTTP_PORT, grpc_port(Role::Engine), grpc_port(Role::Swarmx));
        let job_pod = peer("ml", &[], &[(JOB_LABEL, "mnist"), (ROLE_LABEL, "swarmx")]);
        for port in [http, engine, fabric] {
            assert!(ingress_allowed(np, &job_pod, port), "the job's own pods reach port {port}");
        }
        let strangers = [
            ("another job in the namespace", peer("ml", &[], &[(JOB_LABEL, "other"), (ROLE_LABEL, "engine")])),
            ("a pod of the namespace", peer("ml", &[], &[("app", "x")])),
            ("the job's label in another namespace", peer("tenant-b", &[], &[(JOB_LABEL, "mnist")])),
            ("operator labels outside its namespace", peer("tenant-b", &[], &[("app.kubernetes.io/component", "operator")])),
            ("a pod of the operator's namespace", peer(crate::DEFAULT_NAMESPACE, &[], &[("app", "x")])),
        ];
        for (what, p) in &strangers {
            for port in [http, engine, fabric] {
                assert!(!ingress_allowed(np, p, port), "{what} must not reach port {port}");
            }
        }
        let operator = peer(crate::DEFAULT_NAMESPACE, &[], &[("app.kubernetes.io/component", "operator"), ("x", "y")]);
        assert!(ingress_allowed(np, &operator, http), "the operator polls MemoryX's /status");
        assert!(!ingress_allowed(np, &operator, engine) && !ingress_allowed(np, &operator, fabric));
        let scraper = peer("monitoring", &[(METRICS_SCRAPER_LABEL, "true")], &[("app", "prometheus")]);
        assert!(ingress_allowed(np, &scraper, http), "a labelled namespace scrapes /metrics");
        assert!(!ingress_allowed(np, &scraper, engine) && !ingress_allowed(np, &scraper, fabric));
        let unlabelled = peer("monitoring", &[(METRICS_SCRAPER_LABEL, "false")], &[("app", "prometheus")]);
        assert!(!ingress_allowed(np, &unlabelled, http));

        assert!(egress_allowed(np, Some(&job_pod), "TCP", engine), "the tree reaches the engines");
        let weights = grpc_port(Role::Memoryx);
        assert_eq!(weights, 7400);
        let server = peer("ml", &[], &[(JOB_LABEL, "mnist"), (ROLE_LABEL, "memoryx")]);
        assert!(egress_allowed(np, Some(&server), "TCP", weights) && ingress_allowed(np, &server, weights), "weight servers reach each other");
        for (what, p) in &strangers {
            assert!(!ingress_allowed(np, p, weights), "{what} must not reach the weight servers");
        }
        assert!(!ingress_allowed(np, &operator, weights), "the operator polls HTTP only");
        assert!(egress_allowed(np, None, "UDP", 53) && egress_allowed(np, None, "TCP", 53), "DNS");
        assert!(!egress_allowed(np, Some(&strangers[0].1), "TCP", engine), "not another job's engines");
        assert!(!egress_allowed(np, None, "TCP", 6443), "not the API server");
        let o = &np.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((o.name.as_str(), o.controller), ("mnist", Some(true)));
        assert_eq!(np.metadata.labels.as_ref().unwrap()[JOB_LABEL], "mnist", "cleanup finds it by label");
    }

    #[test]
    fn the_operator_peer_follows_the_settings() {
        let mut s = settings(false);
        s.operator = OperatorPeer {
            namespace: "ops".into(),
            labels: OperatorPeer::parse_labels("app.kubernetes.io/name=weightstream-operator, app.kubernetes.io/instance=ws").unwrap(),
        };
        let np = build(&job(1), &s, 1).network_policy;
        let chart_pod = peer("ops", &[], &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "ws")]);
        assert!(ingress_allowed(&np, &chart_pod, HTTP_PORT));
        let other_release = peer("ops", &[], &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "b")]);
        assert!(!ingress_allowed(&np, &other_release, HTTP_PORT));
        let default_ns = peer(crate::DEFAULT_NAMESPACE, &[], &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "ws")]);
        assert!(!ingress_allowed(&np, &default_ns, HTTP_PORT));
        for bad in ["", " , ", "novalue", "=x"] {
            assert!(OperatorPeer::parse_labels(bad).is_err(), "{bad:?}");
        }
    }

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
        assert!(r.requests.as_ref().is_some_and(|q| q.contains_key("memory") && !q.contains_key(CS2_RESOURCE)), "no cs2 request when no node advertises it");
        assert!(r.limits.is_none());
    }

    #[test]
    fn engines_request_a_cs2_only_when_nodes_advertise_it() {
        let pods = role_pods(&build(&job(2), &settings(true), 2), Role::Engine);
        let r = pods[0].spec.as_ref().unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()[CS2_RESOURCE], Quantity("1".into()));
        assert_eq!(r.requests.unwrap()[CS2_RESOURCE], Quantity("1".into()));
    }

    #[test]
    fn every_child_is_owned_by_the_job_with_blocking_deletion() {
        let d = build(&job(4), &settings(false), 4);
        let mut metas = vec![d.config.metadata.clone(), d.memoryx.metadata.clone(), d.network_policy.metadata.clone()];
        metas.extend(d.services.iter().map(|x| x.metadata.clone()));
        metas.extend(d.pods.iter().map(|x| x.metadata.clone()));
        assert_eq!(metas.len(), 3 + 4 + 3 + 4 + 4);
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
        let d = build(&job(4), &settings(false), 4);
        let c = &d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        let a: MemoryxArgs = parse(c);
        assert_eq!(a.stage, "https://mnist-swarmx-0-0.mnist-swarmx.ml.svc:7100");
        assert_eq!(a.checkpoint_dir.as_deref(), Some(std::path::Path::new(CHECKPOINT_DIR)));
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
        assert_eq!(claim.spec.as_ref().unwrap().resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0, "1Gi");
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

    #[test]
    fn config_map_carries_the_allocated_size_and_the_status_the_plan() {
        let j = job(4);
        let d = build(&j, &settings(false), 2);
        let data = d.config.data.clone().unwrap();
        assert_eq!(data.len(), 1, "only what the data plane reads");
        let parsed = crds::parse_training_job(&data["job.yaml"]).expect("the data plane can parse it");
        assert_eq!(parsed.spec.cs2, 2);
        assert_eq!(parsed.spec.model, j.spec.model);
        let (p, _) = plan(&j, 2, 2).unwrap();
        assert_eq!((d.plan.cs2, d.plan.shard), (2, 32));
        assert_eq!(d.plan.engines, ["mnist-engine-0", "mnist-engine-1"]);
        assert_eq!(d.plan.swarmx.nodes, ["mnist-swarmx-0-0"]);
        assert_eq!(d.plan.swarmx.depth, 1);
        assert_eq!(d.plan.memoryx_bytes, p.memoryx_bytes);
        assert_eq!(parsed.spec.training.micro_batch_size, None, "a rescale to 2 is a 2-CS-2 job");
        // An elastic job shrunk to 2 runs the 4-CS-2 job's shards as micro-batches; at 4 its shards are those.
        let mut elastic = job(4);
        elastic.spec.min_cs2 = Some(2);
        let shrunk = |n| {
            let data = build(&elastic, &settings(false), n).config.data.unwrap();
            crds::parse_training_job(&data["job.yaml"]).expect("parses").spec.training.micro_batch_size
        };
        assert_eq!((shrunk(2), shrunk(4)), (Some(16), None));
        assert_eq!((plan(&elastic, 2, 2).unwrap().0.micro_batch, plan(&elastic, 4, 2).unwrap().0.micro_batch), (16, 16));
    }

    fn config_hash(j: &TrainingJob, n: u32) -> String {
        let sts = build(j, &settings(false), n).memoryx;
        sts.spec.unwrap().template.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
    }

    #[test]
    fn suspending_or_reprioritising_does_not_change_what_the_pods_read() {
        let j = job(4);
        let before = config_hash(&j, 4);
        let mut k = j.clone();
        k.spec.suspend = true;
        k.spec.priority = 7;
        k.spec.priority_class_name = Some("high".into());
        k.spec.restart_limit = 9;
        assert_eq!(config_hash(&k, 4), before, "no pod is replaced by a suspend");
        k.spec.training.seed += 1;
        assert_ne!(config_hash(&k, 4), before, "training changes do reach the pods");
    }

    #[test]
    fn a_job_too_big_for_the_engine_is_refused_with_the_reason() {
        let mut j = job(1);
        j.spec.engine.sram_bytes = Some(1024);
        let err = plan(&j, 1, 2).unwrap_err().to_string();
        assert!(err.contains("SRAM") || err.contains("sram") || err.contains("bytes"), "{err}");
        assert!(desired(&j, &settings(false), 1).is_err());
    }

    #[test]
    fn a_volume_too_small_for_the_checkpoints_kept_is_refused() {
        let mut j = job(2);
        let (p, _) = plan(&j, 2, 2).unwrap();
        let per = p.memoryx.server_bytes;
        assert_eq!(p.memoryx.disk_bytes, 0, "one server keeps the whole state in memory by default");
        j.spec.checkpoint.keep = 2;
        j.spec.checkpoint.volume_size = format!("{}", 3 * per);
        assert!(plan(&j, 2, 2).is_ok(), "room for two kept and one being written");
        j.spec.checkpoint.volume_size = format!("{}", 3 * per - 1);
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.contains("spec.checkpoint.volumeSize") && err.contains("3 checkpoints"), "{err}");
    }

    /// The coordinator's volume holds the checkpoints of every slice and its own disk tier.
    #[test]
    fn the_volume_holds_whole_checkpoints_and_a_disk_tier() {
        let mut j = job(2);
        j.spec.model.layers = vec![784, 64, 512, 512, 512, 512, 512, 10];
        j.spec.memoryx.servers = Some(4);
        let (p, _) = plan(&j, 2, 2).unwrap();
        let m = p.memoryx.clone();
        assert_eq!(m.servers, 4);
        assert!(m.server_bytes * 4 >= p.memoryx_bytes - 8 * p.layers.iter().map(|l| l.weights as u64).sum::<u64>());
        assert!(m.server_bytes < p.memoryx_bytes, "a slice is smaller than the state");
        j.spec.checkpoint.keep = 1;
        j.spec.checkpoint.volume_size = format!("{}", 2 * 4 * m.server_bytes);
        assert!(plan(&j, 2, 2).is_ok(), "two whole checkpoints fit: one kept, one being written");
        j.spec.checkpoint.volume_size = format!("{}", 2 * 4 * m.server_bytes - 1);
        assert!(plan(&j, 2, 2).is_err(), "a checkpoint is every server's slice");
        // A memory budget below a slice puts the rest on the disk tier, which the volume must hold too.
        j.spec.memoryx.memory_bytes = Some(m.min_memory_bytes);
        j.spec.checkpoint.volume_size = "1Ti".into();
        let disk = plan(&j, 2, 2).unwrap().0.memoryx.disk_bytes;
        assert!(disk > 0, "part of each slice on disk");
        let state = 4 * plan(&j, 2, 2).unwrap().0.memoryx.server_bytes;
        j.spec.checkpoint.volume_size = format!("{}", 2 * state + disk);
        assert!(plan(&j, 2, 2).is_ok());
        j.spec.checkpoint.volume_size = format!("{}", 2 * state + disk - 1);
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.contains("weight server 0 of 4") && err.contains("disk tier"), "{err}");
    }

    /// A memory budget below what one server needs for a layer is refused with the plan's own words, once.
    #[test]
    fn a_memory_budget_below_one_layer_is_refused_with_the_numbers() {
        let mut j = job(2);
        j.spec.memoryx.memory_bytes = Some(1 << 20);
        j.spec.memoryx.servers = Some(1);
        j.spec.model.layers = vec![784, 1024, 10];
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.starts_with("the plan refuses the job: spec.memoryx.memoryBytes"), "{err}");
        assert!(err.contains("raise memoryBytes"), "{err}");
        assert!(desired(&j, &settings(false), 2).is_err());
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
        let ports: Vec<(String, i32)> = c.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();
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
        assert_eq!(build(&k, &settings(true), 4).memoryx.spec.unwrap().replicas, Some(i32::try_from(q.memoryx.servers).unwrap()));
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
        let mib = |p: &Plan| format!("{}Mi", (p.memoryx.memory_bytes + p.coordinator_transit_bytes + (128 << 20)).div_ceil(1 << 20));
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

    /// The job's certificate names every weight server (the coordinator dials them by their pod names) and the
    /// operator polls the coordinator, server 0, by its own pod name.
    #[test]
    fn the_identity_covers_every_weight_server_and_the_operator_polls_server_0() {
        let names = identity_names("mnist", "ml");
        let covered = |host: &str| {
            names.iter().any(|n| match n.strip_prefix("*.") {
                Some(rest) => host.split_once('.').is_some_and(|(first, tail)| !first.is_empty() && tail == rest),
                None => n == host,
            })
        };
        for i in 0..5 {
            let url = weight_server_address("mnist", "ml", i);
            let host = url.trim_start_matches("https://").split(':').next().unwrap();
            assert!(covered(host), "{host} is not in {names:?}");
        }
        let http = memoryx_http("mnist", "ml");
        assert_eq!(http, format!("https://mnist-memoryx-0.mnist-memoryx.ml.svc:{HTTP_PORT}"));
        assert!(covered("mnist-memoryx-0.mnist-memoryx.ml.svc") && covered("mnist-memoryx.ml.svc"));
    }

    #[test]
    fn images_and_resources_follow_the_spec() {
        let mut j = job(1);
        j.spec.images.runtime = Some("registry.local/ws:dev".into());
        j.spec.images.pull_policy = Some(PullPolicy::Never);
        let pods = role_pods(&build(&j, &settings(false), 1), Role::Engine);
        let c = &pods[0].spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.local/ws:dev"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        let default = role_pods(&build(&job(1), &settings(false), 1), Role::Engine);
        assert_eq!(default[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("weightstream/runtime:0.1.0"));
    }

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
