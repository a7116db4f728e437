//! What can go wrong talking to a cluster, each as one sentence saying what is wrong and what to do.

use std::time::Duration;

/// Why a cluster command failed. Every message names the object and suggests the next step, because the user
/// reads it in a terminal with no other context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No kubeconfig (nor in-cluster service account) could be loaded.
    #[error(
        "no usable kubeconfig ({0}): set KUBECONFIG to your cluster's kubeconfig (the one kubectl uses) or write \
         ~/.kube/config"
    )]
    Kubeconfig(String),
    /// The API server does not serve `trainingjobs.weightstream.dev`.
    #[error(
        "the cluster has no TrainingJob API (trainingjobs.weightstream.dev/v1beta1 is not served): install \
         weightstream first (helm upgrade --install weightstream charts/weightstream -n weightstream-system \
         --create-namespace)"
    )]
    CrdMissing,
    /// The named job does not exist.
    #[error(
        "no TrainingJob {name} in namespace {namespace} (`wsctl get -n {namespace}` lists its jobs, `wsctl get -A` every namespace's)"
    )]
    NotFound {
        /// Where it was looked for.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A job of that name exists already.
    #[error(
        "TrainingJob {name} already exists in namespace {namespace}: change metadata.name, or remove the old one \
         with `wsctl cancel {name} -n {namespace}`"
    )]
    AlreadyExists {
        /// Where.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The manifest could not be read or is not a valid TrainingJob; nothing was sent.
    #[error("{label}: {message} (nothing was sent to the cluster)")]
    Manifest {
        /// The file, or "standard input".
        label: String,
        /// What is wrong with it.
        message: String,
    },
    /// The API server answered with a refusal (forbidden, invalid, conflict, ...).
    #[error("the API server refused to {action}: {message}")]
    Refused {
        /// What was attempted, e.g. "create TrainingJob ml/mnist".
        action: String,
        /// Its answer.
        message: String,
    },
    /// The API server could not be reached or answered nonsense.
    #[error("cannot {action}: {message} (is the cluster in your kubeconfig up? `kubectl cluster-info` checks)")]
    Unreachable {
        /// What was attempted.
        action: String,
        /// The client's error.
        message: String,
    },
    /// A wait ran out of time.
    #[error("timed out after {}s waiting for {what}{}; raise --timeout to wait longer", .after.as_secs(), last.as_ref().map(|l| format!(" (last seen: {l})")).unwrap_or_default())]
    Timeout {
        /// How long it waited.
        after: Duration,
        /// What for.
        what: String,
        /// The last state seen, if any.
        last: Option<String>,
    },
    /// The watched job failed.
    #[error("TrainingJob {namespace}/{name} failed: {message}")]
    JobFailed {
        /// Where.
        namespace: String,
        /// Its name.
        name: String,
        /// The status's explanation.
        message: String,
    },
    /// The job went away while it was waited for.
    #[error("TrainingJob {namespace}/{name} was deleted while waiting for it")]
    Deleted {
        /// Where.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The request makes no sense for the job as it is (a role that does not exist, a job with no pods now, ...).
    #[error("{0}")]
    Invalid(String),
    /// Fetching or writing checkpoints failed.
    #[error("checkpoint {what}: {message}")]
    Checkpoint {
        /// What was being done.
        what: String,
        /// Why it failed.
        message: String,
    },
    /// A local file or socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
}

impl Error {
    /// The error for a failed API call on TrainingJob `name` (empty for a list): a 404 is "no such job" when the
    /// server named the missing object, else the whole API is missing (the CRD is not installed).
    pub fn api(action: impl Into<String>, namespace: &str, name: &str) -> impl FnOnce(kube::Error) -> Error {
        let (action, namespace, name) = (action.into(), namespace.to_string(), name.to_string());
        move |e| match e {
            kube::Error::Api(s) if s.code == 404 => {
                let named = s.details.as_ref().is_some_and(|d| !d.name.is_empty());
                if named && !name.is_empty() { Error::NotFound { namespace, name } } else { Error::CrdMissing }
            }
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
                Error::AlreadyExists { namespace, name }
            }
            kube::Error::Api(s) => Error::Refused { action, message: format!("{} ({})", s.message, s.code) },
            other => Error::Unreachable { action, message: other.to_string() },
        }
    }

    /// The error for a failed API call on something other than a TrainingJob (pods, Secrets): no CRD guessing.
    pub fn other(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |e| match e {
            kube::Error::Api(s) => Error::Refused { action, message: format!("{} ({})", s.message, s.code) },
            other => Error::Unreachable { action, message: other.to_string() },
        }
    }

    /// A local I/O error, saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
