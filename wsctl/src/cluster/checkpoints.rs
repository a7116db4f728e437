//! `wsctl checkpoint list|pull JOB`: a running cluster job's checkpoints, fetched from its MemoryX through the
//! API server (a [`Forward`] to MemoryX's HTTP port) over HTTPS with mutual TLS, presenting the job's own
//! identity from the Secret the operator made for it: MemoryX trusts that job's CA and nothing else, so reading
//! the Secret (RBAC on the namespace) is what grants access. The transfer itself is [`crate::checkpoint`]'s
//! (bounded, verified, renamed into place); with `--url` and `--identity` instead of a job, that client is
//! used directly on any MemoryX (a local run's). A deleted job's checkpoints, kept in its claims
//! (`spec.checkpoint.retain: Retain`), are read the same way from a short-lived reader pod ([`retained`]).

use std::path::PathBuf;
use std::time::Duration;

use crds::contract::{HTTP_PORT, Role};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use wire::identity::{CA_CERT, CERT, Identity, KEY};

use super::portforward::Forward;
use super::{Cluster, Error, Namespace, progress, retained};
use crds::contract::{JOB_LABEL, ROLE_LABEL};

/// Whose checkpoints: a cluster job's by name (through the API server), or any MemoryX's by its address and the
/// job's identity. Both commands take it alike.
#[derive(clap::Args)]
pub struct Source {
    /// The job on the cluster (reached through the API server); or give --url and --identity.
    #[arg(value_name = "JOB", required_unless_present = "url")]
    pub(super) name: Option<String>,
    #[command(flatten)]
    pub(super) ns: Namespace,
    /// MemoryX's HTTPS address, https://HOST:PORT (its `http` address; a port-forward to it).
    #[arg(long, requires = "identity", conflicts_with = "name")]
    pub(super) url: Option<String>,
    /// A folder with the job's identity: ca.crt, tls.crt, tls.key (with --url).
    #[arg(long, requires = "url")]
    pub(super) identity: Option<PathBuf>,
}

/// `wsctl checkpoint …`: of a cluster job by name, or of any MemoryX by `--url` and `--identity`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// List the checkpoints MemoryX holds, newest first.
    List {
        #[command(flatten)]
        from: Source,
        /// Print the listing as JSON (`[{"step", "file", "bytes", "slices"?}]`, newest first).
        #[arg(long)]
        json: bool,
        /// Seconds the whole command may take (for a cluster job).
        #[arg(long, default_value = "120")]
        timeout: u64,
    },
    /// Fetch one checkpoint (the newest unless --step), verified before it is kept.
    Pull {
        #[command(flatten)]
        from: Source,
        /// The step of the checkpoint to fetch (default: the newest).
        #[arg(long)]
        step: Option<u64>,
        /// The folder to write it into.
        #[arg(short, long, default_value = ".")]
        out: PathBuf,
        /// The job's manifest: bounds the download by the job's plan (with --url; a cluster job's own spec does).
        #[arg(long, requires = "url")]
        job: Option<PathBuf>,
        /// Seconds the whole command may take (for a cluster job).
        #[arg(long, default_value = "600")]
        timeout: u64,
    },
}

/// The `--url` form, which needs no cluster (and runs on [`crate::checkpoint`]'s own runtime): `None` for the
/// cluster form.
pub fn direct(command: &Command) -> Option<anyhow::Result<()>> {
    match command {
        Command::List { from: Source { url: Some(url), identity: Some(id), .. }, json, .. } => {
            Some(crate::checkpoint::list_command(url, id, *json))
        }
        Command::Pull { from: Source { url: Some(url), identity: Some(id), .. }, step, out, job, .. } => {
            Some(crate::checkpoint::pull_command(url, id, *step, out, job.as_deref()))
        }
        _ => None,
    }
}

/// Runs the cluster form within its deadline.
pub async fn run(command: Command) -> Result<(), Error> {
    let (name, ns, timeout) = match &command {
        Command::List { from, timeout, .. } | Command::Pull { from, timeout, .. } => {
            (from.name.clone().unwrap_or_default(), from.ns.clone(), Duration::from_secs(*timeout))
        }
    };
    let cluster = Cluster::connect(ns).await?;
    let ns = cluster.namespace.clone();
    within_deadline(&cluster, &name, timeout, "the checkpoint transfer", async |source| {
        transfer(&command, source, &ns, &name).await
    })
    .await
}

/// Runs `transfer` on the job's [`Origin`] within `timeout` (`what` names the transfer if time runs out), and
/// closes the reader pod it may have needed, whatever the outcome.
pub(super) async fn within_deadline<T>(
    cluster: &Cluster,
    name: &str,
    timeout: Duration,
    what: &str,
    transfer: impl AsyncFnOnce(&Origin) -> Result<T, Error>,
) -> Result<T, Error> {
    let work = async {
        let source = connect(cluster, name, timeout).await?;
        let done = transfer(&source).await;
        if let Some(reader) = source.reader {
            reader.close().await;
        }
        done
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(Error::Timeout { after: timeout, what: what.into(), last: None }))
}

/// Where the checkpoints are read: a live job's MemoryX, or a deleted job's retained claim through a reader pod.
pub(super) struct Origin {
    /// The job, when it still exists: its plan bounds a download.
    job: Option<crds::TrainingJob>,
    /// The forward to a live job's MemoryX (a reader holds its own).
    forward: Option<Forward>,
    /// The reader of a deleted job's claim.
    reader: Option<retained::Reader>,
    /// The base URL to call.
    pub(super) base: String,
    /// The identity to present.
    pub(super) identity: Identity,
}

impl Origin {
    /// `e`, the failure of `what`, as the command's error, with why the forward under this origin failed if it
    /// did (a pod gone, a port-forward refused).
    pub(super) fn failed(&self, what: String, e: anyhow::Error) -> Error {
        let forward = self.forward.as_ref().or(self.reader.as_ref().map(|r| &r.forward));
        let why = forward.and_then(Forward::failure).map(|f| format!(" ({f})")).unwrap_or_default();
        Error::Checkpoint { what, message: format!("{e:#}{why}") }
    }
}

/// Lists or pulls from `source`.
async fn transfer(command: &Command, source: &Origin, ns: &str, name: &str) -> Result<(), Error> {
    let failed = |what: &str, e: anyhow::Error| source.failed(format!("{what} of {ns}/{name}"), e);
    match command {
        Command::List { json, .. } => {
            let entries =
                crate::checkpoint::list(&source.base, &source.identity).await.map_err(|e| failed("list", e))?;
            print!("{}", crate::checkpoint::listing(&entries, *json));
        }
        Command::Pull { step, out, .. } => {
            // A deleted job's plan is gone with it: the listing's announced size bounds the download then.
            let max = source.job.as_ref().map(|j| crate::checkpoint::planned_bytes(&j.spec));
            let path = crate::checkpoint::pull(&source.base, &source.identity, *step, out, max)
                .await
                .map_err(|e| failed("pull", e))?;
            println!("{}", path.display());
        }
    }
    Ok(())
}

/// The job's checkpoints: from its running MemoryX pod when the job exists (a local forward to its HTTP port,
/// called as `https://127.0.0.1:PORT` with the job's identity), else from its claim through a reader pod
/// ([`retained`]): the claim a deleted job left, or that of a job whose MemoryX is scaled to zero.
async fn connect(cluster: &Cluster, name: &str, timeout: Duration) -> Result<Origin, Error> {
    let ns = &cluster.namespace;
    let action = format!("read TrainingJob {ns}/{name}");
    let Some(job) = cluster.jobs().get_opt(name).await.map_err(Error::api(action, ns, name))? else {
        let reader = retained::open(cluster, name, None, timeout).await.map_err(|e| match e {
            Error::NotFound { .. } => Error::Invalid(format!(
                "no TrainingJob {name} in namespace {ns}, and no checkpoint claim left by a deleted one (label \
                 {JOB_LABEL}={name}): `wsctl get -n {ns}` lists the jobs, `kubectl get pvc -n {ns} -l {JOB_LABEL}` \
                 the claims jobs left"
            )),
            other => other,
        })?;
        eprintln!("wsctl: TrainingJob {ns}/{name} is gone; reading the checkpoints it left in claim {}", reader.claim);
        let (base, identity) = (reader.base.clone(), reader.identity.clone());
        return Ok(Origin { job: None, forward: None, reader: Some(reader), base, identity });
    };
    let Some(pod) = running_memoryx(cluster, name).await? else {
        // A suspended or failed job's MemoryX is scaled to zero, and its claim free: read it as a deleted job's.
        let uid = job.uid().unwrap_or_default();
        let reader = retained::open(cluster, name, Some(&uid), timeout).await.map_err(|e| match e {
            Error::NotFound { .. } => Error::Invalid(format!(
                "TrainingJob {ns}/{name} ({}) has no running MemoryX pod and no checkpoint claim yet",
                progress::phase(&job)
            )),
            other => other,
        })?;
        eprintln!("wsctl: MemoryX of {ns}/{name} is not running; reading its checkpoints from claim {}", reader.claim);
        let (base, identity) = (reader.base.clone(), reader.identity.clone());
        return Ok(Origin { job: Some(job), forward: None, reader: Some(reader), base, identity });
    };
    live(cluster, job, &pod).await
}

/// The running MemoryX pod of job `name` (its coordinator), if one runs.
pub(super) async fn running_memoryx(cluster: &Cluster, name: &str) -> Result<Option<String>, Error> {
    let ns = &cluster.namespace;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let selector = format!("{JOB_LABEL}={name},{ROLE_LABEL}={}", Role::Memoryx);
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::other(format!("list the MemoryX pod of {ns}/{name}")))?;
    Ok(list
        .items
        .iter()
        .find(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata.deletion_timestamp.is_none()
        })
        .map(|p| p.name_any()))
}

/// A live job's MemoryX pod `pod`: a local forward to its HTTP port, called as `https://127.0.0.1:PORT` with
/// the job's identity.
pub(super) async fn live(cluster: &Cluster, job: crds::TrainingJob, pod: &str) -> Result<Origin, Error> {
    let name = job.name_any();
    let identity = identity(cluster, &name).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let forward = Forward::start(pods, pod, HTTP_PORT).await?;
    let base = format!("https://{}", forward.addr);
    Ok(Origin { job: Some(job), forward: Some(forward), reader: None, base, identity })
}

/// The job's identity from the Secret `<job>-identity` the operator created.
async fn identity(cluster: &Cluster, job: &str) -> Result<Identity, Error> {
    let name = format!("{job}-identity");
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let action = format!(
        "read the job's identity Secret {}/{name} (MemoryX accepts only the job's certificate)",
        cluster.namespace
    );
    let secret = secrets.get(&name).await.map_err(Error::other(action))?;
    let file = |key: &str| -> Result<String, Error> {
        let bytes = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone()).unwrap_or_default();
        String::from_utf8(bytes)
            .ok()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::Invalid(format!("Secret {}/{name} has no PEM text under {key}", cluster.namespace)))
    };
    Ok(Identity::from_pem(&file(CA_CERT)?, &file(CERT)?, &file(KEY)?))
}
