//! Helpers for the tests that need a whole cluster, one whose kubelets really run the pods: `KUBECONFIG`'s
//! (kind, any cluster with the images loaded), or else the single node `cluster/up.sh` brings up on this
//! machine. The chart is installed with Helm (`e2e/tools/helm.sh` builds the pinned version unless `WS_HELM`
//! names a binary).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crds::TrainingJob;

/// Why a cluster test could not set up: each ends the test with a loud failure, never a skip.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A script or tool failed.
    #[error("{what} failed (exit {code:?}); its output ends with:\n{tail}")]
    Command {
        /// The command line, for the reader.
        what: String,
        /// Its exit code.
        code: Option<i32>,
        /// The end of its stderr and stdout.
        tail: String,
    },
    /// It could not be started at all.
    #[error("cannot run {what}: {source}")]
    Spawn {
        /// The command.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A manifest or a file could not be read.
    #[error("{0}")]
    Input(String),
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `wsctl` under test: `$WS_WSCTL`, else the release binary of the same build as the running test
/// (`target/<profile>/wsctl`, the test itself being `target/<profile>/deps/NAME-HASH`), which `cargo test
/// --workspace` builds for wsctl's own tests. The e2e tests and the Python suite all run this one binary, so no
/// test builds (and relinks under another running test) a binary of its own.
pub fn wsctl() -> Result<PathBuf, ClusterError> {
    let path = match std::env::var_os("WS_WSCTL") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().and_then(Path::parent).map(|d| d.join("wsctl")))
            .unwrap_or_else(|| repo_root().join("target/release/wsctl")),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(ClusterError::Input(format!(
            "no wsctl at {}: build it first (cargo build --release -p wsctl) or set WS_WSCTL",
            path.display()
        )))
    }
}

/// The final and held-out losses of `job` run undisturbed on this machine (`wsctl run`: local processes, `args`
/// besides, such as a SwarmX fan-out): what a disturbed cluster job must end with.
pub fn undisturbed(job: &TrainingJob, args: &[String]) -> Result<(f64, f64), ClusterError> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("ws-undisturbed-{name}-{}", std::process::id()));
    let input = |what: &str, e: &dyn std::fmt::Display| ClusterError::Input(format!("{what}: {e}"));
    std::fs::create_dir_all(&dir).map_err(|e| input("a folder for the undisturbed run", &e))?;
    let file = dir.join("job.yaml");
    let yaml = serde_yaml::to_string(job).map_err(|e| input("the job as YAML", &e))?;
    std::fs::write(&file, yaml).map_err(|e| input("the job's manifest", &e))?;
    let summary = run(Command::new(wsctl()?)
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(dir.join("out"))
        .args(args)
        .current_dir(repo_root()))
    .and_then(|_| std::fs::read_to_string(dir.join("out/summary.json")).map_err(|e| input("its summary.json", &e)));
    let _ = std::fs::remove_dir_all(&dir);
    let summary: serde_json::Value = serde_json::from_str(&summary?).map_err(|e| input("its summary.json", &e))?;
    match (summary["final_loss"].as_f64(), summary["eval"]["loss"].as_f64()) {
        (Some(loss), Some(eval)) => Ok((loss, eval)),
        _ => {
            Err(ClusterError::Input(format!("the undisturbed run's summary has no final and held-out loss: {summary}")))
        }
    }
}

/// [`undisturbed`] on a blocking thread started now and awaited when the cluster's job is done: the local run
/// computes while the cluster's job mostly waits out its faults, instead of before it.
pub fn undisturbed_beside(job: &TrainingJob, args: &[&str]) -> tokio::task::JoinHandle<(f64, f64)> {
    let (job, args) = (job.clone(), args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    tokio::task::spawn_blocking(move || undisturbed(&job, &args).unwrap_or_else(|e| panic!("the undisturbed run: {e}")))
}

/// Waits for job `name` to end and asserts that it succeeded with exactly `steps` steps and the final and
/// held-out losses of its undisturbed run `want` ([`undisturbed_beside`]), bit for bit; returns its status.
pub async fn ends_undisturbed(
    jobs: &kube::Api<TrainingJob>,
    name: &str,
    steps: u64,
    want: tokio::task::JoinHandle<(f64, f64)>,
) -> crds::TrainingJobStatus {
    let done = crate::wait_job(jobs, name, Duration::from_secs(900), "the job to end", |_| false).await;
    assert_eq!((done.phase, done.progress.step), (Some(crds::Phase::Succeeded), Some(steps)), "{name}: {done:?}");
    let (loss, eval) = want.await.unwrap_or_else(|e| panic!("the undisturbed run of {name}: {e}"));
    eprintln!(
        "{name}: final loss {:?} (undisturbed {loss}), held-out {:?} ({eval})",
        done.progress.loss, done.progress.eval_loss
    );
    assert_eq!(done.progress.loss, Some(loss), "{name}: the undisturbed final loss, bit for bit");
    assert_eq!(done.progress.eval_loss, Some(eval), "{name}: the undisturbed held-out loss, bit for bit");
    done
}

/// Runs `cmd`, returning its stdout; a failure carries the end of its output.
pub fn run(cmd: &mut Command) -> Result<String, ClusterError> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| ClusterError::Spawn { what: what.clone(), source })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let both = format!("{}\n{}", String::from_utf8_lossy(&out.stderr), stdout);
        let lines: Vec<&str> = both.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        return Err(ClusterError::Command { what, code: out.status.code(), tail });
    }
    Ok(stdout)
}

fn last_line(s: &str) -> Result<PathBuf, ClusterError> {
    s.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| ClusterError::Input("the script printed no path".into()))
}

/// The kubeconfig of the cluster under test: the first file `KUBECONFIG` names, else the local single-node
/// cluster's, which `e2e/cluster/up.sh` starts (building its binaries the first time; the images must already be
/// in `target/images`, see `images/build.sh`).
pub fn kubeconfig() -> Result<PathBuf, ClusterError> {
    if let Some(v) = std::env::var_os("KUBECONFIG") {
        let first = std::env::split_paths(&v).next().unwrap_or_default();
        if first.as_os_str().is_empty() {
            return Err(ClusterError::Input("KUBECONFIG is set but empty".into()));
        }
        return Ok(first);
    }
    let script = repo_root().join("e2e/cluster/up.sh");
    let out = run(Command::new("bash").arg(&script))?;
    last_line(&out)
}

/// The Helm binary: `WS_HELM`, else the pinned version `e2e/tools/helm.sh` builds and caches.
pub fn helm() -> Result<PathBuf, ClusterError> {
    if let Some(h) = std::env::var_os("WS_HELM") {
        return Ok(PathBuf::from(h));
    }
    let out = run(Command::new("bash").arg(repo_root().join("e2e/tools/helm.sh")))?;
    last_line(&out)
}

/// Where the chart goes.
pub const RELEASE: &str = "weightstream";
/// The chart's namespace.
pub const SYSTEM_NAMESPACE: &str = "weightstream-system";
/// CS-2 devices the device plugin advertises on each node (the chart value the tests install with).
pub const CS2_PER_NODE: u32 = 4;

/// `helm upgrade --install` of `charts/weightstream` with the device plugin on (so the pool is the nodes'
/// `weightstream.dev/cs2`), waiting until its pods are ready. Extra `--set` values come from `WS_HELM_SET`
/// (comma-separated `key=value`, e.g. image tags other than the chart's appVersion).
pub fn install_chart(kubeconfig: &Path) -> Result<(), ClusterError> {
    install_chart_with(kubeconfig, &[])
}

/// [`install_chart`] with `values` (`key=value`) set besides: a test binary that needs another configuration
/// (a SwarmX fan-out of 2 for a deeper tree, fewer CS-2s per node) installs it so; the next binary's
/// [`with_chart`] puts the defaults back.
pub fn install_chart_with(kubeconfig: &Path, values: &[&str]) -> Result<(), ClusterError> {
    let helm = helm()?;
    let mut cmd = Command::new(helm);
    cmd.arg("upgrade")
        .arg("--install")
        .arg(RELEASE)
        .arg(repo_root().join("charts/weightstream"))
        .args(["--namespace", SYSTEM_NAMESPACE, "--create-namespace"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--set", "devicePlugin.enabled=true"])
        .args(["--set", &format!("devicePlugin.devicesPerNode={CS2_PER_NODE}")])
        .args(["--set", "operator.pollSeconds=1"])
        .args(["--wait", "--timeout", "5m"]);
    for kv in values {
        cmd.args(["--set", kv]);
    }
    if let Ok(extra) = std::env::var("WS_HELM_SET") {
        for kv in extra.split(',').filter(|s| !s.trim().is_empty()) {
            cmd.args(["--set", kv.trim()]);
        }
    }
    run(&mut cmd).map(|_| ())
}

/// The cluster with the chart installed, as every whole-cluster test file starts: its kubeconfig, or one error
/// that says why not; set up once per test binary, whose tests all share it. When Helm gives up waiting, the
/// error also names what the nodes report (a pressure condition, a node not ready), since "context deadline
/// exceeded" alone does not say that the kubelet refused the chart's pods.
pub fn with_chart() -> Result<PathBuf, String> {
    static SETUP: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    SETUP
        .get_or_init(|| {
            let kc = kubeconfig().map_err(|e| format!("no cluster for the e2e suite: {e}"))?;
            match install_chart(&kc) {
                Ok(()) => Ok(kc),
                Err(e) => {
                    Err(format!("cannot install charts/weightstream: {e}\nthe nodes report: {}", node_trouble(&kc)))
                }
            }
        })
        .clone()
}

/// What the cluster's nodes report that would keep pods off them: each node that is not Ready, and any other
/// condition of theirs that is True (a `*Pressure`, `NetworkUnavailable`), with the kubelet's message;
/// "nothing wrong" if none. Asked on a thread of its own
/// (the callers are inside a test's runtime) and given 20 seconds.
pub fn node_trouble(kubeconfig: &Path) -> String {
    use k8s_openapi::api::core::v1::Node;
    let kc = kubeconfig.to_path_buf();
    let ask = std::thread::spawn(move || -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let answer = rt.block_on(async move {
            let list = tokio::time::timeout(Duration::from_secs(20), async {
                let client = crate::client_for(&kc).await.map_err(|e| e.to_string())?;
                let nodes: kube::Api<Node> = kube::Api::all(client);
                nodes.list(&kube::api::ListParams::default()).await.map_err(|e| e.to_string())
            })
            .await
            .map_err(|_| "the API server did not answer in 20 s".to_string())??;
            let mut trouble = Vec::new();
            for node in list {
                let name = node.metadata.name.clone().unwrap_or_default();
                for c in node.status.and_then(|s| s.conditions).unwrap_or_default() {
                    let bad = if c.type_ == "Ready" { c.status != "True" } else { c.status == "True" };
                    if bad {
                        let why = c.message.unwrap_or_default();
                        trouble.push(format!("{name}: {}={} ({why})", c.type_, c.status));
                    }
                }
            }
            Ok(if trouble.is_empty() { "nothing wrong".into() } else { trouble.join("; ") })
        });
        // Not waiting on whatever the client left running (a name lookup that hangs, say): the answer is in.
        rt.shutdown_timeout(Duration::from_secs(1));
        answer
    });
    match ask.join() {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => format!("(cannot ask them: {e})"),
        Err(_) => "(cannot ask them: the asking thread panicked)".into(),
    }
}

/// An example manifest from `examples/jobs/`, parsed as the operator parses it.
pub fn example(file: &str) -> Result<TrainingJob, ClusterError> {
    let path = repo_root().join("examples/jobs").join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| ClusterError::Input(format!("{}: {e}", path.display())))?;
    crds::parse_training_job(&text).map_err(|e| ClusterError::Input(format!("{}: {e}", path.display())))
}

/// The invalid examples (`examples/jobs/invalid/*.yaml`), each with the text its `# refused with:` comment says
/// the API server's answer must contain.
pub fn invalid_examples() -> Result<Vec<(PathBuf, String, String)>, ClusterError> {
    let dir = repo_root().join("examples/jobs/invalid");
    let mut out = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| ClusterError::Input(format!("{}: {e}", dir.display())))?;
    for e in entries {
        let path = e.map_err(|e| ClusterError::Input(e.to_string()))?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("yaml") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| ClusterError::Input(format!("{}: {e}", path.display())))?;
        let want = text
            .lines()
            .find_map(|l| l.strip_prefix("# refused with:"))
            .map(|s| s.trim().to_string())
            .ok_or_else(|| ClusterError::Input(format!("{} has no '# refused with:' line", path.display())))?;
        out.push((path, text, want));
    }
    out.sort();
    Ok(out)
}

/// Steps the cluster tests train for: `WS_E2E_STEPS`, else `default`.
pub fn steps(default: u64) -> u64 {
    std::env::var("WS_E2E_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// How long a test may wait for a job to finish: `WS_E2E_JOB_TIMEOUT_SECS`, else `default`.
pub fn job_timeout(default: Duration) -> Duration {
    std::env::var("WS_E2E_JOB_TIMEOUT_SECS").ok().and_then(|s| s.parse().ok()).map_or(default, Duration::from_secs)
}

/// What a TCP connection attempt from inside a pod's network namespace came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The handshake completed.
    Connected,
    /// The attempt failed at once (a RST or an ICMP reject: NetworkPolicy agents such as kube-router reject),
    /// with the error text.
    Refused(String),
    /// No answer before the deadline (a dropped SYN).
    TimedOut,
}

/// The host pid of a running pod's first container: the process whose pid in its own namespace is 1 and whose
/// cgroup path names the container's id. Only for a cluster whose node is this machine (`e2e/cluster/up.sh`),
/// with the test running as root; elsewhere it fails, naming why.
pub fn container_pid(pod: &k8s_openapi::api::core::v1::Pod) -> Result<u32, ClusterError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.container_id.clone())
        .ok_or_else(|| ClusterError::Input(format!("pod {name} has no running container")))?;
    let id = id.rsplit("://").next().unwrap_or_default().to_string();
    if id.len() < 12 {
        return Err(ClusterError::Input(format!("pod {name}: container id {id:?} is not one")));
    }
    let procs = std::fs::read_dir("/proc").map_err(|e| ClusterError::Input(format!("/proc: {e}")))?;
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { continue };
        if !cgroup.contains(&id) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let ns_pid = status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|v| v.split_whitespace().last());
        if ns_pid == Some("1") {
            return Ok(pid);
        }
    }
    Err(ClusterError::Input(format!(
        "no process of pod {name}'s container {id} on this machine (is the node this machine, and are we root?)"
    )))
}

/// Tries a TCP connection to `ip:port` from inside the network namespace of host process `pid` (a pod's
/// container), so it leaves from that pod's address and meets the same NetworkPolicy rules the pod would. Bash's
/// `/dev/tcp` makes the connection; `timeout` bounds it by `deadline`.
pub fn tcp_connect_from(pid: u32, ip: &str, port: u16, deadline: Duration) -> Result<Reach, ClusterError> {
    let secs = deadline.as_secs().max(1).to_string();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "timeout", "--kill-after=2", &secs, "bash", "-c", r#"exec 3<>"/dev/tcp/$0/$1""#, ip])
        .arg(port.to_string());
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| ClusterError::Spawn { what: what.clone(), source })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => Ok(Reach::Connected),
        Some(124 | 137) => Ok(Reach::TimedOut),
        Some(1) if !stderr.contains("nsenter:") => Ok(Reach::Refused(stderr)),
        code => Err(ClusterError::Command { what, code, tail: stderr }),
    }
}

/// A process stopped with SIGSTOP until this guard goes: dropping it (also when a test panics) sends SIGCONT,
/// so a failed test never leaves a frozen container behind.
pub struct Stopped {
    pid: u32,
}

impl Stopped {
    /// Sends SIGSTOP to `pid` and waits (at most 5 s) until the kernel reports it stopped (state `T`).
    pub fn stop(pid: u32) -> Result<Stopped, ClusterError> {
        run(Command::new("kill").args(["-STOP", &pid.to_string()]))?;
        let guard = Stopped { pid };
        // A stop reaches every thread asynchronously: the state turns `T` within moments.
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses and may hold spaces.
            stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()).unwrap_or("?").to_string()
        };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while state() != "T" {
            if std::time::Instant::now() > until {
                return Err(ClusterError::Input(format!("pid {pid} is in state {} 5 s after SIGSTOP, not T", state())));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(guard)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid.to_string()]).status();
    }
}
