//! Where a job's components find each other in the cluster: every role's URL through its headless Service's
//! per-pod DNS name on the role's fixed port, and the cluster as the wiring's [`Site`].

use std::net::SocketAddr;

use crds::TrainingJob;
use crds::contract::{CommonArgs, DATA_MOUNT, HTTP_PORT, Role};
use kube::ResourceExt;
use plan::wiring::{Component, Site};

use super::config_map::{CONFIG_DIR, JOB_FILE};
use super::identity::IDENTITY_DIR;
use super::names;

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
        ClusterSite {
            job: job.name_any(),
            namespace: job.namespace().unwrap_or_default(),
            data_volume: job.spec.data.volume.is_some(),
        }
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

/// The fixed port of `role`'s gRPC service (0 for a role without one).
pub(crate) fn grpc_port(role: Role) -> u16 {
    role.grpc_port().map_or(0, |(_, p)| p)
}

/// The arguments every role gets in a pod: the mounted manifest, the HTTP port on all interfaces, JSON logs.
pub(crate) fn common_args() -> CommonArgs {
    CommonArgs {
        http: SocketAddr::from(([0, 0, 0, 0], HTTP_PORT)),
        json_logs: true,
        ..CommonArgs::new(format!("{CONFIG_DIR}/{JOB_FILE}"), IDENTITY_DIR)
    }
}

/// Where a role's gRPC service listens in its pod.
pub(crate) fn listen(role: Role) -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], grpc_port(role)))
}
