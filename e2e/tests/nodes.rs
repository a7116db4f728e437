//! Issue 54's multi-node behaviour, on the kind cluster of `e2e/kind/up.sh` (`KUBECONFIG`: one control plane
//! and two workers), with 2 CS-2s per worker so a job of 4 spans both:
//! - placement: a job's engines spread over the workers and its weight servers keep apart, and the status and
//!   `wsctl get -o wide` say which node each pod runs on;
//! - a 4-CS-2 job with `minCs2: 2` meets a worker cordoned and drained (MemoryX checkpointing on SIGTERM),
//!   then a worker lost mid-run (its container paused: a hung host), then one stopped (a host gone): each time
//!   it goes on with 2 on the other worker from its newest checkpoint, says so (status, a `CapacityLost`
//!   Event), grows back to 4 once the worker returns, and it ends with the undisturbed run's losses within 1e-6
//!   relative.
//!
//! Fails (never skips) on a cluster without two workers offering CS-2s.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crds::{Phase, TrainingJob};
use e2e::cluster;
use e2e::wait_for;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use operator::children::pods::engine::CS2_RESOURCE;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// CS-2s each worker offers here: a 4-CS-2 job needs both workers.
const CS2_PER_WORKER: u32 = 2;

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The cluster with the chart at 2 CS-2s per node, a client, a fresh namespace, the kubeconfig, and the CS-2
/// hosts (at least two, each Ready), sorted.
async fn setup(prefix: &str) -> (Client, String, PathBuf, Vec<String>) {
    static SETUP: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let kc = SETUP
        .get_or_init(|| {
            let kc = cluster::kubeconfig().map_err(|e| format!("no cluster: {e}"))?;
            let per = format!("devicePlugin.devicesPerNode={CS2_PER_WORKER}");
            cluster::install_chart_with(&kc, &[&per]).map_err(|e| e.to_string())?;
            Ok(kc)
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"));
    let client = ok(e2e::client_for(&kc).await, "a client");
    let nodes: Api<Node> = Api::all(client.clone());
    let hosts = ok(
        wait_for(Duration::from_secs(120), "two Ready nodes offering CS-2s", || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            let hosts: Vec<String> = list
                .items
                .iter()
                .filter(|n| !operator::nodes::is_not_ready(n))
                .filter(|n| {
                    let a = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
                    a.and_then(|a| a.get(CS2_RESOURCE)).is_some_and(|q| q.0 == CS2_PER_WORKER.to_string())
                })
                .map(|n| n.name_any())
                .collect();
            (hosts.len() >= 2).then_some(hosts)
        })
        .await,
        "this test needs a cluster of two or more workers with CS-2s (bash e2e/kind/up.sh)",
    );
    let ns = ok(e2e::namespace(&client, prefix).await, "a namespace");
    (client, ns, kc, hosts)
}

/// `fc-mnist-sparse` at `cs2` CS-2s over 2 weight servers, `steps` long, checkpointing every 100 steps.
fn job(name: &str, cs2: u32, steps: u64) -> TrainingJob {
    let mut j = ok(cluster::example("fc-mnist-sparse.yaml"), "the example");
    j.metadata.name = Some(name.into());
    j.spec.cs2 = cs2;
    j.spec.training.epochs = None;
    j.spec.training.steps = Some(steps);
    j.spec.memoryx.servers = Some(2);
    j.spec.checkpoint.interval_steps = 100;
    j.spec.checkpoint.retain = crds::RetainPolicy::Delete;
    j.spec.restart_limit = 10;
    j
}

/// `bash e2e/kind/node.sh ACTION NODE`.
fn node_sh(action: &str, node: &str) {
    let script = cluster::repo_root().join("e2e/kind/node.sh");
    ok(cluster::run(Command::new("bash").arg(script).args([action, node])), &format!("{action} {node}"));
}

/// Starts or unpauses and uncordons the node when dropped, so a failed test leaves the cluster as it found it.
struct Repair {
    node: String,
    client: Client,
}

impl Drop for Repair {
    fn drop(&mut self) {
        let script = cluster::repo_root().join("e2e/kind/node.sh");
        for action in ["unpause", "start"] {
            // Only the one that undoes the fault succeeds; the other finds nothing to do.
            let _ = Command::new("bash").arg(&script).args([action, &self.node]).output();
        }
        let (client, node) = (self.client.clone(), self.node.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(cordon(&client, &node, false));
            Ok::<(), std::io::Error>(())
        })
        .join();
    }
}

/// Marks `node` unschedulable (or schedulable again), as `kubectl cordon`/`uncordon` do.
async fn cordon(client: &Client, node: &str, on: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "spec": { "unschedulable": on } });
    let _ = nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await;
}

/// The node of each of the job's pods that runs, by pod name.
async fn nodes_of(pods: &Api<Pod>, job: &str) -> Vec<(String, String)> {
    let sel = ListParams::default().labels(&format!("weightstream.dev/job={job}"));
    let list = pods.list(&sel).await.map(|l| l.items).unwrap_or_default();
    let mut placed: Vec<(String, String)> = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    placed.sort();
    placed
}

async fn said(client: &Client, ns: &str, reason: &str) -> bool {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = ok(events.list(&ListParams::default()).await, "events");
    list.items.iter().any(|e| e.reason.as_deref() == Some(reason))
}

async fn done(client: &Client, ns: &str) {
    let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_spread_weight_servers_keep_apart_and_the_status_says_where() {
    let _serial = SERIAL.lock().await;
    let (client, ns, kc, hosts) = setup("placed").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    ok(jobs.create(&PostParams::default(), &job("placed", 2, 100_000)).await, "create the job");
    // Two engines that would fit on one worker, and two weight servers: one of each on each worker.
    let s =
        e2e::wait_job(&jobs, "placed", Duration::from_secs(300), "the job to run", |s| s.phase == Some(Phase::Running))
            .await;
    assert_eq!(s.phase, Some(Phase::Running), "{s:?}");
    let placed = nodes_of(&pods, "placed").await;
    let on = |prefix: &str| -> Vec<String> {
        placed.iter().filter(|(p, _)| p.starts_with(prefix)).map(|(_, n)| n.clone()).collect()
    };
    let (engines, servers) = (on("placed-engine-"), on("placed-memoryx-"));
    assert_eq!(engines.len(), 2, "{placed:?}");
    assert_ne!(engines[0], engines[1], "the engines spread over the workers: {placed:?}");
    assert_eq!(servers.len(), 2, "{placed:?}");
    assert_ne!(servers[0], servers[1], "the weight servers keep apart: {placed:?}");
    assert!(engines.iter().all(|n| hosts.contains(n)), "engines on CS-2 hosts: {placed:?} {hosts:?}");
    // The status names every running pod's node, as the pods themselves say.
    let s = e2e::wait_job(&jobs, "placed", Duration::from_secs(60), "the status to name every pod's node", |s| {
        s.placement.len() == placed.len()
    })
    .await;
    let mut said: Vec<(String, String)> = s.placement.iter().map(|p| (p.pod.clone(), p.node.clone())).collect();
    said.sort();
    assert_eq!(said, placed);
    let wsctl = cluster::wsctl().unwrap_or_else(|e| panic!("{e}"));
    let out = ok(
        cluster::run(Command::new(wsctl).args(["get", "-n", &ns, "-o", "wide"]).env("KUBECONFIG", &kc)),
        "wsctl get -o wide",
    );
    let row = out.lines().nth(1).unwrap_or_default();
    let want = format!("engine={},{}", engines[0], engines[1]);
    let want_swapped = format!("engine={},{}", engines[1], engines[0]);
    assert!(out.lines().next().is_some_and(|h| h.ends_with("NODES")), "{out}");
    assert!(row.contains(&want) || row.contains(&want_swapped), "{out}");
    assert!(row.contains("memoryx=") && row.contains("input="), "{out}");
    done(&client, &ns).await;
}

/// Waits until the job runs on `cs2` CS-2s, then until it has trained `past` steps more; returns the step it
/// ran on `cs2` from and how long that took from `since`.
async fn runs_on(jobs: &Api<TrainingJob>, name: &str, cs2: u32, since: Instant, what: &str) -> (u64, Duration) {
    let s = e2e::wait_job(jobs, name, Duration::from_secs(400), what, |s| {
        s.allocated_cs2 == Some(cs2) && s.phase == Some(Phase::Running)
    })
    .await;
    assert_eq!((s.allocated_cs2, s.phase), (Some(cs2), Some(Phase::Running)), "{what}: {s:?}");
    let took = since.elapsed();
    let from = s.progress.step.unwrap_or(0);
    e2e::wait_job(jobs, name, Duration::from_secs(300), &format!("{what}, then 100 steps"), |s| {
        s.progress.step.is_some_and(|st| st >= from + 100)
    })
    .await;
    (from, took)
}

/// The node running pod `pod` of the job.
async fn node_of(pods: &Api<Pod>, job: &str, pod: &str) -> String {
    let placed = nodes_of(pods, job).await;
    let node = placed.iter().find(|(p, _)| p == pod).map(|(_, n)| n.clone());
    node.unwrap_or_else(|| panic!("{pod} runs nowhere: {placed:?}"))
}

/// `kubectl drain NODE` for the job's pods: the node cordoned, then each of the job's pods on it evicted
/// (graceful: MemoryX checkpoints on SIGTERM).
async fn drain(client: &Client, ns: &str, node: &str) {
    cordon(client, node, true).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    for p in ok(pods.list(&on_node).await, "the pods on the node").items {
        ok(pods.evict(&p.name_any(), &EvictParams::default()).await, &format!("evict {}", p.name_any()));
    }
}

/// A 4-CS-2 job with `minCs2: 2` over the two workers meets three ways to lose one, each time on the worker that
/// runs MemoryX's coordinator: first a drain (cordon, the job's pods evicted: MemoryX checkpoints on SIGTERM),
/// undone by uncordon; then the node's container paused (a hung host: the node controller finds it not ready,
/// and the operator takes its pods back), undone by unpause; then it stopped (a host gone), undone by starting
/// it (its kubelet joins again). Each time the job goes on with 2 CS-2s on the other
/// worker from its newest checkpoint, says so (status, a `CapacityLost` Event) and grows back to 4; it ends with
/// the undisturbed run's losses within 1e-6 relative (one job for the three faults: CI time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "CI time: ~25 min of a 2-core machine's CPU (24,000 steps on the cluster and once more undisturbed); \
            on kind: cargo test --release --workspace --test nodes -- --ignored (e2e/kind/README.md)"]
async fn a_worker_drained_then_one_lost_the_job_goes_on_with_min_cs2_and_grows_back() {
    let _serial = SERIAL.lock().await;
    let (client, ns, _kc, hosts) = setup("lost").await;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = "lost";
    // Each loss takes up to the node controller's grace period (50 s), the operator's (30 s) and a restart from
    // the last checkpoint; each return a checkpoint and a restart: the job must outlast all six.
    let steps = 24_000;
    let mut j = job(name, 4, steps);
    j.spec.min_cs2 = Some(2);
    let mut undisturbed = j.clone();
    undisturbed.spec.min_cs2 = None;
    let want = cluster::undisturbed_beside(&undisturbed, &[]);
    ok(jobs.create(&PostParams::default(), &j).await, "create the job");
    let (at, _) = runs_on(&jobs, name, 4, Instant::now(), "the job to train on 4").await;
    let coordinator = format!("{name}-memoryx-0");
    for fault in ["drain", "pause", "stop"] {
        let node = node_of(&pods, name, &coordinator).await;
        assert!(hosts.contains(&node), "{node} is a CS-2 host");
        let repair = Repair { node: node.clone(), client: client.clone() };
        let lost = Instant::now();
        match fault {
            "drain" => drain(&client, &ns, &node).await,
            _ => node_sh(fault, &node),
        }
        let (on_two, took) = runs_on(&jobs, name, 2, lost, &format!("the job to go on with 2 CS-2s ({fault})")).await;
        let placed = nodes_of(&pods, name).await;
        assert!(placed.iter().all(|(_, n)| n != &node), "nothing of the job left on {node}: {placed:?}");
        // The status says it holds fewer than it asked for, and waits to grow back.
        let s = ok(jobs.get(name).await, "the job").status.unwrap_or_default();
        let admitted =
            s.conditions.iter().find(|c| c.type_ == "Admitted").map(|c| (c.reason.as_str(), c.message.as_str()));
        assert!(
            s.allocated_cs2 == Some(2)
                && admitted.is_some_and(|(r, m)| {
                    matches!(r, "RescaleWaitingForCapacity" | "CapacityLost") && m.contains("holds 2")
                }),
            "the status says the job holds 2 of its 4 CS-2s: {:?}",
            s.conditions
        );
        assert!(said(&client, &ns, "CapacityLost").await, "a CapacityLost Event");
        let back = Instant::now();
        drop(repair); // uncordon, unpause or start
        let (on_four, grew) = runs_on(&jobs, name, 4, back, &format!("the job to grow back to 4 ({fault})")).await;
        eprintln!(
            "{fault} of {node} after step {at}: on 2 CS-2s from step {on_two}, {took:.0?} later; back on 4 from \
             step {on_four}, {grew:.0?} after the node's return"
        );
    }
    // The tail after the last return: ~23,000 steps at ~28 a second on kind (it took ~15 min here).
    let end = e2e::wait_job(&jobs, name, Duration::from_secs(1_800), "the job to end", |_| false).await;
    assert_eq!((end.phase, end.progress.step), (Some(Phase::Succeeded), Some(steps)), "{end:?}");
    let (loss, eval) = (end.progress.loss.expect("a final loss"), end.progress.eval_loss.expect("held-out"));
    let want = ok(want.await, "the undisturbed run");
    eprintln!("lost: final loss {loss} (undisturbed {}), held-out {eval} (undisturbed {})", want.0, want.1);
    let rel = |a: f64, b: f64| ((a - b) / b).abs();
    assert!(rel(loss, want.0) <= 1e-6, "final loss as undisturbed: {loss} vs {}", want.0);
    assert!(rel(eval, want.1) <= 1e-6, "held-out loss as undisturbed: {eval} vs {}", want.1);
    done(&client, &ns).await;
}
