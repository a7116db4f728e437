//! The roles of the data plane and where each one listens.

/// Every role's HTTP port in a cluster: `/healthz`, `/metrics`, and MemoryX's `/status` and `/checkpoint`.
pub const HTTP_PORT: u16 = 8080;

/// Label every child of a job carries with the job's name: the operator finds (and cleans up) a job's children
/// by it, and `wsctl logs`/`checkpoint` find a job's pods by it, so it is spelled once, here.
pub const JOB_LABEL: &str = "weightstream.dev/job";
/// Label naming a pod's role ([`Role::as_str`]), for the same selectors and for people.
pub const ROLE_LABEL: &str = "weightstream.dev/role";
/// Label a job's checkpoint claims carry with the job's uid: a claim kept after its job was deleted
/// (`spec.checkpoint.retain: Retain`) is told from a later namesake's by it, and `wsctl` finds it by it.
pub const JOB_UID_LABEL: &str = "weightstream.dev/job-uid";
/// Annotation on a job's checkpoint claims naming the runtime image its MemoryX ran, and
/// [`PULL_POLICY_ANNOTATION`] its pull policy: `wsctl checkpoint` reads a deleted job's claim with that image.
pub const RUNTIME_IMAGE_ANNOTATION: &str = "weightstream.dev/runtime-image";
/// See [`RUNTIME_IMAGE_ANNOTATION`].
pub const PULL_POLICY_ANNOTATION: &str = "weightstream.dev/image-pull-policy";

/// Where an input worker's pod mounts the job's data volume (`spec.data.volume`), read-only: the paths of
/// `spec.data` are taken inside it.
pub const DATA_MOUNT: &str = "/var/run/weightstream/data";

/// The folder of a cluster job's checkpoint volume where its coordinator records the run (`metrics.jsonl`,
/// `summary.json`, TensorBoard event files), so the records outlive MemoryX's pod as the checkpoints do, and a
/// retained claim's reader serves them too.
pub const RUN_FOLDER: &str = "run";

/// Namespace label that lets a metrics scraper (Prometheus) in that namespace reach every job's HTTP port
/// (`/metrics`, `/healthz`) through the job's NetworkPolicy, which otherwise admits only the job's own pods
/// and the operator. Set to `"true"` by a cluster admin on the monitoring namespace.
pub const METRICS_SCRAPER_LABEL: &str = "weightstream.dev/metrics-scraper";

/// One kind of data-plane process. The operator labels pods with it, picks the program and the ports from it,
/// and the local runner names processes after it, so a role is spelled once (in the API as in labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")] // the schema's names: serde's own impls (contract/handshake.rs) use as_str
pub enum Role {
    /// The weight store and the job's coordinator.
    Memoryx,
    /// One node of the broadcast/reduce tree.
    Swarmx,
    /// One simulated CS-2.
    Engine,
    /// An input worker: reads, decodes, tokenizes and shards the data and serves each engine its samples.
    Input,
}

impl Role {
    /// Every role, in the order an appliance is brought up: input workers, engines, SwarmX, MemoryX.
    pub const ALL: [Role; 4] = [Role::Input, Role::Engine, Role::Swarmx, Role::Memoryx];

    /// The name in labels, logs and `wsctl node ROLE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Memoryx => "memoryx",
            Role::Swarmx => "swarmx",
            Role::Engine => "engine",
            Role::Input => "input",
        }
    }

    /// The program that runs the role in the runtime image.
    pub fn binary(self) -> &'static str {
        match self {
            Role::Memoryx => "memoryx",
            Role::Swarmx => "swarmx",
            Role::Engine => "sim-wse",
            Role::Input => "input",
        }
    }

    /// The gRPC (`Stage`) port a role serves in a cluster, with its port name; MemoryX only dials out.
    pub fn grpc_port(self) -> Option<(&'static str, u16)> {
        match self {
            Role::Memoryx => Some(("weights", 7400)),
            Role::Swarmx => Some(("fabric", 7100)),
            Role::Engine => Some(("engine", 7200)),
            Role::Input => Some(("input", 7300)),
        }
    }

    /// The role named `name` (`memoryx`, `swarmx`, `engine`, `input`), for labels read back from the API server.
    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The input workers that serve engine `engine` when each CS-2 has `per_cs2` of them: a contiguous block, so
/// worker `w` always serves engine `w / per_cs2`. The operator names pods and the local runner starts
/// processes from it, and an engine splits its shard over exactly these.
pub fn input_workers_of(engine: u32, per_cs2: u32) -> std::ops::Range<u32> {
    let per = per_cs2.max(1);
    engine * per..(engine + 1) * per
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roles_name_in_the_api_is_its_label() {
        for role in Role::ALL {
            assert_eq!(serde_json::to_value(role).unwrap(), serde_json::Value::from(role.as_str()));
            assert_eq!(Role::from_name(role.as_str()), Some(role));
        }
    }
}
