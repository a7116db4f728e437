//! The cluster client: `wsctl submit|get|logs|cancel|suspend|resume|checkpoint|tensorboard` on the
//! TrainingJobs of a Kubernetes cluster, through the user's kubeconfig as kubectl does. The same binary works as
//! a kubectl plugin when it is reachable as `kubectl-ws` on the PATH (`kubectl ws get`): clap's name is fixed, so
//! argv[0] does not matter.
//!
//! One module per concept: [`submit`] (create, then optionally watch), [`progress`] (status to text: the bar and
//! the per-change lines), [`watch`] (waiting on a job through the API's watch with a deadline), [`get`] (the
//! table), [`logs`] (the job's pods by the operator's labels), [`bundle`] (a job's post-mortem as one file),
//! [`control`] (cancel, suspend, resume),
//! [`portforward`] (a local port bridged to a pod through the API server), [`checkpoints`] (list and pull
//! over that bridge with the job's mutual-TLS identity), [`retained`] (a deleted job's checkpoints, read from
//! the claim it left through a short-lived reader pod), [`tensorboard`] (a job's records, fetched the same way),
//! [`events`] (a job's Events), [`dashboard`] (the jobs as `wsctl dashboard`'s source) and [`admin`] (an upgrade's storage migration).

mod admin;
mod bundle;
mod checkpoints;
mod control;
mod dashboard;
mod error;
mod events;
mod get;
pub(crate) mod logs;
mod portforward;
mod progress;
mod retained;
mod submit;
mod tensorboard;
#[cfg(test)]
mod testing;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use crds::TrainingJob;
use kube::Client;
use kube::api::Api;

pub use error::Error;

/// Waits longer than this are an error unless `--timeout` says otherwise: long enough for a small job, short
/// enough that a stuck script notices.
const DEFAULT_TIMEOUT: &str = "3600";

/// Where a command acts: the namespace flag, as kubectl spells it.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Namespace {
    /// The namespace (default: the manifest's, else the kubeconfig context's, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// The cluster commands, flattened into `wsctl`'s own.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Create a TrainingJob on the cluster from a manifest, and with --watch follow it to its end.
    Submit {
        /// The TrainingJob manifest (YAML; `-` reads it from standard input), checked here before anything is sent.
        job: PathBuf,
        #[command(flatten)]
        ns: Namespace,
        /// Follow the job's progress until it succeeds (exit 0) or fails (exit 1 with its message).
        #[arg(long)]
        watch: bool,
        /// Seconds --watch waits for the job's end before giving up.
        #[arg(long, default_value = DEFAULT_TIMEOUT)]
        timeout: u64,
    },
    /// List TrainingJobs with their phase, CS-2s, step, loss, ETA and queue position.
    Get {
        /// One job only.
        job: Option<String>,
        #[command(flatten)]
        ns: Namespace,
        /// Every namespace's jobs.
        #[arg(short = 'A', long, conflicts_with = "job")]
        all_namespaces: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: get::Output,
        /// Keep printing the job at every change of its status (with -o json one object per line) until it
        /// succeeds (exit 0) or fails (exit 1 with its reason), or --timeout passes; through suspends and resumes.
        #[arg(short = 'w', long, requires = "job")]
        watch: bool,
        /// Seconds --watch follows the job at most.
        #[arg(long, default_value = DEFAULT_TIMEOUT)]
        timeout: u64,
    },
    /// Print the logs of a job's pods (by default MemoryX's, the coordinator's); `logs export` writes a job's
    /// post-mortem bundle.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Logs {
        #[command(subcommand)]
        what: Option<bundle::Command>,
        /// The job.
        #[arg(required = true)]
        job: Option<String>,
        #[command(flatten)]
        ns: Namespace,
        /// The role whose pods to read: memoryx, swarmx, engine (or any role the appliance has).
        #[arg(long, default_value = "memoryx")]
        role: String,
        /// Only the pod(s) of this index (engine N; the SwarmX nodes numbered N at each level).
        #[arg(long)]
        index: Option<u32>,
        /// Keep printing new lines until the pods end or --timeout passes (waits for the pods to start).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines of each pod.
        #[arg(long)]
        tail: Option<i64>,
        /// Seconds -f follows (and waits for pods) at most.
        #[arg(long, default_value = DEFAULT_TIMEOUT)]
        timeout: u64,
    },
    /// Delete a job: the operator removes its pods and Secret, and keeps its checkpoint claims unless
    /// spec.checkpoint.retain is Delete (it says which and how to remove them); waits until it is gone.
    Cancel {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// Return once deletion is requested, without waiting for the job to be gone.
        #[arg(long)]
        no_wait: bool,
        /// Seconds to wait for the job to be gone.
        #[arg(long, default_value = "300")]
        timeout: u64,
    },
    /// Suspend a job: it checkpoints and gives its CS-2s back; waits until the status says Suspended.
    Suspend {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// Return once the request is written.
        #[arg(long)]
        no_wait: bool,
        /// Seconds to wait for the job to be Suspended.
        #[arg(long, default_value = "600")]
        timeout: u64,
    },
    /// Resume a suspended job from its checkpoint; waits until it is no longer Suspended.
    Resume {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// Return once the request is written.
        #[arg(long)]
        no_wait: bool,
        /// Seconds to wait for the job to leave Suspended.
        #[arg(long, default_value = "300")]
        timeout: u64,
    },
    /// Set a job's PriorityClass (spec.priorityClassName), which orders the queue and, where the operator
    /// preempts, decides whom a waiting job may take CS-2s from.
    SetPriority {
        /// The job.
        job: String,
        /// The PriorityClass (`kubectl get priorityclasses`).
        class: String,
        #[command(flatten)]
        ns: Namespace,
    },
    /// Set (KEY=VALUE) or remove (KEY-) labels of a job, e.g. kueue.x-k8s.io/queue-name=QUEUE.
    Label {
        /// The job.
        job: String,
        /// KEY=VALUE to set a label, KEY- to remove one.
        #[arg(required = true)]
        labels: Vec<control::LabelChange>,
        #[command(flatten)]
        ns: Namespace,
        /// Replace a label the job has already.
        #[arg(long)]
        overwrite: bool,
    },
    /// List or fetch a job's checkpoints: a running cluster job's from its MemoryX through the API server (a
    /// port-forward with the job's identity), a deleted job's from the claim it left (through a short-lived
    /// reader pod), or any MemoryX's by --url and --identity.
    Checkpoint {
        #[command(subcommand)]
        what: checkpoints::Command,
    },
    /// Fetch a job's TensorBoard event files and metrics (`tensorboard --logdir runs` then shows it): a running
    /// cluster job's from its MemoryX, a deleted one's from the claim it left, or any MemoryX's by --url and
    /// --identity.
    Tensorboard {
        #[command(subcommand)]
        what: tensorboard::Command,
    },
    /// A web page on this machine (http://127.0.0.1:PORT/, nothing beyond loopback) showing the jobs as they
    /// run: their table; for one job its loss and throughput curves, its appliance as a tree, its Events,
    /// checkpoints and each role's log. It reads the cluster with your kubeconfig, or local runs' folders.
    Dashboard {
        /// Local runs' folders (`wsctl run`'s --out) to show instead of a cluster's jobs.
        runs: Vec<PathBuf>,
        #[command(flatten)]
        ns: Namespace,
        /// Every namespace's jobs.
        #[arg(short = 'A', long, conflicts_with = "runs")]
        all_namespaces: bool,
        /// The loopback port to serve on (0: any free port; the address is printed first).
        #[arg(long, default_value = "8089")]
        port: u16,
    },
    /// A cluster administrator's commands (an upgrade's storage migration).
    Admin {
        #[command(subcommand)]
        what: admin::Command,
    },
}

/// Runs a cluster command on a runtime of its own (the rest of wsctl is synchronous).
pub fn run(command: Command) -> anyhow::Result<()> {
    if let Command::Checkpoint { what } = &command
        && let Some(done) = checkpoints::direct(what)
    {
        return done;
    }
    if let Command::Tensorboard { what } = &command
        && let Some(done) = tensorboard::direct(what)
    {
        return done;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(dispatch(command)).map_err(anyhow::Error::from)
}

async fn dispatch(command: Command) -> Result<(), Error> {
    let secs = Duration::from_secs;
    match command {
        Command::Submit { job, ns, watch, timeout } => submit::submit(&job, ns, watch, secs(timeout)).await,
        Command::Get { job: Some(job), ns, output, watch: true, timeout, .. } => {
            get::watch(&Cluster::connect(ns).await?, &job, output, secs(timeout)).await
        }
        Command::Get { job, ns, all_namespaces, output, .. } => {
            get::get(job.as_deref(), ns, all_namespaces, output).await
        }
        Command::Logs { what: Some(export), .. } => bundle::export(export).await,
        Command::Logs { what: None, job, ns, role, index, follow, tail, timeout } => {
            let options = logs::Options { role, index, follow, tail, timeout: secs(timeout) };
            logs::logs(&Cluster::connect(ns).await?, &job.unwrap_or_default(), options).await
        }
        Command::Cancel { job, ns, no_wait, timeout } => {
            control::cancel(&Cluster::connect(ns).await?, &job, (!no_wait).then(|| secs(timeout))).await
        }
        Command::Suspend { job, ns, no_wait, timeout } => {
            control::suspend(&Cluster::connect(ns).await?, &job, true, (!no_wait).then(|| secs(timeout))).await
        }
        Command::Resume { job, ns, no_wait, timeout } => {
            control::suspend(&Cluster::connect(ns).await?, &job, false, (!no_wait).then(|| secs(timeout))).await
        }
        Command::SetPriority { job, class, ns } => {
            control::set_priority(&Cluster::connect(ns).await?, &job, &class).await
        }
        Command::Label { job, labels, ns, overwrite } => {
            control::label(&Cluster::connect(ns).await?, &job, &labels, overwrite).await
        }
        Command::Checkpoint { what } => checkpoints::run(what).await,
        Command::Tensorboard { what } => tensorboard::run(what).await,
        Command::Admin { what } => admin::run(what).await,
        Command::Dashboard { runs, ns, all_namespaces, port } => serve_dashboard(runs, ns, all_namespaces, port).await,
    }
}

/// `wsctl dashboard`: local runs when folders are given, else the cluster's jobs; the address goes to standard
/// output first (`wsctl dashboard: http://127.0.0.1:PORT/`).
async fn serve_dashboard(runs: Vec<PathBuf>, ns: Namespace, all: bool, port: u16) -> Result<(), Error> {
    let ready = |addr: std::net::SocketAddr| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "wsctl dashboard: http://{addr}/ (Ctrl-C stops it)").and_then(|()| out.flush());
    };
    let served = if runs.is_empty() {
        let source = dashboard::ClusterJobs::new(Cluster::connect(ns).await?, all);
        crate::dashboard::server::serve(source, port, ready).await
    } else {
        let source = crate::dashboard::local::LocalRuns::open(runs).map_err(|e| Error::Invalid(format!("{e:#}")))?;
        crate::dashboard::server::serve(source, port, ready).await
    };
    served.map_err(|e| Error::Invalid(format!("{e:#}")))
}

/// What every cluster command needs: a client from the user's kubeconfig and the namespace it acts in.
pub struct Cluster {
    /// The API client.
    pub client: Client,
    /// The namespace commands act in.
    pub namespace: String,
}

impl Cluster {
    /// Connects with the user's kubeconfig (`KUBECONFIG`, `~/.kube/config`, or the pod's service account),
    /// acting in `ns` (else the context's namespace).
    pub async fn connect(ns: Namespace) -> Result<Cluster, Error> {
        let config = kube::Config::infer().await.map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let namespace = ns.namespace.unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Ok(Cluster { client, namespace })
    }

    /// The TrainingJobs of the namespace.
    pub fn jobs(&self) -> Api<TrainingJob> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Job `name`, or an error saying it (or the API) does not exist.
    pub async fn job(&self, name: &str) -> Result<TrainingJob, Error> {
        let action = format!("read TrainingJob {}/{name}", self.namespace);
        self.jobs().get(name).await.map_err(Error::api(action, &self.namespace, name))
    }
}
