//! `wsctl`'s cluster commands driven as a user drives them: the real release binary, run with `KUBECONFIG`, on
//! the cluster of `cluster.rs` (the chart installed with Helm, a namespace per test, deleted when it passes).
//!
//! - `submit --watch` prints one line per status change off a terminal: the steps rise and the last line is
//!   `Succeeded` at the last step; `logs -f` read MemoryX's and an engine's logs meanwhile; `get` (table and
//!   JSON) shows the job Succeeded at its step, also through a `kubectl-ws` symlink and `kubectl ws`; a manifest
//!   that does not parse is one error and nothing is created.
//! - `suspend` returns once the status says Suspended (CS-2s free), `resume` once it has left it, and the job
//!   finishes; `cancel` returns once the job is gone, and none of its children is left but its checkpoint claims.
//! - `checkpoint list` and `checkpoint pull` fetch a running job's checkpoint through a port-forward with the
//!   job's identity, and the file reads back as the runtime's checkpoint of the listed step; `tensorboard pull`
//!   fetches its TensorBoard event file, which holds every step so far once; `dashboard` shows it in a browser
//!   (every step on its curve, every pod in its tree).
//! - A deleted or cancelled job's checkpoints are kept in its claims and pull bit for bit as before the
//!   deletion (a reader pod mounts the claim); `retain: Delete` removes them with the job.
//!
//! The binary is `target/release/wsctl` beside this test's own (`cargo build --release -p wsctl` first), or
//! `WS_WSCTL`. Tests share the node's 4 CS-2s, so they take turns.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crds::{Phase, TrainingJob};
use e2e::{cluster, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The cluster with the chart (once per test binary), its kubeconfig, a client, and a fresh namespace.
async fn setup(prefix: &str) -> (PathBuf, Client, String) {
    let kc = cluster::with_chart().unwrap_or_else(|e| panic!("{e}"));
    let client = ok(e2e::client_for(&kc).await, "client");
    let ns = ok(e2e::namespace(&client, prefix).await, "namespace");
    (kc, client, ns)
}

async fn done(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    ok(api.delete(ns, &DeleteParams::default()).await.map(|_| ()), "delete the test's namespace");
}

/// The `wsctl` binary under test.
fn wsctl() -> PathBuf {
    cluster::wsctl().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `program args` with the cluster's kubeconfig, returning its output once it ends (at most 10 minutes).
async fn run_as(program: &Path, kc: &Path, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env("KUBECONFIG", kc).kill_on_drop(true);
    let what = format!("{} {}", program.display(), args.join(" "));
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output()).await;
    let out = ok(ok(out, &format!("{what} ran 10 minutes")), &what);
    eprintln!(
        "$ wsctl {}\n{}{}(exit {:?})",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status.code()
    );
    out
}

async fn wsctl_run(kc: &Path, args: &[&str]) -> Output {
    run_as(&wsctl(), kc, args).await
}

/// Runs wsctl and returns its stdout, failing the test (with its stderr) unless it exits 0.
async fn wsctl_ok(kc: &Path, args: &[&str]) -> String {
    let out = wsctl_run(kc, args).await;
    assert!(out.status.success(), "wsctl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `examples/jobs/fc-mnist-sparse.yaml` as `name` on 2 CS-2s for `steps` steps, a checkpoint every `every`
/// (the last 10 kept), written as a manifest file into the test's own folder.
fn manifest(dir: &Path, name: &str, steps: u64, every: u64) -> PathBuf {
    let mut j: TrainingJob = ok(cluster::example("fc-mnist-sparse.yaml"), "example");
    j.metadata.name = Some(name.into());
    j.spec.cs2 = 2;
    (j.spec.training.epochs, j.spec.training.steps) = (None, Some(steps));
    (j.spec.checkpoint.interval_steps, j.spec.checkpoint.keep) = (every, 10);
    let path = dir.join(format!("{name}.yaml"));
    ok(std::fs::create_dir_all(dir), "test folder");
    ok(std::fs::write(&path, ok(serde_yaml::to_string(&j), "yaml")), "write the manifest");
    path
}

fn scratch(ns: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ws-cli-{ns}"))
}

/// The `step A/B` of a `--watch` line.
fn step_of(line: &str) -> Option<(u64, u64)> {
    let rest = line.split("step ").nth(1)?;
    let (a, b) = rest.split_whitespace().next()?.split_once('/')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

async fn phase(jobs: &Api<TrainingJob>, name: &str) -> Option<Phase> {
    jobs.get(name).await.ok()?.status?.phase
}

/// Waits until the job trains past `step` (via the API, for the test's own timing).
async fn training_past(jobs: &Api<TrainingJob>, name: &str, step: u64) {
    let r = wait_for(Duration::from_secs(300), &format!("{name} to train past step {step}"), || async {
        let s = jobs.get(name).await.ok()?.status?;
        (s.phase == Some(Phase::Running) && s.progress.step? >= step).then_some(())
    })
    .await;
    if let Err(e) = r {
        panic!("{e}; status: {:#?}", jobs.get(name).await.ok().and_then(|j| j.status));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_watch_logs_and_get_follow_a_job_to_success() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-watch").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    let steps = 2000;

    // A manifest that does not parse: one error naming the file, and nothing reaches the cluster.
    let bad = dir.join("bad.yaml");
    let text = ok(std::fs::read_to_string(manifest(&dir, "broken", steps, 0)), "manifest");
    ok(std::fs::write(&bad, text.replace("batchSize: 128", "batchSize: 127")), "bad manifest");
    let out = wsctl_run(&kc, &["submit", &bad.display().to_string(), "-n", &ns, "--watch"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an invalid manifest was accepted");
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("batchSize") && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one error: {stderr}");
    assert!(ok(jobs.get_opt("broken").await, "get").is_none(), "the invalid job was created");

    // submit --watch in the background; the logs are followed while it trains.
    let path = manifest(&dir, "watched", steps, 0);
    let watch = tokio::spawn({
        let kc = kc.clone();
        let args = [
            "submit".to_string(),
            path.display().to_string(),
            "-n".into(),
            ns.clone(),
            "--watch".into(),
            "--timeout".into(),
            "300".into(),
        ];
        async move { run_as(&wsctl(), &kc, &args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    });
    ok(
        wait_for(Duration::from_secs(30), "the job to be created", || async {
            jobs.get_opt("watched").await.ok()?.map(|_| ())
        })
        .await,
        "submit",
    );
    let follow = |role: &'static str, index: Option<&'static str>| {
        let (kc, ns) = (kc.clone(), ns.clone());
        tokio::spawn(async move {
            let mut args = vec!["logs", "watched", "-n", &ns, "-f", "--timeout", "300", "--role", role];
            if let Some(i) = index {
                args.extend(["--index", i]);
            }
            run_as(&wsctl(), &kc, &args).await
        })
    };
    let (memoryx, engine) = (follow("memoryx", None), follow("engine", Some("1")));

    let out = ok(watch.await, "submit task");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "submit --watch failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first().copied(), Some(format!("trainingjob {ns}/watched created").as_str()), "{stdout}");
    let seen: Vec<(u64, u64)> = lines.iter().filter_map(|l| step_of(l)).collect();
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "steps go back: {seen:?}");
    assert!(seen.iter().all(|s| s.1 == steps), "the total is not {steps}: {seen:?}");
    let distinct: std::collections::BTreeSet<u64> = seen.iter().map(|s| s.0).collect();
    assert!(distinct.len() >= 2, "no progress between status lines: {stdout}");
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.starts_with(&format!("Succeeded step {steps}/{steps} (100%) loss ")), "last line: {last}");

    // MemoryX's log: it trained the job's steps to the end. An engine's log: it came up.
    let mx = ok(memoryx.await, "logs task");
    let mx_log = String::from_utf8_lossy(&mx.stdout);
    assert!(mx.status.success(), "logs -f memoryx: {}", String::from_utf8_lossy(&mx.stderr));
    assert!(mx_log.contains(&format!("\"total\":{steps}")), "MemoryX's log does not start training: {mx_log}");
    assert!(
        mx_log.contains(&format!("\"event\":\"done\",\"steps\":{steps}")),
        "MemoryX's log does not finish: {mx_log}"
    );
    let eng = ok(engine.await, "logs task");
    let eng_log = String::from_utf8_lossy(&eng.stdout);
    assert!(eng.status.success(), "logs -f engine 1: {}", String::from_utf8_lossy(&eng.stderr));
    assert!(eng_log.contains("engine ready") && eng_log.contains("\"index\":1"), "engine 1's log: {eng_log}");

    // get: the table, JSON, and the same through the kubectl plugin's name.
    let table = wsctl_ok(&kc, &["get", "-n", &ns]).await;
    let row =
        table.lines().find(|l| l.starts_with("watched ")).unwrap_or_else(|| panic!("no row for the job: {table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..4], ["watched", "Succeeded", "0/2", &format!("{steps}/{steps}")], "{table}");
    let json: serde_json::Value =
        ok(serde_json::from_str(&wsctl_ok(&kc, &["get", "watched", "-n", &ns, "-o", "json"]).await), "get -o json");
    assert_eq!((json["status"]["phase"].as_str(), json["status"]["step"].as_u64()), (Some("Succeeded"), Some(steps)));
    let plugin_dir = dir.join("bin");
    ok(std::fs::create_dir_all(&plugin_dir), "plugin folder");
    let plugin = plugin_dir.join("kubectl-ws");
    let _ = std::fs::remove_file(&plugin);
    ok(std::os::unix::fs::symlink(wsctl(), &plugin), "kubectl-ws symlink");
    let out = run_as(&plugin, &kc, &["get", "-n", &ns]).await;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout) == table,
        "kubectl-ws get differs from wsctl get"
    );
    // kubectl finds plugins on the PATH: `kubectl ws get` runs the same binary.
    let path_var = format!("{}:{}", plugin_dir.display(), std::env::var("PATH").unwrap_or_default());
    match tokio::process::Command::new("kubectl")
        .args(["ws", "get", "-n", &ns])
        .env("KUBECONFIG", &kc)
        .env("PATH", &path_var)
        .output()
        .await
    {
        Ok(out) => {
            assert!(out.status.success(), "kubectl ws get: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(String::from_utf8_lossy(&out.stdout), table, "kubectl ws get");
        }
        Err(e) => eprintln!("kubectl is not installed ({e}): only the kubectl-ws symlink was tried"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_resume_and_cancel_take_effect_before_they_return() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-control").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    let steps = 4000;

    wsctl_ok(&kc, &["submit", &manifest(&dir, "pausable", steps, 0).display().to_string(), "-n", &ns]).await;
    training_past(&jobs, "pausable", 100).await;
    let out = wsctl_ok(&kc, &["suspend", "pausable", "-n", &ns, "--timeout", "180"]).await;
    assert!(out.contains("pausable: Suspended step "), "{out}");
    // Returned only once the status said so: the CS-2s are free and the checkpoint is the suspend's.
    let s = ok(jobs.get("pausable").await, "get").status.unwrap_or_default();
    assert_eq!(s.phase, Some(Phase::Suspended));
    assert_eq!(s.allocated_cs2.unwrap_or(0), 0, "a suspended job holds CS-2s");
    let at = s.progress.last_checkpoint.map(|c| c.step).unwrap_or_else(|| panic!("suspended without a checkpoint"));
    assert!(at > 0 && at < steps, "suspended at step {at}");
    let table = wsctl_ok(&kc, &["get", "pausable", "-n", &ns]).await;
    assert!(table.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(1) == Some("Suspended")), "{table}");

    // Labels and the PriorityClass, while it waits: set, refused without --overwrite, removed; a class that does
    // not exist is refused before anything is written, one that does is set with its value.
    wsctl_ok(&kc, &["label", "pausable", "team=ml", "stage=try", "-n", &ns]).await;
    let out = wsctl_run(&kc, &["label", "pausable", "team=web", "-n", &ns]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("team=ml already"));
    wsctl_ok(&kc, &["label", "pausable", "team=web", "stage-", "--overwrite", "-n", &ns]).await;
    let labels = ok(jobs.get("pausable").await, "get").labels().clone();
    assert_eq!((labels.get("team").map(String::as_str), labels.get("stage")), (Some("web"), None), "{labels:?}");
    let out = wsctl_run(&kc, &["set-priority", "pausable", "no-such-class", "-n", &ns]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("'no-such-class' does not exist"));
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    let class = format!("{ns}-high");
    let pc = serde_json::json!({ "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": { "name": class }, "value": 1000 });
    ok(classes.create(&PostParams::default(), &ok(serde_json::from_value(pc), "class")).await, "create a class");
    let out = wsctl_ok(&kc, &["set-priority", "pausable", &class, "-n", &ns]).await;
    assert!(out.contains(&format!("set to {class} (value 1000)")), "{out}");
    let spec = ok(jobs.get("pausable").await, "get").spec;
    assert_eq!(spec.priority_class_name.as_deref(), Some(class.as_str()));

    let out = wsctl_ok(&kc, &["resume", "pausable", "-n", &ns, "--timeout", "180"]).await;
    assert!(out.contains("resume requested"), "{out}");
    assert_ne!(phase(&jobs, "pausable").await, Some(Phase::Suspended), "resume returned while still Suspended");
    let r = wait_for(Duration::from_secs(300), "pausable to finish after its resume", || async {
        let p = phase(&jobs, "pausable").await?;
        p.is_terminal().then_some(p)
    })
    .await;
    assert_eq!(ok(r, "resume"), Phase::Succeeded);
    let s = ok(jobs.get("pausable").await, "get").status.unwrap_or_default();
    assert_eq!(s.progress.step, Some(steps));

    let _ = classes.delete(&class, &DeleteParams::default()).await;

    // Suspending a finished job is refused, saying why.
    let out = wsctl_run(&kc, &["suspend", "pausable", "-n", &ns]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nothing to suspend"));

    // cancel: a running job and every child of it but its checkpoint claims go before it returns (pods may take
    // their grace period); it says which claims it keeps (`spec.checkpoint.retain: Retain`, the default).
    wsctl_ok(&kc, &["submit", &manifest(&dir, "doomed", steps, 0).display().to_string(), "-n", &ns]).await;
    training_past(&jobs, "doomed", 1).await;
    let uid = ok(jobs.get("doomed").await, "get").uid().unwrap_or_default();
    let out = wsctl_ok(&kc, &["cancel", "doomed", "-n", &ns, "--timeout", "180"]).await;
    assert!(out.contains(&format!("trainingjob {ns}/doomed deleted")), "{out}");
    assert!(
        out.contains("checkpoints kept in claim") && out.contains(&format!("weightstream.dev/job-uid={uid}")),
        "{out}"
    );
    assert!(ok(jobs.get_opt("doomed").await, "get").is_none(), "cancel returned with the job still there");
    let sel = ListParams::default().labels("weightstream.dev/job=doomed");
    let left = || async {
        let mut v: Vec<String> = Vec::new();
        let names = |l: Vec<String>, kind: &str| l.into_iter().map(|n| format!("{kind}/{n}")).collect::<Vec<_>>();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        v.extend(names(pods.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "pod"));
        let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        v.extend(names(sts.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "statefulset"));
        let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
        v.extend(names(svcs.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "service"));
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        v.extend(names(cms.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "configmap"));
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        v.extend(names(pvcs.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "pvc"));
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        v.extend(names(secrets.list(&sel).await.ok()?.items.iter().map(|o| o.name_any()).collect(), "secret"));
        Some(v)
    };
    // The pods are gone by the time cancel returns: the name can be used again at once. The claims stay.
    let at_return: Vec<String> =
        left().await.unwrap_or_default().into_iter().filter(|c| c.starts_with("pod/")).collect();
    assert!(at_return.is_empty(), "cancel returned with {at_return:?} still there");
    let kept: Vec<String> = left().await.unwrap_or_default().into_iter().filter(|c| c.starts_with("pvc/")).collect();
    assert!(!kept.is_empty() && kept.iter().all(|c| c.contains(&uid)), "the claims kept are the job's own: {kept:?}");
    let r = wait_for(Duration::from_secs(120), "every child of doomed but its claims to go", || async {
        left().await.filter(|v| v.iter().all(|c| c.starts_with("pvc/"))).map(|_| ())
    })
    .await;
    if let Err(e) = r {
        panic!("{e}; still there: {:?}", left().await);
    }
    // And a job that is not there is one clear error.
    let out = wsctl_run(&kc, &["cancel", "doomed", "-n", &ns, "--timeout", "10"]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no TrainingJob doomed"));
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_pull_fetches_a_running_jobs_checkpoint_through_the_api_server() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-ckpt").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    // Long enough to be running while the checkpoints are fetched (a few hundred steps a second here); one
    // every 1000 steps, 10 kept, so the older one listed is still there when it is pulled.
    let steps = 60_000;
    wsctl_ok(&kc, &["submit", &manifest(&dir, "saved", steps, 1000).display().to_string(), "-n", &ns]).await;
    let r = wait_for(Duration::from_secs(300), "a checkpoint of saved", || async {
        let s = jobs.get("saved").await.ok()?.status?;
        (s.phase == Some(Phase::Running) && s.progress.last_checkpoint?.step >= 2000).then_some(())
    })
    .await;
    ok(r, "checkpoint");

    let listed = wsctl_ok(&kc, &["checkpoint", "list", "saved", "-n", &ns]).await;
    let rows: Vec<(u64, String)> = listed
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            Some((cells.first()?.parse().ok()?, cells.last()?.to_string()))
        })
        .collect();
    assert!(rows.len() >= 2, "fewer than two checkpoints listed: {listed}");
    assert!(rows.windows(2).all(|w| w[0].0 > w[1].0), "not newest first: {listed}");

    // The newest, and an older one by --step; each verifies as the runtime reads checkpoints.
    let out_dir = dir.join("pulled");
    let out_arg = out_dir.display().to_string();
    let (older, older_file) = rows[1].clone();
    for step in [None, Some(older)] {
        let mut args = vec!["checkpoint", "pull", "saved", "-n", &ns, "-o", &out_arg];
        let step_arg = step.map(|s| s.to_string());
        if let Some(s) = &step_arg {
            args.extend(["--step", s]);
        }
        let printed = wsctl_ok(&kc, &args).await;
        let path = PathBuf::from(printed.trim());
        assert_eq!(path.parent(), Some(out_dir.as_path()), "{printed}");
        let (at, tensors) = ok(runtime::memoryx::checkpoint::read(&path, 1 << 30), "read the pulled checkpoint");
        assert!(!tensors.is_empty(), "an empty checkpoint");
        match step {
            Some(s) => assert_eq!(
                (at, path.file_name().map(|f| f.to_string_lossy().into_owned())),
                (s, Some(older_file.clone()))
            ),
            None => assert!(at >= rows[0].0, "the newest pulled is step {at}, older than the listed {}", rows[0].0),
        }
    }
    let leftovers: Vec<_> = ok(std::fs::read_dir(&out_dir), "pulled folder")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    // The run's records, from the volume MemoryX writes them to: the TensorBoard event file holds each step's
    // loss once, in order, from the first step on.
    let tb_arg = dir.join("tensorboard").display().to_string();
    let printed = wsctl_ok(&kc, &["tensorboard", "pull", "saved", "-n", &ns, "-o", &tb_arg]).await;
    let files: Vec<PathBuf> = printed.lines().map(PathBuf::from).collect();
    let named = |p: &PathBuf, prefix: &str| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix));
    assert!(files.iter().any(|p| named(p, "metrics.jsonl")), "{printed}");
    let mut steps = Vec::new();
    for f in files.iter().filter(|p| named(p, runtime::tensorboard::FILE_PREFIX)) {
        let events = ok(runtime::tensorboard::read_events(&ok(std::fs::read(f), "the event file")), "its records");
        for e in events {
            if let Some(runtime::tensorboard::What::Summary(s)) = e.what
                && s.value.iter().any(|v| v.tag == "loss")
            {
                steps.push(e.step);
            }
        }
    }
    eprintln!("tensorboard pull: {} files, the loss of steps 1..={:?}", files.len(), steps.last());
    assert!(steps.len() >= 2000, "{} steps recorded: {printed}", steps.len());
    assert!(steps[0] == 1 && steps.windows(2).all(|w| w[1] == w[0] + 1), "each step once, in order");
    dashboard_shows_the_running_job(&client, &kc, &ns, "saved").await;
    // A step that has no checkpoint is one clear error.
    let out = wsctl_run(&kc, &["checkpoint", "pull", "saved", "-n", &ns, "--step", "7", "-o", &out_arg]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no checkpoint of step 7"));
    wsctl_ok(&kc, &["cancel", "saved", "-n", &ns]).await;
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

/// Nothing lost: a finished job's checkpoint pulled, the job deleted, its claim still there (labelled with the
/// job's name and uid, owned by nobody), and `wsctl checkpoint pull` of the deleted job gives the same file bit
/// for bit through a short-lived reader pod, which goes when the command ends. A cancelled job keeps its
/// checkpoints too and they list; a job submitted again under a deleted one's name gets claims of its own; a
/// `retain: Delete` job's claims go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_outlive_a_deleted_or_cancelled_job_unless_retain_is_delete() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-retain").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    let claims_of = |job: &str| {
        let (claims, sel) = (claims.clone(), ListParams::default().labels(&format!("weightstream.dev/job={job}")));
        async move { claims.list(&sel).await.map(|l| l.items).unwrap_or_default() }
    };
    let gone = |job: &'static str| {
        let jobs = jobs.clone();
        async move {
            ok(
                wait_for(Duration::from_secs(120), &format!("{job} to be gone"), || async {
                    jobs.get_opt(job).await.ok()?.is_none().then_some(())
                })
                .await,
                "deletion",
            )
        }
    };

    // A finished job, its newest checkpoint pulled from its MemoryX.
    wsctl_ok(
        &kc,
        &[
            "submit",
            &manifest(&dir, "kept", 3000, 1000).display().to_string(),
            "-n",
            &ns,
            "--watch",
            "--timeout",
            "300",
        ],
    )
    .await;
    let uid = ok(jobs.get("kept").await, "get").uid().unwrap_or_default();
    let before = dir.join("before");
    let printed = wsctl_ok(&kc, &["checkpoint", "pull", "kept", "-n", &ns, "-o", &before.display().to_string()]).await;
    let live = ok(std::fs::read(printed.trim()), "the pulled checkpoint");

    // Deleted (as kubectl does): the claim stays, with the job's name and uid, owned by nobody.
    ok(jobs.delete("kept", &DeleteParams::default()).await, "delete kept");
    gone("kept").await;
    let left = claims_of("kept").await;
    assert!(!left.is_empty(), "the deleted job's claims went with it");
    for c in &left {
        assert_eq!(c.labels().get("weightstream.dev/job-uid"), Some(&uid), "{}", c.name_any());
        assert!(c.owner_references().is_empty(), "{} is owned: {:?}", c.name_any(), c.owner_references());
        assert!(c.metadata.deletion_timestamp.is_none(), "{} is being deleted", c.name_any());
    }
    // The deleted job's checkpoints list and pull, the same bytes as before the deletion.
    let listed = wsctl_ok(&kc, &["checkpoint", "list", "kept", "-n", &ns]).await;
    assert!(listed.contains("step-00003000"), "{listed}");
    let after = dir.join("after");
    let printed = wsctl_ok(&kc, &["checkpoint", "pull", "kept", "-n", &ns, "-o", &after.display().to_string()]).await;
    assert!(
        ok(std::fs::read(printed.trim()), "the checkpoint pulled after the deletion") == live,
        "not the same file bit for bit"
    );
    // Its records too (from the run folder of the same claim): the finished run's summary among them.
    let records = dir.join("records");
    let printed =
        wsctl_ok(&kc, &["tensorboard", "pull", "kept", "-n", &ns, "-o", &records.display().to_string()]).await;
    let summary = ok(std::fs::read_to_string(records.join("summary.json")), "the deleted job's summary.json");
    assert!(summary.contains("\"steps\": 3000") && printed.contains("tfevents"), "{printed}\n{summary}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let readers = ListParams::default().labels("weightstream.dev/checkpoint-reader=kept");
    ok(
        wait_for(Duration::from_secs(60), "the reader pods to go", || async {
            pods.list(&readers).await.ok()?.items.is_empty().then_some(())
        })
        .await,
        "reader cleanup",
    );

    // Submitted again under the same name: claims of its own, the retained one untouched.
    wsctl_ok(
        &kc,
        &[
            "submit",
            &manifest(&dir, "kept", 1000, 1000).display().to_string(),
            "-n",
            &ns,
            "--watch",
            "--timeout",
            "300",
        ],
    )
    .await;
    let again = ok(jobs.get("kept").await, "get").uid().unwrap_or_default();
    let now: Vec<(String, Option<String>)> = claims_of("kept")
        .await
        .iter()
        .map(|c| (c.name_any(), c.labels().get("weightstream.dev/job-uid").cloned()))
        .collect();
    assert!(
        left.iter().all(|c| now.iter().any(|(n, u)| *n == c.name_any() && u.as_deref() == Some(uid.as_str()))),
        "{now:?}"
    );
    assert!(
        now.iter().any(|(_, u)| u.as_deref() == Some(again.as_str())),
        "the new job has no claim of its own: {now:?}"
    );
    ok(jobs.delete("kept", &DeleteParams::default()).await, "delete kept again");

    // Cancelled while running: it says where its checkpoints are, and they list.
    wsctl_ok(&kc, &["submit", &manifest(&dir, "stopped", 60_000, 1000).display().to_string(), "-n", &ns]).await;
    let r = wait_for(Duration::from_secs(300), "a checkpoint of stopped", || async {
        let s = jobs.get("stopped").await.ok()?.status?;
        (s.progress.last_checkpoint?.step >= 1000).then_some(())
    })
    .await;
    ok(r, "checkpoint");
    let out = wsctl_ok(&kc, &["cancel", "stopped", "-n", &ns, "--timeout", "180"]).await;
    assert!(out.contains("checkpoints kept in claim"), "{out}");
    let listed = wsctl_ok(&kc, &["checkpoint", "list", "stopped", "-n", &ns]).await;
    assert!(listed.contains(".safetensors"), "no checkpoint listed: {listed}");

    // retain: Delete: the claims go with the job.
    let path = manifest(&dir, "dropped", 60_000, 1000);
    let text = ok(std::fs::read_to_string(&path), "manifest");
    let mut j: TrainingJob = ok(serde_yaml::from_str(&text), "manifest");
    j.spec.checkpoint.retain = crds::RetainPolicy::Delete;
    ok(std::fs::write(&path, ok(serde_yaml::to_string(&j), "yaml")), "manifest");
    wsctl_ok(&kc, &["submit", &path.display().to_string(), "-n", &ns]).await;
    ok(
        wait_for(Duration::from_secs(300), "a claim of dropped", || async {
            (!claims_of("dropped").await.is_empty()).then_some(())
        })
        .await,
        "claim",
    );
    let out = wsctl_ok(&kc, &["cancel", "dropped", "-n", &ns, "--timeout", "180"]).await;
    assert!(out.contains("deleted with it"), "{out}");
    let left = claims_of("dropped").await;
    assert!(
        left.iter().all(|c| c.metadata.deletion_timestamp.is_some()),
        "retain: Delete kept {:?}",
        left.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

#[path = "../../wsctl/tests/common/gpt2.rs"]
mod gpt2;

/// The mean loss per token GPT-2's forward pass (written out, independent of the engine) gives on the held-out
/// windows of `test`, the windows the job evaluated.
fn held_out_loss(model: &gpt2::Gpt2, test: &data::Dataset) -> f64 {
    let (mut sum, mut tokens) = (0.0, 0usize);
    for w in test.eval_samples() {
        let shard = test.shard(&[w]);
        let input: Vec<usize> = shard.inputs.data.iter().map(|&t| t as usize).collect();
        let labels: Vec<usize> = shard.labels.iter().map(|&l| l as usize).collect();
        sum += model.loss(&input, &labels);
        tokens += labels.len();
    }
    sum / tokens.max(1) as f64
}

/// `wsctl dashboard -n NS` in a browser: the running job is listed Running; its page has its curve with one
/// vertex a recorded step, every pod of the job in the appliance's tree, its Events and its checkpoints.
async fn dashboard_shows_the_running_job(client: &Client, kc: &Path, ns: &str, job: &str) {
    use e2e::browser::{Dashboard, attributes, dump_dom, element};
    let dash = ok(Dashboard::start(&wsctl(), &["-n", ns], Some(kc)), "wsctl dashboard");
    let (listing, page) = (dash.url.clone(), format!("{}jobs/{ns}/{job}", dash.url));
    let browse = |url: String| tokio::task::spawn_blocking(move || dump_dom(&url, 0, Duration::from_secs(120)));
    let listing = ok(ok(browse(listing).await, "browser"), "the listing");
    assert!(listing.contains(&format!(">{job}</a>")) && listing.contains(r#"data-phase="Running""#), "{listing}");
    let page = ok(ok(browse(page).await, "browser"), "the job's page");
    let loss = element(&page, "<figure id=\"loss\"", "</figure>").unwrap_or_else(|| panic!("no loss chart: {page}"));
    let points: usize = attributes(loss, "data-points").first().and_then(|p| p.parse().ok()).unwrap_or(0);
    let vertices = attributes(loss, "points").iter().map(|p| p.split_whitespace().count()).max().unwrap_or(0);
    assert!(points >= 2000 && vertices == points, "{points} steps recorded, {vertices} vertices drawn");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sel = format!("weightstream.dev/job={job}");
    let mut want: Vec<String> =
        ok(pods.list(&ListParams::default().labels(&sel)).await, "pods").iter().map(|p| p.name_any()).collect();
    let mut shown = attributes(&page, "data-name");
    want.sort();
    shown.sort();
    assert_eq!(shown, want, "the tree has every pod of the job");
    assert!(page.contains(r#"<table id="events""#) && page.contains(r#"<table id="checkpoints""#), "{page}");
    eprintln!("dashboard: {points} steps drawn, {} pods in the tree", shown.len());
}

/// `wsctl logs export` of the failed and deleted job `job` (its pods gone): the bundle has the post-mortem the
/// operator kept when it failed (the reason, the pod and line that failed it, every pod's last lines naming the
/// bad file) and the records from the claim the job left, within the bound its index states.
async fn postmortem_outlives_the_job(client: &Client, kc: &Path, ns: &str, job: &str, dir: &Path) {
    assert!(role_pods(client, ns, job, "input").await.is_empty(), "the job's pods are gone");
    let out = dir.join(format!("{job}.tar.gz"));
    let printed = wsctl_ok(kc, &["logs", "export", job, "-n", ns, "-o", &out.display().to_string()]).await;
    assert!(printed.starts_with(&out.display().to_string()), "{printed}");
    let unpacked = dir.join(format!("{job}-bundle"));
    ok(std::fs::create_dir_all(&unpacked), "bundle folder");
    let untar = std::process::Command::new("tar").arg("-xzf").arg(&out).arg("-C").arg(&unpacked).status();
    assert!(untar.is_ok_and(|s| s.success()), "tar -xzf {}", out.display());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let index = read(&unpacked.join("bundle.txt"));
    assert!(index.contains("at most 512 MiB"), "{index}");
    let kept: Vec<PathBuf> = ok(std::fs::read_dir(unpacked.join("postmortem")), "postmortem/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let one = kept.first().unwrap_or_else(|| panic!("no post-mortem in the bundle: {index}"));
    let (reason, culprit) = (read(&one.join("reason")), read(&one.join("culprit")));
    assert!(reason.starts_with("DataPlaneFailed: ") || reason.contains("tokenizer"), "{reason}");
    assert!(culprit.starts_with(&format!("{job}-")), "the culprit is one of the job's pods: {culprit:?}");
    let logs: Vec<String> = ok(std::fs::read_dir(one), "post-mortem files")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("log."))
        .map(|e| read(&e.path()))
        .collect();
    assert!(logs.iter().any(|l| l.contains("broken-tokenizer.json")), "no pod's last lines name the bad file: {index}");
    assert!(unpacked.join("run/metrics.jsonl").is_file() || index.contains("run/"), "{index}");
    eprintln!("post-mortem of {job}: {} bytes; culprit {culprit}", ok(std::fs::metadata(&out), "bundle").len());
}

/// Pods of `ns` with `role` that exist now.
async fn role_pods(client: &Client, ns: &str, job: &str, role: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sel = format!("weightstream.dev/job={job},weightstream.dev/role={role}");
    pods.list(&ListParams::default().labels(&sel)).await.map(|l| l.items).unwrap_or_default()
}

/// Creates the claim `name` in `ns`, has it bound by a pod that mounts it (the class binds on first use), and
/// copies `files` (source, path inside the volume) where the volume lives on this node, as `kubectl cp` into
/// such a pod would. Returns that folder.
async fn fill_claim(client: &Client, ns: &str, name: &str, files: &[(PathBuf, &str)]) -> PathBuf {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claim: PersistentVolumeClaim = ok(
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } },
        })),
        "claim",
    );
    ok(claims.create(&Default::default(), &claim).await, "create the claim");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let loader: Pod = ok(
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "loader" },
            "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "securityContext": { "runAsNonRoot": true, "runAsUser": 65535, "seccompProfile": { "type": "RuntimeDefault" } },
                "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": name } }],
                "containers": [{
                    "name": "pause", "image": "weightstream/pause:3.10", "imagePullPolicy": "Never",
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                    "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] }, "readOnlyRootFilesystem": true },
                }],
            },
        })),
        "loader pod",
    );
    ok(pods.create(&Default::default(), &loader).await, "create the loader pod");
    let volume = ok(
        wait_for(Duration::from_secs(120), "the claim to bind", || async {
            claims.get(name).await.ok()?.spec?.volume_name.filter(|v| !v.is_empty())
        })
        .await,
        "bound claim",
    );
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let pv = ok(pvs.get(&volume).await, "the bound volume");
    // The local node's volumes are `local`, kind's (local-path, shared folder) `hostPath`: either way a folder
    // at the same path on this machine (kind's nodes mount it where the host has it).
    let spec = pv.spec.unwrap_or_default();
    let path = spec.local.map(|l| l.path).or(spec.host_path.map(|h| h.path));
    let root = PathBuf::from(path.expect("a local or hostPath volume"));
    for (from, to) in files {
        let to = root.join(to);
        ok(std::fs::create_dir_all(to.parent().unwrap_or(&root)), "folder in the volume");
        ok(std::fs::copy(from, &to), "copy into the volume");
    }
    ok(pods.delete("loader", &DeleteParams::default()).await, "delete the loader pod");
    root
}

/// The user's path from their data to a Hugging Face model, on the cluster: the corpus and its BPE tokenizer go
/// onto a PersistentVolumeClaim (never into the image: the tokenizer is nowhere else), a GPT trains on it
/// through two input workers per CS-2 (the only pods mounting the claim, read-only), `wsctl checkpoint pull`
/// fetches the finished job's checkpoint, `wsctl export` converts it, and GPT-2's forward pass written out in
/// the test gives the held-out loss the job reported within 1%. A job naming a claim that does not exist waits
/// with `DataVolumeNotFound`, and one whose path leaves the volume is refused by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_trained_on_a_volume_comes_back_as_a_hugging_face_model() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-data").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    ok(std::fs::create_dir_all(&dir), "test folder");

    let examples = cluster::repo_root().join("examples/data/moby-dick");
    let root = fill_claim(
        &client,
        &ns,
        "corpus",
        &[
            (examples.join("moby-dick.txt.gz"), "moby-dick/moby-dick.txt.gz"),
            (examples.join("tokenizer.json"), "moby-dick/tokenizer.json"),
        ],
    )
    .await;
    let corpus = root.join("moby-dick");

    // A small GPT over the BPE corpus on the claim, two input workers per CS-2.
    let mut j: TrainingJob = ok(cluster::example("gpt-bpe-pvc.yaml"), "example");
    j.metadata.name = Some("bpe".into());
    j.spec.cs2 = 2;
    j.spec.data.volume = Some("corpus".into());
    j.spec.data.workers = 2;
    (j.spec.model.context_length, j.spec.model.width, j.spec.model.blocks) = (Some(32), Some(64), Some(2));
    j.spec.training.steps = Some(60);
    j.spec.training.schedule.warmup_steps = 6;
    (j.spec.checkpoint.interval_steps, j.spec.checkpoint.keep) = (30, 2);
    let path = dir.join("bpe.yaml");
    ok(std::fs::write(&path, ok(serde_yaml::to_string(&j), "yaml")), "manifest");
    let submit = tokio::spawn({
        let (kc, path, ns) = (kc.clone(), path.display().to_string(), ns.clone());
        async move { run_as(&wsctl(), &kc, &["submit", &path, "-n", &ns, "--watch", "--timeout", "900"]).await }
    });
    // While it trains: four input workers, each mounting the claim read-only; no other pod mounts it.
    let inputs = ok(
        wait_for(Duration::from_secs(300), "four input workers", || async {
            let p = role_pods(&client, &ns, "bpe", "input").await;
            (p.len() == 4).then_some(p)
        })
        .await,
        "input workers",
    );
    for p in &inputs {
        let spec = p.spec.clone().unwrap_or_default();
        let source = spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone()).expect("the claim");
        assert_eq!((source.claim_name.as_str(), source.read_only), ("corpus", Some(true)), "{}", p.name_any());
    }
    for role in ["engine", "swarmx", "memoryx"] {
        for p in role_pods(&client, &ns, "bpe", role).await {
            let mounts = p.spec.unwrap_or_default().volumes.unwrap_or_default();
            assert!(
                mounts.iter().all(|v| v.persistent_volume_claim.as_ref().is_none_or(|c| c.claim_name != "corpus")),
                "a {role} pod mounts the data"
            );
        }
    }
    let out = ok(submit.await, "submit task");
    assert!(out.status.success(), "submit --watch: {}", String::from_utf8_lossy(&out.stderr));
    let status = ok(jobs.get("bpe").await, "job").status.unwrap_or_default();
    let reported = status.progress.eval_loss.expect("the job reports its held-out loss");

    // The model back: the finished job's checkpoint through the API server, converted for transformers.
    let pulled = dir.join("pulled");
    let printed = wsctl_ok(&kc, &["checkpoint", "pull", "bpe", "-n", &ns, "-o", &pulled.display().to_string()]).await;
    let ckpt = PathBuf::from(printed.trim());
    let hf = dir.join("hf");
    let tokenizer = examples.join("tokenizer.json");
    let args = [
        "export",
        &ckpt.display().to_string(),
        "--format",
        "huggingface",
        "-o",
        &hf.display().to_string(),
        "--tokenizer",
        &tokenizer.display().to_string(),
    ];
    let out = wsctl_run(&kc, &args).await;
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    // The tokenizer travels with the model, for `AutoTokenizer.from_pretrained`.
    assert_eq!(
        ok(std::fs::read(hf.join("tokenizer.json")), "exported tokenizer"),
        ok(std::fs::read(&tokenizer), "tokenizer")
    );
    let model = gpt2::Gpt2::load(&hf);
    assert_eq!((model.vocab, model.positions, model.embd), (1024, 32, 64));

    // The held-out windows the job evaluated, read from the same files by the runtime's own loader.
    let local = cluster::repo_root().join("examples/data");
    let (_, test) = ok(data::load(&j.spec, Some(&local)), "the corpus, locally");
    let ours = held_out_loss(&model, &test);
    eprintln!("exported GPT-2 held-out loss {ours:.5} nats/token; the job reported {reported:.5}");
    assert!((ours - reported).abs() <= 0.01 * reported, "GPT-2's forward gives {ours}, the job reported {reported}");
    assert!(reported < (1024f64).ln(), "the job learned something: {reported}");

    // A claim that does not exist: the job waits, saying so, and holds no CS-2.
    let mut missing = j.clone();
    missing.metadata.name = Some("nodata".into());
    missing.spec.data.volume = Some("no-such-claim".into());
    ok(jobs.create(&Default::default(), &missing).await, "create the job on a missing claim");
    let why = ok(
        wait_for(Duration::from_secs(60), "DataVolumeNotFound", || async {
            let s = jobs.get("nodata").await.ok()?.status?;
            let c = s.conditions.iter().find(|c| c.type_ == "Admitted" && c.reason == "DataVolumeNotFound")?;
            (s.allocated_cs2.is_none()).then(|| c.message.clone())
        })
        .await,
        "missing claim",
    );
    assert!(why.contains("no-such-claim") && why.contains("create it"), "{why}");
    // Bad data on the claim: a corrupt tokenizer fails the job at once, with the input worker's words in its status.
    ok(std::fs::write(corpus.join("broken-tokenizer.json"), b"{\"model\": not json"), "corrupt tokenizer");
    let mut corrupt = j.clone();
    corrupt.metadata.name = Some("badtok".into());
    corrupt.spec.data.tokenizer = Some("moby-dick/broken-tokenizer.json".into());
    ok(jobs.create(&Default::default(), &corrupt).await, "create the job with a corrupt tokenizer");
    // As long as the submit above: the pool (4 CS-2s on kind) is shared with this file's other tests, so the job
    // may wait in the queue before it starts and fails.
    let failing = wait_for(Duration::from_secs(900), "the corrupt tokenizer's job to fail", || async {
        let s = jobs.get("badtok").await.ok()?.status?;
        (s.phase == Some(Phase::Failed)).then_some(s)
    });
    let failed = match failing.await {
        Ok(s) => s,
        Err(e) => panic!("{e}; the job's status: {:#?}", jobs.get("badtok").await.ok().and_then(|j| j.status)),
    };
    let said = failed
        .conditions
        .iter()
        .any(|c| c.message.contains("broken-tokenizer.json") && c.message.contains("tokenizer"));
    assert!(said, "the status names the bad file: {failed:#?}");
    // The input worker refused its input: the job failed on that first refusal (MemoryX reports it, or the
    // operator sees the refusing pod first), not after restartLimit reruns.
    let reason = failed.conditions.iter().find(|c| c.type_ == "Failed").map(|c| c.reason.clone());
    assert!(
        matches!(reason.as_deref(), Some("DataPlaneFailed" | "InputRefused")) && failed.restarts <= 1,
        "{failed:#?}"
    );
    // `wsctl get` of the failed job says what failed it: the pod and its line, from the post-mortem.
    let got = wsctl_ok(&kc, &["get", "badtok", "-n", &ns]).await;
    assert!(got.contains("\nFailed: ") && got.contains("failed by pod badtok-"), "{got}");
    wsctl_ok(&kc, &["cancel", "badtok", "-n", &ns]).await;
    postmortem_outlives_the_job(&client, &kc, &ns, "badtok", &dir).await;

    // A path leaving the volume never reaches the operator.
    let mut escaping = j.clone();
    escaping.metadata.name = Some("escape".into());
    escaping.spec.data.path = "../etc/passwd".into();
    let err = jobs.create(&Default::default(), &escaping).await.expect_err("a path out of the volume was accepted");
    assert!(err.to_string().contains("stay inside it"), "{err}");

    wsctl_ok(&kc, &["cancel", "bpe", "-n", &ns]).await;
    wsctl_ok(&kc, &["cancel", "nodata", "-n", &ns]).await;
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

#[path = "../../wsctl/tests/common/tiny_llama.rs"]
mod tiny_llama;

/// The mean loss per token `transformers` computes for the Hugging Face folder `model` over `windows` (each
/// `inputs` and `labels`), through `models/reference.py` in the venv `models/setup.sh` prepares.
async fn transformers_loss(model: &Path, windows: Vec<serde_json::Value>) -> f64 {
    use tokio::io::AsyncWriteExt;
    let root = cluster::repo_root();
    let python = root.join("models/.venv/bin/python");
    assert!(python.exists(), "{} is missing: run `bash models/setup.sh` (PyTorch and transformers)", python.display());
    let mut child = ok(
        tokio::process::Command::new(python)
            .arg(root.join("models/reference.py"))
            .arg("run")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn(),
        "reference.py",
    );
    let request = serde_json::json!({ "model": model, "eval": windows, "steps": [] });
    let mut stdin = child.stdin.take().expect("stdin");
    ok(stdin.write_all(request.to_string().as_bytes()).await, "the request");
    drop(stdin);
    let out = ok(
        ok(
            tokio::time::timeout(Duration::from_secs(600), child.wait_with_output()).await,
            "reference.py ran 10 minutes",
        ),
        "reference.py",
    );
    assert!(out.status.success(), "reference.py: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = ok(serde_json::from_slice(&out.stdout), "reference.py's answer");
    v["eval_loss"].as_f64().expect("eval_loss")
}

/// The phase of `name` once it is terminal (at most 10 minutes).
async fn finished(jobs: &Api<TrainingJob>, name: &str) -> crds::TrainingJobStatus {
    ok(
        wait_for(Duration::from_secs(600), &format!("{name} to finish"), || async {
            let s = jobs.get(name).await.ok()?.status?;
            s.phase.is_some_and(|p| p.is_terminal()).then_some(s)
        })
        .await,
        "a finished job",
    )
}

/// A model large enough to need weight servers leaves the cluster whole, and its job resumes on fewer servers.
/// A GPT over three weight servers: `wsctl checkpoint list` shows its sliced checkpoint, `checkpoint pull`
/// gathers the manifest and slices into one file, `export` converts it, and GPT-2's forward pass gives the
/// held-out loss the job reported within 1%. The same job suspended mid-run, patched to two weight servers and
/// resumed finishes with the undisturbed job's final loss and held-out loss, bit for bit (its checkpoint's
/// slices cut again for two servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliced_checkpoint_leaves_the_cluster_and_its_job_resumes_on_fewer_servers() {
    use kube::api::{Patch, PatchParams};
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-slices").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    ok(std::fs::create_dir_all(&dir), "test folder");
    let steps = 600;
    let job = |name: &str| {
        let mut j: TrainingJob = ok(cluster::example("gpt-small.yaml"), "example");
        j.metadata.name = Some(name.into());
        j.spec.cs2 = 2;
        (j.spec.model.context_length, j.spec.model.width, j.spec.model.blocks) = (Some(32), Some(64), Some(2));
        j.spec.training.steps = Some(steps);
        j.spec.training.schedule.warmup_steps = 20;
        j.spec.memoryx.servers = Some(3);
        (j.spec.checkpoint.interval_steps, j.spec.checkpoint.keep) = (300, 2);
        let path = dir.join(format!("{name}.yaml"));
        ok(std::fs::write(&path, ok(serde_yaml::to_string(&j), "yaml")), "manifest");
        (j, path.display().to_string())
    };

    // Undisturbed, on three weight servers, watched to its end while the job below (2 CS-2s each: both are
    // admitted at once) is moved.
    let (j, path) = job("whole");
    let watched = {
        let (kc, args) = (kc.clone(), ["submit", &path, "-n", &ns, "--watch", "--timeout", "900"].map(String::from));
        tokio::spawn(async move { wsctl_ok(&kc, &args.each_ref().map(String::as_str)).await })
    };

    // The same job, suspended mid-run, moved to two weight servers and resumed.
    let (_, path) = job("moved");
    wsctl_ok(&kc, &["submit", &path, "-n", &ns]).await;
    training_past(&jobs, "moved", 50).await;
    wsctl_ok(&kc, &["suspend", "moved", "-n", &ns, "--timeout", "180"]).await;
    let s = ok(jobs.get("moved").await, "get").status.unwrap_or_default();
    let at = s.progress.last_checkpoint.map(|c| c.step).unwrap_or_else(|| panic!("suspended without a checkpoint"));
    assert!(at > 0 && at < steps, "suspended at step {at}");
    let patch = serde_json::json!({ "spec": { "memoryx": { "servers": 2 } } });
    ok(jobs.patch("moved", &PatchParams::default(), &Patch::Merge(&patch)).await, "two weight servers");
    wsctl_ok(&kc, &["resume", "moved", "-n", &ns, "--timeout", "180"]).await;

    ok(watched.await, "submit --watch");
    let whole = ok(jobs.get("whole").await, "job").status.unwrap_or_default();
    assert_eq!((whole.phase, whole.progress.step), (Some(Phase::Succeeded), Some(steps)));
    let reported = whole.progress.eval_loss.expect("the job reports its held-out loss");
    assert_eq!(role_pods(&client, &ns, "whole", "memoryx").await.len(), 3, "three weight servers");

    // Gathered from the coordinator's volume into one checkpoint, exported, and read by GPT-2's forward pass.
    let listing = wsctl_ok(&kc, &["checkpoint", "list", "whole", "-n", &ns]).await;
    assert!(listing.contains(&format!("step-{steps:08}.manifest.json")) && listing.contains("(3 slices)"), "{listing}");
    let printed =
        wsctl_ok(&kc, &["checkpoint", "pull", "whole", "-n", &ns, "-o", &dir.join("pulled").display().to_string()])
            .await;
    let ckpt = PathBuf::from(printed.trim());
    assert!(ckpt.ends_with(format!("step-{steps:08}.safetensors")), "{printed}");
    let hf = dir.join("hf");
    let out = wsctl_run(
        &kc,
        &["export", &ckpt.display().to_string(), "--format", "huggingface", "-o", &hf.display().to_string()],
    )
    .await;
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    let model = gpt2::Gpt2::load(&hf);
    let mut local = j.spec.clone();
    local.data.path = cluster::repo_root().join(&j.spec.data.path).display().to_string();
    let (_, test) = ok(data::load(&local, None), "the corpus, locally");
    let ours = held_out_loss(&model, &test);
    eprintln!("exported GPT-2 held-out loss {ours:.5} nats/token; the three-server job reported {reported:.5}");
    assert!((ours - reported).abs() <= 0.01 * reported, "GPT-2's forward gives {ours}, the job reported {reported}");
    // And `transformers` itself (the venv `models/setup.sh` prepares) on the same windows.
    let windows: Vec<serde_json::Value> = test
        .eval_samples()
        .into_iter()
        .map(|w| {
            let shard = test.shard(&[w]);
            serde_json::json!({ "inputs": shard.inputs.data.iter().map(|&t| t as u32).collect::<Vec<_>>(), "labels": shard.labels })
        })
        .collect();
    let transformers = transformers_loss(&hf, windows).await;
    eprintln!("transformers' held-out loss of the export: {transformers:.7}; the job reported {reported:.7}");
    assert!(
        (transformers - reported).abs() <= 1e-4 * reported,
        "transformers gives {transformers}, the job reported {reported}"
    );

    // The moved job, resumed above on two weight servers, ends as the undisturbed one did.
    let moved = finished(&jobs, "moved").await;
    assert_eq!((moved.phase, moved.progress.step), (Some(Phase::Succeeded), Some(steps)), "{moved:#?}");
    assert_eq!(role_pods(&client, &ns, "moved", "memoryx").await.len(), 2, "two weight servers after the move");
    eprintln!(
        "moved at step {at}: final loss {:?} / held-out {:?}; undisturbed {:?} / {:?}",
        moved.progress.loss, moved.progress.eval_loss, whole.progress.loss, whole.progress.eval_loss
    );
    assert_eq!(moved.progress.loss, whole.progress.loss, "the final step's loss, bit for bit");
    assert_eq!(moved.progress.eval_loss, whole.progress.eval_loss, "the held-out loss, bit for bit");

    wsctl_ok(&kc, &["cancel", "whole", "-n", &ns]).await;
    wsctl_ok(&kc, &["cancel", "moved", "-n", &ns]).await;
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}

/// A user's pretrained model on a data volume, fine-tuned in the cluster: a Llama folder and its corpus on a
/// claim, a job starting from it (`spec.model.from` inside `spec.data.volume`), pipelined and 50% sparse over
/// two weight servers. Every weight server (each reads its slice of every unit from the folder) and every
/// engine (each prunes its replica by magnitude) mounts the claim read-only; SwarmX does not. The job finishes
/// with the loss `wsctl run --volume` gives on this machine, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pretrained_model_on_a_data_volume_fine_tunes_in_the_cluster() {
    let _serial = SERIAL.lock().await;
    let (kc, client, ns) = setup("cli-pretrained").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let dir = scratch(&ns);
    let folder = dir.join("tiny");
    tiny_llama::write_folder(&folder, false, false);
    let corpus = cluster::repo_root().join("examples/data/moby-dick/moby-dick.txt.gz");
    let files = [
        (folder.join("config.json"), "models/tiny/config.json"),
        (folder.join("model.safetensors"), "models/tiny/model.safetensors"),
        (corpus, "moby-dick.txt.gz"),
    ];
    let root = fill_claim(&client, &ns, "models", &files).await;

    let text = "apiVersion: weightstream.dev/v1beta1\nkind: TrainingJob\nmetadata: {name: tiny}\nspec:\n  cs2: 2\n  executionMode: pipelined\n  \
                model: {kind: llama, from: models/tiny, width: 32, heads: 4, kvHeads: 2, blocks: 2, intermediateSize: 48, contextLength: 16, tiedEmbeddings: false, sparsity: 0.5}\n  \
                data: {kind: text, path: moby-dick.txt.gz, volume: models}\n  memoryx: {servers: 2}\n  \
                training: {batchSize: 4, steps: 40, seed: 3, optimizer: {kind: adamw, learningRate: 0.001}}\n";
    let path = dir.join("tiny.yaml");
    ok(std::fs::write(&path, text), "manifest");
    wsctl_ok(&kc, &["submit", &path.display().to_string(), "-n", &ns]).await;
    let mounts_models = |p: &Pod| {
        let spec = p.spec.clone().unwrap_or_default();
        let claim = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.clone())
            .find(|c| c.claim_name == "models");
        let mount = spec
            .containers
            .first()
            .and_then(|c| c.volume_mounts.clone())
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.name == "data");
        match (claim, mount) {
            (Some(c), Some(m)) => c.read_only == Some(true) && m.read_only == Some(true),
            _ => false,
        }
    };
    let readers = ok(
        wait_for(Duration::from_secs(300), "two weight servers and two engines", || async {
            let (mx, engines) =
                (role_pods(&client, &ns, "tiny", "memoryx").await, role_pods(&client, &ns, "tiny", "engine").await);
            (mx.len() == 2 && engines.len() == 2).then_some((mx, engines))
        })
        .await,
        "the pods",
    );
    for p in readers.0.iter().chain(&readers.1) {
        assert!(mounts_models(p), "{} reads the folder: it mounts the claim read-only", p.name_any());
    }
    for p in role_pods(&client, &ns, "tiny", "swarmx").await {
        assert!(!mounts_models(&p), "{} mounts the claim", p.name_any());
    }
    let s = finished(&jobs, "tiny").await;
    assert_eq!((s.phase, s.progress.step), (Some(Phase::Succeeded), Some(40)), "{s:#?}");

    // The same job on this machine, the claim's folder standing in for the volume.
    let out = dir.join("local");
    let claim = format!("models={}", root.display());
    wsctl_ok(
        &kc,
        &["run", &path.display().to_string(), "--volume", &claim, "--in-process", "--out", &out.display().to_string()],
    )
    .await;
    let metrics = ok(std::fs::read_to_string(out.join("metrics.jsonl")), "metrics");
    let last: serde_json::Value = ok(serde_json::from_str(metrics.lines().last().unwrap_or("{}")), "a metrics line");
    eprintln!("cluster final loss {:?}, local {:?}", s.progress.loss, last["loss"].as_f64());
    assert_eq!(s.progress.loss, last["loss"].as_f64(), "the cluster's curve is the local one");

    wsctl_ok(&kc, &["cancel", "tiny", "-n", &ns]).await;
    let _ = std::fs::remove_dir_all(&dir);
    done(&client, &ns).await;
}
