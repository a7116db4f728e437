//! Issue 16's control plane at scale, on the local cluster (`e2e/cluster/up.sh`) with kwok playing 48 hosts of 4
//! CS-2s each: a 192-CS-2 job (192 engines, the three-level SwarmX tree of fan-out 8, 4 weight servers) is
//! assembled and brought to Running, rescaled 192 → 96, and three large jobs queue behind it in order and are
//! admitted as CS-2s come free.
//!
//! kwok (started by up.sh, managing only nodes annotated `kwok.x-k8s.io/node=fake`) keeps the fake nodes Ready
//! and marks the pods the scheduler binds to them Running and Ready; there is no data plane, so the test serves
//! MemoryX's reports itself (the operator runs in this process with a `ScriptedCoordinator`). The real node is
//! cordoned meanwhile (its kubelet would try to run the pods) and the chart's operator, if installed, scaled to
//! zero (it would reconcile the same jobs); both are restored afterwards, also when the test fails.
//!
//! It measures and prints (to stderr, uncaptured, and to `$CARGO_TARGET_TMPDIR/scale-report.txt`): the time from
//! apply to all pods created and running at 192, reconcile latency p50/p99 (from the operator's histogram), the
//! test process's peak memory (the operator runs in it), and the operator's API requests per reconcile (a layer
//! on its client counts them).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use crds::contract::{MemoryxPhase, MemoryxStatus, SwarmxTree};
use crds::{CheckpointRef, Phase, TrainingJob};
use e2e::{RunningOperator, cluster, install_crd};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use operator::config::Config;

/// Fake hosts, and CS-2s on each: the 192-CS-2 pool of the issue.
const NODES: u32 = 48;
const CS2_PER_NODE: u32 = 4;
/// The big job's sizes, the queued jobs' size, its weight servers and the SwarmX fan-out.
const BIG: u32 = 192;
const HALF: u32 = 96;
const LARGE: u32 = 128;
const SERVERS: u32 = 4;
const FAN_OUT: u32 = 8;
/// The annotation kwok manages nodes by (up.sh's `--manage-nodes-with-annotation-selector`).
const KWOK_KEY: &str = "kwok.x-k8s.io/node";
const KWOK_VALUE: &str = "fake";
const NODE_PREFIX: &str = "ws-kwok-";
/// Checkpoint volumes for the weight servers: hostPath PersistentVolumes of their own class, with no node
/// affinity, so a server pod may land on any fake host (nothing mounts them: kwok runs no container).
const STORAGE_CLASS: &str = "ws-kwok";
const VOLUMES: u32 = 8;
const WAIT: Duration = Duration::from_secs(300);

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The operator's API requests, by kind: watches (long-lived), reads and writes.
#[derive(Default, Debug)]
struct Calls {
    watches: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
}

impl Calls {
    fn snapshot(&self) -> (u64, u64, u64) {
        (self.watches.load(Ordering::Relaxed), self.reads.load(Ordering::Relaxed), self.writes.load(Ordering::Relaxed))
    }
}

/// A tower layer on the operator's kube client that counts each request it sends.
#[derive(Clone)]
struct Count(Arc<Calls>);

impl<S> tower::Layer<S> for Count {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, calls: self.0.clone() }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    calls: Arc<Calls>,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        let watch = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let counter = if watch {
            &self.calls.watches
        } else if req.method() == http::Method::GET {
            &self.calls.reads
        } else {
            &self.calls.writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.inner.call(req)
    }
}

/// A client for `kubeconfig` whose every request is counted in `calls`.
async fn counted_client(kubeconfig: &Path, calls: Arc<Calls>) -> Client {
    let kc = ok(Kubeconfig::read_from(kubeconfig), "kubeconfig");
    let config = ok(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await, "client config");
    let builder = ok(kube::client::ClientBuilder::try_from(config), "client builder");
    builder.with_layer(&Count(calls)).build()
}

/// The reconcile-duration histogram's cumulative buckets (upper bound in seconds, count), from `/metrics` text.
fn buckets(metrics: &str) -> Vec<(f64, u64)> {
    let prefix = "weightstream_operator_reconcile_duration_seconds_bucket{le=\"";
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (le, count) = rest.split_once("\"}")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of the passes between two snapshots of the histogram, interpolated linearly inside its
/// bucket (the buckets double from 1 ms, so this is an estimate within that bucket), and how many passes.
fn quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> (String, u64) {
    let delta: Vec<(f64, u64)> =
        after.iter().map(|&(le, n)| (le, n - before.iter().find(|b| b.0 == le).map_or(0, |b| b.1))).collect();
    let total = delta.last().map_or(0, |d| d.1);
    if total == 0 {
        return ("n/a".into(), 0);
    }
    let want = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(le, n) in &delta {
        if n as f64 >= want {
            if le.is_infinite() {
                return (format!("> {:.3} s", lower.0), total);
            }
            let span = (n - lower.1).max(1) as f64;
            let at = lower.0 + (le - lower.0) * ((want - lower.1 as f64) / span).clamp(0.0, 1.0);
            return (format!("{:.1} ms", at * 1e3), total);
        }
        lower = (le, n);
    }
    ("n/a".into(), total)
}

/// This process's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The report: stderr (not captured by the test harness, so it stays in the test output) and a file.
fn report(lines: &[String]) {
    let text =
        format!("\n==== scale report (issue 16) ====\n{}\n=================================\n", lines.join("\n"));
    let _ = std::io::stderr().write_all(text.as_bytes());
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scale-report.txt");
    let _ = std::fs::write(path, text);
}

/// What the test changed on the cluster outside its namespace, to put back.
#[derive(Default)]
struct Fixture {
    /// Deployments of the chart's operator that were scaled to zero, with their replicas.
    paused: Vec<(String, String, i32)>,
    /// Real nodes cordoned for the test.
    cordoned: Vec<String>,
}

fn kwok_node(i: u32) -> Node {
    let name = format!("{NODE_PREFIX}{i:02}");
    let resources = serde_json::json!({
        "cpu": "64", "memory": "512Gi", "pods": "110", "weightstream.dev/cs2": CS2_PER_NODE.to_string()
    });
    ok(
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "annotations": { KWOK_KEY: KWOK_VALUE },
                "labels": { "type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" }
            },
            // kwok gives the pods bound here addresses from the node's podCIDR.
            "spec": { "podCIDR": format!("10.201.{i}.0/24") },
            "status": { "capacity": resources, "allocatable": resources }
        })),
        "node",
    )
}

fn is_kwok(n: &Node) -> bool {
    n.annotations().get(KWOK_KEY).map(String::as_str) == Some(KWOK_VALUE)
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Removes what an earlier, interrupted run may have left: its fake nodes and volumes.
async fn remove_fakes(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ok(nodes.list(&ListParams::default()).await, "list nodes").items {
        if n.name_any().starts_with(NODE_PREFIX) {
            let _ = nodes.delete(&n.name_any(), &DeleteParams::default()).await;
        }
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pv in ok(pvs.list(&ListParams::default()).await, "list volumes").items {
        if pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(STORAGE_CLASS) {
            let _ = pvs.delete(&pv.name_any(), &DeleteParams::default()).await;
        }
    }
}

impl Fixture {
    async fn set_up(client: &Client) -> Fixture {
        let mut f = Fixture::default();
        // The chart's operator would reconcile the test's jobs too (it watches every namespace).
        let deployments: Api<Deployment> = Api::all(client.clone());
        let sel = ListParams::default().labels("app.kubernetes.io/component=operator");
        for d in ok(deployments.list(&sel).await, "list deployments").items {
            let (ns, name) = (d.namespace().unwrap_or_default(), d.name_any());
            let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if replicas == 0 {
                continue;
            }
            let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            let zero = serde_json::json!({ "spec": { "replicas": 0 } });
            ok(api.patch(&name, &PatchParams::default(), &Patch::Merge(&zero)).await, "pause the chart's operator");
            f.paused.push((ns.clone(), name.clone(), replicas));
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            ok(
                e2e::wait_for(Duration::from_secs(60), "the chart's operator pods to go", || async {
                    pods.list(&sel).await.ok()?.items.is_empty().then_some(())
                })
                .await,
                "pause",
            );
        }
        remove_fakes(client).await;
        // The real node's kubelet would really run the pods: only the fake hosts take them.
        let nodes: Api<Node> = Api::all(client.clone());
        for n in ok(nodes.list(&ListParams::default()).await, "list nodes").items {
            if is_kwok(&n) || n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
                continue;
            }
            let cordon = serde_json::json!({ "spec": { "unschedulable": true } });
            ok(nodes.patch(&n.name_any(), &PatchParams::default(), &Patch::Merge(&cordon)).await, "cordon");
            f.cordoned.push(n.name_any());
        }
        let classes: Api<StorageClass> = Api::all(client.clone());
        let class: StorageClass = ok(
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": STORAGE_CLASS },
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "Immediate",
                "reclaimPolicy": "Retain"
            })),
            "storage class",
        );
        ok(
            classes.patch(STORAGE_CLASS, &PatchParams::apply("ws-scale").force(), &Patch::Apply(&class)).await,
            "storage class",
        );
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        for i in 0..VOLUMES {
            let pv: PersistentVolume = ok(
                serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("{STORAGE_CLASS}-{i}") },
                    "spec": {
                        "capacity": { "storage": "1Gi" },
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": STORAGE_CLASS,
                        "hostPath": { "path": format!("/tmp/ws-kwok-pv/{i}") }
                    }
                })),
                "volume",
            );
            ok(pvs.create(&PostParams::default(), &pv).await, "create a volume");
        }
        f
    }

    async fn tear_down(self, client: &Client) {
        remove_fakes(client).await;
        let _ = Api::<StorageClass>::all(client.clone()).delete(STORAGE_CLASS, &DeleteParams::default()).await;
        let nodes: Api<Node> = Api::all(client.clone());
        for n in &self.cordoned {
            let uncordon = serde_json::json!({ "spec": { "unschedulable": null } });
            if let Err(e) = nodes.patch(n, &PatchParams::default(), &Patch::Merge(&uncordon)).await {
                eprintln!("cannot uncordon {n}: {e}");
            }
        }
        for (ns, name, replicas) in &self.paused {
            let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
            let back = serde_json::json!({ "spec": { "replicas": replicas } });
            if let Err(e) = api.patch(name, &PatchParams::default(), &Patch::Merge(&back)).await {
                eprintln!("cannot restore {ns}/{name}: {e}");
            }
        }
    }
}

/// The pods of `job` (all, or only the operator's own: not MemoryX's, which its StatefulSet rolls one at a
/// time): how many exist (not terminating), and how many of those are Running.
async fn pod_counts(pods: &Api<Pod>, job: &str, with_memoryx: bool) -> (usize, usize) {
    let mut sel = format!("weightstream.dev/job={job}");
    if !with_memoryx {
        sel.push_str(",weightstream.dev/role!=memoryx");
    }
    let sel = ListParams::default().labels(&sel);
    let Ok(list) = pods.list(&sel).await else { return (0, 0) };
    let live: Vec<&Pod> = list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let running = live.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count();
    (live.len(), running)
}

/// Polls (every `every`) until `check` holds, failing after `timeout` with `what`.
async fn until<T, F, Fut>(timeout: Duration, every: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

async fn status_of(jobs: &Api<TrainingJob>, name: &str) -> Option<crds::TrainingJobStatus> {
    jobs.get(name).await.ok()?.status
}

async fn wait_phase(jobs: &Api<TrainingJob>, name: &str, phase: Phase) -> crds::TrainingJobStatus {
    until(WAIT, Duration::from_millis(500), &format!("{name} to reach {phase}"), || async {
        status_of(jobs, name).await.filter(|s| s.phase == Some(phase))
    })
    .await
}

fn running(step: u64, checkpoint: Option<u64>) -> MemoryxStatus {
    let mut s = MemoryxStatus::at(MemoryxPhase::Running, step);
    s.progress.total_steps = Some(1000);
    s.progress.loss = Some(1.0 / (1.0 + step as f64));
    s.progress.last_checkpoint = checkpoint.map(|c| CheckpointRef { step: c, path: format!("ckpt-{c:08}") });
    s
}

/// A job of `cs2` CS-2s whose batch divides at 192, 128 and 96, with `SERVERS` weight servers whose volumes
/// come from the test's class.
fn scale_job(name: &str, cs2: u32) -> TrainingJob {
    // Made valid at one CS-2 (the shared test job's batch does not divide by 192), then sized.
    let mut j = e2e::job(name, 1);
    j.spec.cs2 = cs2;
    j.spec.training.batch_size = 384;
    j.spec.memoryx.servers = Some(SERVERS);
    j.spec.checkpoint.storage_class_name = Some(STORAGE_CLASS.into());
    j.spec.checkpoint.volume_size = "1Gi".into();
    j
}

fn pods_at(cs2: u32) -> usize {
    let tree = SwarmxTree::new(cs2, FAN_OUT);
    tree.nodes().count() + 2 * cs2 as usize + SERVERS as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_192_cs2_job_assembles_rescales_to_96_and_three_large_jobs_queue() {
    let kc =
        ok(ok(tokio::task::spawn_blocking(cluster::kubeconfig).await, "up.sh task"), "no cluster for the scale tests");
    let client = ok(e2e::client_for(&kc).await, "client");
    ok(install_crd(&client).await, "install the CRD");
    let fixture = Fixture::set_up(&client).await;
    let outcome = tokio::spawn(scenario(client.clone(), kc.clone())).await;
    fixture.tear_down(&client).await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(p) => std::panic::resume_unwind(p),
            Err(e) => panic!("the scenario did not finish: {e}"),
        }
    }
}

async fn scenario(client: Client, kc: std::path::PathBuf) {
    let mut out: Vec<String> = Vec::new();
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    for i in 0..NODES {
        ok(nodes.create(&PostParams::default(), &kwok_node(i)).await, "create a fake node");
    }
    until(
        Duration::from_secs(120),
        Duration::from_millis(500),
        "kwok to make the fake nodes Ready (is kwok running? e2e/cluster/up.sh starts it)",
        || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            let fakes = list.items.iter().filter(|n| is_kwok(n) && ready(n)).count();
            (fakes == NODES as usize).then_some(())
        },
    )
    .await;
    let pool: u64 = ok(nodes.list(&ListParams::default()).await, "nodes")
        .items
        .iter()
        .filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get("weightstream.dev/cs2")?.0.parse::<u64>().ok())
        .sum();
    out.push(format!(
        "fake nodes: {NODES} × {CS2_PER_NODE} CS-2 Ready in {:.1} s; pool (all nodes) {pool} CS-2",
        started.elapsed().as_secs_f64()
    ));
    assert!(pool >= u64::from(NODES * CS2_PER_NODE), "the pool is {pool}");

    let ns = ok(e2e::namespace(&client, "scale").await, "namespace");
    let calls = Arc::new(Calls::default());
    let op_client = counted_client(&kc, calls.clone()).await;
    let config = Config {
        namespace: Some(ns.clone()),
        pool: None,
        fan_out: FAN_OUT,
        poll: Duration::from_secs(1),
        ..Config::default()
    };
    let op = RunningOperator::start_with(&op_client, config);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let key = |name: &str| format!("{ns}/{name}");
    let passes = |m: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with("weightstream_operator_reconciles_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    };

    // --- 192: apply → every pod created → every pod running → the job Running. ---
    let _ = std::fs::write("/proc/self/clear_refs", "5"); // restart VmHWM's count from here
    let rss_before = peak_rss_mib();
    let (m0, c0) = (op.shared.metrics.encode(), calls.snapshot());
    let want = pods_at(BIG);
    let t0 = Instant::now();
    ok(jobs.create(&PostParams::default(), &scale_job("big", BIG)).await, "create the 192-CS-2 job");
    until(WAIT, Duration::from_millis(250), &format!("{want} pods of the 192-CS-2 job"), || async {
        let sel = ListParams::default().labels("weightstream.dev/job=big");
        let n = pods.list_metadata(&sel).await.ok()?.items.len();
        (n >= want).then_some(())
    })
    .await;
    let created = t0.elapsed();
    until(WAIT, Duration::from_secs(1), "every pod of the 192-CS-2 job Running", || async {
        let (n, r) = pod_counts(&pods, "big", true).await;
        (n == want && r == want).then_some(())
    })
    .await;
    let pods_running = t0.elapsed();
    op.coordinator.set(&key("big"), running(5, None));
    let s = wait_phase(&jobs, "big", Phase::Running).await;
    let job_running = t0.elapsed();
    let (m1, c1) = (op.shared.metrics.encode(), calls.snapshot());

    // What was assembled: the plan's tree of three levels, 192 engines on the fake hosts, 4 weight servers.
    let tree = SwarmxTree::new(BIG, FAN_OUT);
    let plan = s.plan.clone().unwrap_or_else(|| panic!("no plan in the status"));
    assert_eq!((plan.cs2, plan.swarmx.depth, plan.swarmx.nodes.len()), (BIG, 3, tree.nodes().count()));
    assert_eq!(s.allocated_cs2, Some(BIG));
    let sts = ok(Api::<StatefulSet>::namespaced(client.clone(), &ns).get("big-memoryx").await, "MemoryX");
    assert_eq!(sts.spec.as_ref().and_then(|s| s.replicas), Some(SERVERS as i32), "a StatefulSet of the weight servers");
    let list = ok(pods.list(&ListParams::default().labels("weightstream.dev/job=big")).await, "pods").items;
    let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
    for p in list.iter().filter(|p| p.labels().get("weightstream.dev/role").map(String::as_str) == Some("engine")) {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        assert!(node.starts_with(NODE_PREFIX), "{} is on {node:?}, not a fake CS-2 host", p.name_any());
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node.values().sum::<u32>(), BIG);
    assert!(per_node.values().all(|&n| n <= CS2_PER_NODE), "at most one engine per CS-2: {per_node:?}");
    let servers: Vec<String> = list
        .iter()
        .filter(|p| p.labels().get("weightstream.dev/role").map(String::as_str) == Some("memoryx"))
        .map(|p| {
            format!("{}#{}", p.name_any(), p.labels().get("apps.kubernetes.io/pod-index").cloned().unwrap_or_default())
        })
        .collect();
    assert_eq!(servers.len(), SERVERS as usize, "{servers:?}");

    // Steady state at 192: MemoryX reports a new step every second for 10 s.
    let steady0 = (op.shared.metrics.encode(), calls.snapshot());
    for step in 6..16 {
        op.coordinator.set(&key("big"), running(step, None));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let steady1 = (op.shared.metrics.encode(), calls.snapshot());
    let peak = peak_rss_mib();

    let per = |m_a: &str, m_b: &str, c_a: (u64, u64, u64), c_b: (u64, u64, u64)| {
        let n = passes(m_b) - passes(m_a);
        let (reads, writes) = (c_b.1 - c_a.1, c_b.2 - c_a.2);
        let (p50, _) = quantile(&buckets(m_a), &buckets(m_b), 0.50);
        let (p99, _) = quantile(&buckets(m_a), &buckets(m_b), 0.99);
        format!(
            "{n} reconcile passes; latency p50 {p50}, p99 {p99}; API requests {} ({reads} reads, {writes} writes, {} watches opened) = {:.1} per pass",
            reads + writes,
            c_b.0 - c_a.0,
            (reads + writes) as f64 / n.max(1) as f64
        )
    };
    out.push(format!(
        "192 CS-2s ({want} pods: {} SwarmX in 3 levels, {BIG} engines, {BIG} input workers, {SERVERS} weight servers)",
        tree.nodes().count()
    ));
    out.push(format!(
        "  apply → all pods created {:.1} s; → all pods Running (kwok) {:.1} s; → job Running {:.1} s",
        created.as_secs_f64(),
        pods_running.as_secs_f64(),
        job_running.as_secs_f64()
    ));
    out.push(format!("  assembling (apply → Running): {}", per(&m0, &m1, c0, c1)));
    out.push(format!(
        "  steady state (10 s Running, a step a second): {}",
        per(&steady0.0, &steady1.0, steady0.1, steady1.1)
    ));
    out.push(format!(
        "  peak RSS of the test process (operator in-process, VmHWM): {peak:.0} MiB (VmHWM {rss_before:.0} MiB just before apply)"
    ));
    out.push(format!(
        "  engines per fake host: {:?}",
        per_node.values().fold(BTreeMap::<u32, u32>::new(), |mut m, n| {
            *m.entry(*n).or_default() += 1;
            m
        })
    ));

    report(&out);

    // --- Rescale 192 → 96: a checkpoint first, then the appliance reassembled at 96. ---
    let (m2, c2) = (op.shared.metrics.encode(), calls.snapshot());
    let t1 = Instant::now();
    let half = serde_json::json!({ "spec": { "cs2": HALF } });
    ok(jobs.patch("big", &PatchParams::default(), &Patch::Merge(&half)).await, "rescale to 96");
    until(WAIT, Duration::from_millis(500), "the job to hold 96 CS-2s", || async {
        (status_of(&jobs, "big").await?.allocated_cs2 == Some(HALF)).then_some(())
    })
    .await;
    let claimed = t1.elapsed();
    assert!(op.coordinator.checkpoint_requests().contains(&key("big")), "rescaling checkpoints first");
    // The operator's pods at 96, replaced (every one reads the new job.yaml) and Running; MemoryX's StatefulSet
    // rolls its servers meanwhile, one at a time.
    let want_half = pods_at(HALF) - SERVERS as usize;
    until(
        WAIT,
        Duration::from_secs(1),
        &format!("{want_half} SwarmX, engine and input pods at 96, all Running"),
        || async {
            let (n, r) = pod_counts(&pods, "big", false).await;
            (n == want_half && r == want_half).then_some(())
        },
    )
    .await;
    let reassembled = t1.elapsed();
    op.coordinator.set(&key("big"), running(16, Some(15)));
    let s = until(WAIT, Duration::from_millis(500), "the job Running at 96", || async {
        status_of(&jobs, "big")
            .await
            .filter(|s| s.phase == Some(Phase::Running) && s.plan.as_ref().is_some_and(|p| p.cs2 == HALF))
    })
    .await;
    let (m3, c3) = (op.shared.metrics.encode(), calls.snapshot());
    assert_eq!(s.plan.as_ref().map(|p| p.swarmx.nodes.len()), Some(SwarmxTree::new(HALF, FAN_OUT).nodes().count()));
    out.push(format!(
        "rescale 192 → 96: claim {:.1} s, {want_half} SwarmX/engine/input pods Running {:.1} s, job Running {:.1} s; {}",
        claimed.as_secs_f64(),
        reassembled.as_secs_f64(),
        t1.elapsed().as_secs_f64(),
        per(&m2, &m3, c2, c3)
    ));

    report(&out);

    // --- Three large jobs queue in arrival order behind the 96 held; one is admitted when the big job ends. ---
    for name in ["q1", "q2", "q3"] {
        ok(jobs.create(&PostParams::default(), &scale_job(name, LARGE)).await, "create a large job");
        // Arrival order is the creation timestamp, in seconds.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let mut seen = Vec::new();
    for (name, position) in [("q1", 1), ("q2", 2), ("q3", 3)] {
        let s = until(WAIT, Duration::from_millis(500), &format!("{name} queued at position {position}"), || async {
            status_of(&jobs, name)
                .await
                .filter(|s| s.phase == Some(Phase::Queued) && s.queue_position == Some(position))
        })
        .await;
        let admitted =
            s.conditions.iter().find(|c| c.type_ == "Admitted").map(|c| c.reason.clone()).unwrap_or_default();
        assert_eq!(s.allocated_cs2, None);
        seen.push(format!("{name}: Queued #{position} ({admitted})"));
    }
    assert!(seen[0].contains("InsufficientCapacity"), "{seen:?}");
    let t2 = Instant::now();
    op.coordinator.set(&key("big"), MemoryxStatus { phase: MemoryxPhase::Succeeded, ..running(1000, Some(1000)) });
    wait_phase(&jobs, "big", Phase::Succeeded).await;
    let q1 = wait_phase(&jobs, "q1", Phase::Starting).await;
    assert_eq!(q1.allocated_cs2, Some(LARGE));
    let admitted = t2.elapsed();
    for (name, position) in [("q2", 1), ("q3", 2)] {
        until(WAIT, Duration::from_millis(500), &format!("{name} to move up to {position}"), || async {
            status_of(&jobs, name)
                .await
                .filter(|s| s.phase == Some(Phase::Queued) && s.queue_position == Some(position))
        })
        .await;
    }
    out.push(format!(
        "queue of three 128-CS-2 jobs behind 96 held: {}; the big job's end admits q1 in {:.1} s, q2/q3 move up to #1/#2",
        seen.join(", "),
        admitted.as_secs_f64()
    ));
    out.push(format!("peak RSS over the whole test (VmHWM since apply): {:.0} MiB", peak_rss_mib()));
    report(&out);

    // Everything goes with the namespace, while the operator still runs to remove its finalizers.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    ok(namespaces.delete(&ns, &DeleteParams::default()).await.map(|_| ()), "delete the namespace");
    until(WAIT, Duration::from_secs(1), "the test's namespace to be gone", || async {
        namespaces.get_opt(&ns).await.ok()?.is_none().then_some(())
    })
    .await;
    op.stop().await;
}
