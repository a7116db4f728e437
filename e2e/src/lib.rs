//! Helpers for the end-to-end tests: a client for a real API server (the one `apiserver/up.sh` starts, or
//! `KUBECONFIG`'s, so the same tests run on kind), the CRD, a namespace per test, an operator per test, and
//! the kubelet's part played by hand (there is none: tests set pod status themselves).

#![warn(missing_docs)]

pub mod browser;
pub mod cluster;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crds::TrainingJob;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use operator::config::Config;
use operator::coordinator::ScriptedCoordinator;
use operator::metrics::Shared;

/// Why the test environment could not be set up: every variant ends the test with a loud failure, never a
/// silent skip.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `up.sh` failed: the build, etcd or kube-apiserver.
    #[error("e2e/apiserver/up.sh failed (exit {code:?}); its stderr ends with:\n{stderr}")]
    ApiServer {
        /// The script's exit code.
        code: Option<i32>,
        /// The end of its stderr.
        stderr: String,
    },
    /// The script could not be started at all.
    #[error("cannot run {path}: {source}")]
    Spawn {
        /// The script.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kubeconfig or the client is unusable.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The API server said no.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A condition did not hold in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
}

/// The folder of the API-server scripts.
pub fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("apiserver")
}

/// Runs `up.sh` for instance `name` (ports shifted by `offset`) and returns the kubeconfig it wrote.
pub fn up(instance: &str, offset: u32) -> Result<PathBuf, Error> {
    let path = scripts().join("up.sh");
    let out = Command::new("bash")
        .arg(&path)
        .env("WS_APISERVER_INSTANCE", instance)
        .env("WS_APISERVER_PORT_OFFSET", offset.to_string())
        .output()
        .map_err(|source| Error::Spawn { path: path.clone(), source })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        return Err(Error::ApiServer {
            code: out.status.code(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim().to_string();
    Ok(PathBuf::from(last))
}

/// Stops instance `name` (its processes only; its data stays unless `wipe`).
pub fn down(instance: &str, wipe: bool) -> Result<(), Error> {
    let path = scripts().join("down.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&path).env("WS_APISERVER_INSTANCE", instance);
    if wipe {
        cmd.arg("--wipe");
    }
    let out = cmd.output().map_err(|source| Error::Spawn { path: path.clone(), source })?;
    if !out.status.success() {
        return Err(Error::ApiServer { code: out.status.code(), stderr: String::from_utf8_lossy(&out.stderr).into() });
    }
    Ok(())
}

/// A client for the kubeconfig at `path`.
pub async fn client_for(path: &Path) -> Result<Client, Error> {
    let kc = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))
}

/// The cluster under test: `KUBECONFIG`'s when set (kind, a real cluster), else the shared local API server,
/// started (and built, the first time) by `up.sh`.
pub async fn client() -> Result<Client, Error> {
    if std::env::var_os("KUBECONFIG").is_some() {
        return Client::try_default().await.map_err(|e| Error::Kubeconfig(e.to_string()));
    }
    let path = tokio::task::spawn_blocking(|| up("default", 0))
        .await
        .map_err(|e| Error::Kubeconfig(format!("up.sh task: {e}")))??;
    client_for(&path).await
}

/// Installs (or updates) the TrainingJob CRD with server-side apply and waits until it is established.
pub async fn install_crd(client: &Client) -> Result<(), Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds::crd().map_err(|e| Error::Kubeconfig(format!("the CRD: {e}")))?;
    let name = crd.name_any();
    crds.patch(&name, &PatchParams::apply("weightstream-e2e").force(), &Patch::Apply(&crd)).await?;
    wait_for(Duration::from_secs(30), "the CRD to be established", || {
        let crds = crds.clone();
        let name = name.clone();
        async move {
            let c = crds.get(&name).await.ok()?;
            let established = c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        }
    })
    .await?;
    // The API needs a moment after Established before it serves the new kind everywhere.
    let probe: Api<TrainingJob> = Api::all(client.clone());
    wait_for(Duration::from_secs(30), "TrainingJobs to be served", || {
        let probe = probe.clone();
        async move { probe.list(&ListParams::default().limit(1)).await.ok().map(|_| ()) }
    })
    .await
}

/// Creates a fresh namespace named after the test.
pub async fn namespace(client: &Client, prefix: &str) -> Result<String, Error> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let name = format!("{prefix}-{:x}", nanos % 0xffffff);
    let api: Api<Namespace> = Api::all(client.clone());
    // Every test's jobs run where Pod Security "restricted" is enforced, as on a shared cluster: a pod the
    // operator builds that breaks a rule is refused by the API server and the test fails.
    let labels = serde_json::json!({
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    });
    let ns: Namespace = serde_json::from_value(serde_json::json!({ "metadata": { "name": name, "labels": labels } }))
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    api.create(&PostParams::default(), &ns).await?;
    Ok(name)
}

/// The longest pause between two checks of [`wait_for`]: half the operator's fastest poll (1 s in the suite),
/// so a state the operator holds for one pass is still seen, while a long wait does not ask the API server ten
/// times a second (on the suite's 2 cores the API server's CPU is the other tests').
pub const POLL_CEILING: Duration = Duration::from_millis(500);

/// Polls `check` until it returns `Some`, or fails after `timeout` naming `what`: at once, then after 100 ms,
/// the pause growing by half each time up to [`POLL_CEILING`].
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(100);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Timeout(timeout, what.to_string()));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(POLL_CEILING);
    }
}

/// Polls job `name`'s status until `reached` holds for it or the job has ended (`Succeeded` or `Failed`), and
/// returns that status; fails after `timeout` naming `what`.
pub async fn job_until(
    jobs: &Api<TrainingJob>,
    name: &str,
    timeout: Duration,
    what: &str,
    reached: impl Fn(&crds::TrainingJobStatus) -> bool,
) -> Result<crds::TrainingJobStatus, Error> {
    wait_for(timeout, what, || async {
        let s = jobs.get(name).await.ok()?.status?;
        let ended = matches!(s.phase, Some(crds::Phase::Succeeded | crds::Phase::Failed));
        (reached(&s) || ended).then_some(s)
    })
    .await
}

/// [`job_until`] for a test: the status reached, or a panic naming what timed out and the job's status then.
pub async fn wait_job(
    jobs: &Api<TrainingJob>,
    name: &str,
    timeout: Duration,
    what: &str,
    reached: impl Fn(&crds::TrainingJobStatus) -> bool,
) -> crds::TrainingJobStatus {
    match job_until(jobs, name, timeout, what, reached).await {
        Ok(s) => s,
        Err(e) => panic!("{e}; status now: {:?}", jobs.get(name).await.ok().and_then(|j| j.status)),
    }
}

/// An operator running in this process, watching one namespace, until dropped.
pub struct RunningOperator {
    /// The stand-in for every job's MemoryX.
    pub coordinator: ScriptedCoordinator,
    /// Its metrics and readiness.
    pub shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), operator::Error>>>,
}

impl RunningOperator {
    /// Starts the operator for `namespace` with a pool of `pool` CS-2s and a SwarmX fan-out of 2.
    pub fn start(client: &Client, namespace: &str, pool: u32) -> RunningOperator {
        let config = Config {
            namespace: Some(namespace.into()),
            pool: Some(pool),
            fan_out: 2,
            poll: Duration::from_millis(300),
            ..Config::default()
        };
        RunningOperator::start_with(client, config)
    }

    /// Starts the operator with `config` as it is (the scale tests' fan-out and poll), talking through `client`
    /// (which may count its requests).
    pub fn start_with(client: &Client, config: Config) -> RunningOperator {
        let coordinator = ScriptedCoordinator::default();
        let shared = Shared::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(operator::reconcile::run(
            client.clone(),
            config,
            Arc::new(coordinator.clone()),
            shared.clone(),
            async move {
                let _ = rx.await;
            },
        ));
        RunningOperator { coordinator, shared, stop: Some(tx), task: Some(task) }
    }

    /// Stops it and waits until it has.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for RunningOperator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A valid job manifest with `cs2` engines (a tiny model, so every preset fits it).
pub fn job(name: &str, cs2: u32) -> TrainingJob {
    let mut j = crds::testing::mlp_job(name, "", cs2);
    // Created through the API: the namespace comes from the Api handle, the uid from the server.
    (j.metadata.namespace, j.metadata.uid) = (None, None);
    j.spec.training.steps = Some(100);
    j.spec.checkpoint.interval_steps = 10;
    j
}

/// Plays the kubelet: marks pod `name` Running and Ready (or Failed).
pub async fn set_pod_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Result<(), Error> {
    let ready = if phase == "Running" { "True" } else { "False" };
    let patch = serde_json::json!({
        "status": { "phase": phase, "conditions": [ { "type": "Ready", "status": ready } ] }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}
