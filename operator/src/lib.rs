//! The weightstream operator: it turns a `TrainingJob` into an appliance (MemoryX, the SwarmX tree, one
//! engine per CS-2), admits jobs only when all their CS-2s are free, keeps the status true from MemoryX's
//! reports, and cleans up. A library, so the integration tests run the very controller the binary runs.

#![warn(missing_docs)]

pub mod admission;
pub mod applied;
pub mod children;
pub mod config;
pub mod coordinator;
pub mod decode;
pub mod deviceplugin;
pub mod kueue;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod postmortem;
pub mod reconcile;
pub mod slow_start;
pub mod status;

/// JSON logs at `info` (or `RUST_LOG`), the same for the operator and the device plugin: both run as pods
/// whose logs a cluster's collector parses.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// The field manager of every server-side apply, so ownership of fields is clear in `managedFields`.
pub const MANAGER: &str = "weightstream-operator";
/// The finalizer that lets the operator remove a job's children itself, so deletion cleans up even on a
/// cluster whose garbage collector is slow or absent.
pub const FINALIZER: &str = "weightstream.dev/cleanup";
/// The operator's namespace when `POD_NAMESPACE` is unset (the chart's usual release namespace): where the
/// leader Lease lives and from where every job's NetworkPolicy admits the operator.
pub const DEFAULT_NAMESPACE: &str = "weightstream-system";
/// The default data-plane image.
pub const DEFAULT_RUNTIME_IMAGE: &str = "weightstream/runtime:0.1.0";

/// `namespace/name`, the key that names a job in admission's claims, the logs and the scripted coordinator:
/// spelled in one place, so a claim looked up by key is the job a log line names.
pub fn job_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Why an operator step failed. One enum for the whole crate: reconcile's error policy and the binary's exit
/// both see every failure through it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The plan refuses the job (it cannot fit an engine).
    #[error("the plan refuses the job: {0}")]
    Plan(String),
    /// An object could not be serialized (a bug of ours).
    #[error("cannot serialize: {0}")]
    Serialize(String),
    /// An object from the API server lacks a field the server always sets.
    #[error("the object has no {0}")]
    MissingField(&'static str),
    /// MemoryX did not answer.
    #[error("MemoryX at {url} is unreachable: {message}")]
    Coordinator {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// Adding or removing the finalizer, or cleaning up, failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The operator's own configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// Another replica holds the lease, or it was lost.
    #[error("leadership: {0}")]
    Leadership(String),
}

impl Error {
    /// Whether the error is an optimistic-concurrency conflict (someone wrote the object first): retried at
    /// once rather than backed off.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 409)
    }
}
