//! Kueue admits TrainingJobs, on the real cluster with Kueue installed by `e2e/kueue/up.sh` (built from its Go
//! module): a job labelled `kueue.x-k8s.io/queue-name` waits as a Workload the operator made, runs when Kueue
//! admits it, and gives its quota back at the end or when Kueue evicts it.
//!
//! - quota: a ClusterQueue with quota for 2 CS-2s runs jobs of 2 one after another; the waiting ones say Kueue's
//!   reason, their ClusterQueue and their position; a suspended job's Workload is deactivated, so the next job
//!   is admitted in its place, and resumed it queues again; a job of 4 with `minCs2: 2` is admitted with 2
//!   (partial admission) and trains the 4-CS-2 curve; every job ends with its undisturbed losses.
//! - preemption: a job of a higher WorkloadPriorityClass preempts a running one in a full ClusterQueue; the low
//!   job checkpoints, requeues, resumes from that checkpoint and ends with its undisturbed losses, bit for bit.
//!
//! The two tests run side by side on separate ClusterQueues, using at most 2 CS-2s each.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crds::{Phase, TrainingJob, TrainingJobStatus};
use e2e::cluster;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use operator::kueue::api::workloads::Workload;
use operator::kueue::workload::{PRIORITY_LABEL, QUEUE_LABEL};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Kueue, installed once for the file's tests.
static KUEUE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

async fn kueue_up(kc: &Path) {
    KUEUE
        .get_or_init(|| async {
            let script = cluster::repo_root().join("e2e/kueue/up.sh");
            let started = Instant::now();
            ok(cluster::run(Command::new("bash").arg(script).env("KUBECONFIG", kc)), "e2e/kueue/up.sh");
            eprintln!("Kueue up in {:.0?}", started.elapsed());
        })
        .await;
}

/// Applies a Kueue object given as JSON (server-side), cluster-scoped unless it names a namespace.
async fn apply(client: &Client, obj: serde_json::Value) {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind);
    let ar = ApiResource::from_gvk(&gvk);
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    ok(
        api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&obj)).await,
        &format!("apply {kind} {name}"),
    );
}

async fn delete(client: &Client, kind: &str, name: &str) {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind));
    let _ = Api::<DynamicObject>::all_with(client.clone(), &ar).delete(name, &DeleteParams::default()).await;
}

/// A flavor, a ClusterQueue `ns` with `quota` CS-2s for namespace `ns` alone (preempting lower priorities
/// within it), and the LocalQueue `team` in `ns`.
async fn queues(client: &Client, ns: &str, quota: u32) {
    apply(
        client,
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": ns}, "spec": {}
        }),
    )
    .await;
    apply(
        client,
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [{
                    "coveredResources": ["weightstream.dev/cs2"],
                    "flavors": [{"name": ns, "resources": [{"name": "weightstream.dev/cs2", "nominalQuota": quota}]}]
                }]
            }
        }),
    )
    .await;
    apply(
        client,
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": ns}, "spec": {"clusterQueue": ns}
        }),
    )
    .await;
}

/// `fc-mnist-sparse` on `cs2` CS-2s for `steps` steps in LocalQueue `team`, a checkpoint every 100 steps.
fn job(name: &str, cs2: u32, steps: u64) -> TrainingJob {
    let mut j = ok(cluster::example("fc-mnist-sparse.yaml"), "the example");
    j.metadata.name = Some(name.into());
    j.metadata.labels = Some([(QUEUE_LABEL.to_string(), "team".to_string())].into());
    j.spec.cs2 = cs2;
    (j.spec.training.epochs, j.spec.training.steps) = (None, Some(steps));
    j.spec.checkpoint.interval_steps = 100;
    j.spec.checkpoint.retain = crds::RetainPolicy::Delete;
    j
}

fn admitted(s: &TrainingJobStatus) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.conditions.iter().find(|c| c.type_ == "Admitted")
}

/// Creates `job` and waits until its Workload exists and the next second has begun. Kueue orders the Workloads
/// of one priority by their creation time, which the API server keeps in whole seconds; the operator creates a
/// Workload when it first sees its job, so jobs created a second apart may still get Workloads in another order.
async fn create_in_turn(jobs: &Api<TrainingJob>, workloads: &Api<Workload>, job: &TrainingJob) {
    let name = job.name_any();
    ok(jobs.create(&PostParams::default(), job).await, "create a job");
    let prefix = format!("trainingjob-{name}-");
    let made = e2e::wait_for(Duration::from_secs(60), "the job's Workload", || async {
        let list = workloads.list(&Default::default()).await.ok()?.items;
        list.iter().any(|w| w.name_any().starts_with(&prefix)).then_some(())
    })
    .await;
    ok(made, &format!("{name}'s Workload created"));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
}

async fn setup(prefix: &str) -> (Client, String, Api<TrainingJob>) {
    let kc = ok(cluster::with_chart(), "the cluster with the chart");
    kueue_up(&kc).await;
    let client = ok(e2e::client_for(&kc).await, "a client");
    let ns = ok(e2e::namespace(&client, prefix).await, "a namespace");
    let jobs = Api::namespaced(client.clone(), &ns);
    (client, ns, jobs)
}

async fn teardown(client: &Client, ns: &str) {
    let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    delete(client, "ClusterQueue", ns).await;
    delete(client, "ResourceFlavor", ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_of_2_runs_jobs_in_turn_and_admits_a_shrinkable_job_partially() {
    let (client, ns, jobs) = setup("kueue-quota").await;
    queues(&client, &ns, 2).await;
    let steps = 300;
    // a runs long enough to be suspended mid-run.
    let (a, b) = (job("a", 2, 1_000), job("b", 2, steps));
    let mut c = job("c", 4, steps);
    c.spec.min_cs2 = Some(2);
    let want_a = cluster::undisturbed_beside(&a, &[]);
    let want_2 = cluster::undisturbed_beside(&b, &[]);
    let want_4 = cluster::undisturbed_beside(&c, &[]);
    let started = Instant::now();
    let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
    for j in [&a, &b, &c] {
        create_in_turn(&jobs, &workloads, j).await;
    }
    let s = e2e::wait_job(&jobs, "a", Duration::from_secs(300), "a to run", |s| s.phase == Some(Phase::Running)).await;
    assert_eq!((s.phase, s.allocated_cs2), (Some(Phase::Running), Some(2)), "{s:?}");
    // Both others wait, saying Kueue's reason, the ClusterQueue and where they stand.
    for (name, position) in [("b", 1), ("c", 2)] {
        let s = e2e::wait_job(&jobs, name, Duration::from_secs(60), "the queue position", |s| {
            s.queue_position == Some(position)
        })
        .await;
        let (reason, message) = admitted(&s).map(|c| (c.reason.clone(), c.message.clone())).unwrap_or_default();
        eprintln!("{name} waits: {reason} {message}");
        assert_eq!((s.phase, reason.as_str()), (Some(Phase::Queued), "KueueQueued"), "{s:?}");
        assert!(message.contains(&format!("ClusterQueue '{ns}'")), "{message}");
        assert!(message.contains(&format!("position {position}")), "{message}");
    }
    // Suspended, a gives its quota back: its Workload is deactivated and b is admitted in its place. Resumed, a
    // queues again (and later resumes from its checkpoint).
    let suspend = |on: bool| serde_json::json!({ "spec": { "suspend": on } });
    ok(jobs.patch("a", &PatchParams::default(), &Patch::Merge(suspend(true))).await, "suspend a");
    let s =
        e2e::wait_job(&jobs, "a", Duration::from_secs(300), "a to be suspended", |s| s.phase == Some(Phase::Suspended))
            .await;
    assert_eq!(s.phase, Some(Phase::Suspended), "a ended before its suspension: {s:?}");
    let active = |want: bool| {
        let workloads = workloads.clone();
        async move {
            let list = workloads.list(&Default::default()).await.ok()?.items;
            let w = list.into_iter().find(|w| w.name_any().starts_with("trainingjob-a-"))?;
            (w.spec.active.unwrap_or(true) == want).then_some(())
        }
    };
    ok(e2e::wait_for(Duration::from_secs(60), "a's Workload to be inactive", || active(false)).await, "deactivated");
    let s = e2e::wait_job(&jobs, "b", Duration::from_secs(300), "b to run in a's place", |s| {
        s.phase == Some(Phase::Running)
    })
    .await;
    assert_eq!((s.phase, s.allocated_cs2), (Some(Phase::Running), Some(2)), "{s:?}");
    ok(jobs.patch("a", &PatchParams::default(), &Patch::Merge(suspend(false))).await, "resume a");
    ok(e2e::wait_for(Duration::from_secs(60), "a's Workload to be active", || active(true)).await, "reactivated");
    let s = e2e::wait_job(&jobs, "a", Duration::from_secs(60), "a to queue again", |s| {
        admitted(s).is_some_and(|c| c.reason == "KueueQueued")
    })
    .await;
    assert_eq!(s.phase, Some(Phase::Queued), "{s:?}");
    // A job labelled for a LocalQueue that does not exist waits saying so; an unlabelled one is the operator's.
    let mut lost = job("lost", 1, steps);
    lost.metadata.labels = Some([(QUEUE_LABEL.to_string(), "nowhere".to_string())].into());
    let mut plain = job("plain", 1, steps);
    plain.metadata.labels = None;
    for j in [&lost, &plain] {
        ok(jobs.create(&PostParams::default(), j).await, "create a job");
    }
    let s = e2e::wait_job(&jobs, "lost", Duration::from_secs(60), "the lost job to say why it waits", |s| {
        admitted(s).is_some_and(|c| c.message.contains("does not exist"))
    })
    .await;
    let said = admitted(&s).map(|c| (c.reason.clone(), c.message.clone())).unwrap_or_default();
    eprintln!("lost waits: {} {}", said.0, said.1);
    assert_eq!((s.phase, said.0.as_str()), (Some(Phase::Queued), "KueueQueued"), "{s:?}");
    let s = e2e::wait_job(&jobs, "plain", Duration::from_secs(60), "the plain job's own admission", |s| {
        admitted(s).is_some()
    })
    .await;
    assert_ne!(admitted(&s).map(|c| c.reason.as_str()), Some("KueueQueued"), "{s:?}");
    let names: Vec<String> =
        ok(workloads.list(&Default::default()).await, "Workloads").items.iter().map(|w| w.name_any()).collect();
    assert!(names.iter().all(|n| !n.starts_with("trainingjob-plain-")), "no Workload for the plain job: {names:?}");
    for name in ["lost", "plain"] {
        ok(jobs.delete(name, &DeleteParams::default()).await, "delete a job");
    }
    let s = e2e::wait_job(&jobs, "c", Duration::from_secs(900), "c to run on 2 of its 4 CS-2s", |s| {
        s.phase == Some(Phase::Running) && s.allocated_cs2 == Some(2)
    })
    .await;
    assert_eq!((s.phase, s.allocated_cs2), (Some(Phase::Running), Some(2)), "partial admission: {s:?}");
    let mut done = Vec::new();
    for (name, n) in [("a", 1_000), ("b", steps), ("c", steps)] {
        let s = e2e::wait_job(&jobs, name, Duration::from_secs(900), "the jobs to end", |_| false).await;
        assert_eq!((s.phase, s.progress.step), (Some(Phase::Succeeded), Some(n)), "{name}: {s:?}");
        done.push(s);
    }
    eprintln!("three jobs through a quota of 2 in {:.0?}", started.elapsed());
    for (s, want) in [(&done[0], want_a), (&done[1], want_2)] {
        let (loss, eval) = ok(want.await, "the undisturbed run on 2");
        assert_eq!((s.progress.loss, s.progress.eval_loss), (Some(loss), Some(eval)), "undisturbed, bit for bit");
    }
    let (loss_4, _) = ok(want_4.await, "the undisturbed run on 4");
    let got = done[2].progress.loss.unwrap_or(f64::NAN);
    eprintln!("c on 2 CS-2s: final loss {got} (on 4: {loss_4})");
    assert!((got - loss_4).abs() <= 1e-6, "the 4-CS-2 curve within 1e-6: {got} vs {loss_4}");
    // Every Workload is finished (the pass after the job's end says so), so its quota is free; a deleted job's
    // Workload goes with it (Kueue's finalizer let go).
    let finished = |w: &Workload| {
        w.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| c.type_ == "Finished" && c.status == "True")
    };
    let all_finished = e2e::wait_for(Duration::from_secs(30), "every Workload to be finished", || async {
        let list = workloads.list(&Default::default()).await.ok()?.items;
        (list.len() == 3 && list.iter().all(finished)).then_some(())
    })
    .await;
    ok(all_finished, "the Workloads finished");
    ok(jobs.delete("c", &DeleteParams::default()).await, "delete c");
    let gone = e2e::wait_for(Duration::from_secs(60), "c's Workload to go with c", || async {
        let list = workloads.list(&Default::default()).await.ok()?.items;
        (list.len() == 2).then_some(())
    })
    .await;
    ok(gone, "the deleted job's Workload removed");
    teardown(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_workload_priority_preempts_a_job_which_resumes_and_ends_as_undisturbed() {
    let (client, ns, jobs) = setup("kueue-preempt").await;
    queues(&client, &ns, 2).await;
    let class = format!("{ns}-high");
    let wpc = serde_json::json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": class},
        "value": 1000, "description": "e2e"
    });
    apply(&client, wpc).await;
    let steps = 1_500;
    let low = job("low", 2, steps);
    let want = cluster::undisturbed_beside(&low, &[]);
    ok(jobs.create(&PostParams::default(), &low).await, "create the low job");
    e2e::wait_job(&jobs, "low", Duration::from_secs(300), "the low job to train", |s| {
        s.phase == Some(Phase::Running) && s.progress.step.is_some_and(|n| n >= 100)
    })
    .await;
    let mut high = job("high", 2, 200);
    high.metadata.labels.get_or_insert_default().insert(PRIORITY_LABEL.into(), class.clone());
    ok(jobs.create(&PostParams::default(), &high).await, "create the high job");
    let asked = Instant::now();
    let s = e2e::wait_job(&jobs, "low", Duration::from_secs(180), "Kueue to evict the low job", |s| {
        admitted(s).is_some_and(|c| c.reason == "KueueEvicted") && s.allocated_cs2.is_none()
    })
    .await;
    let at = s.progress.last_checkpoint.as_ref().map(|c| c.step);
    eprintln!("low: evicted at checkpoint {at:?} of {steps}, {:.1?} after the high job came", asked.elapsed());
    assert!(at.is_some_and(|n| n >= 100 && n < steps), "evicted mid-run with a checkpoint: {s:?}");
    let h = e2e::wait_job(&jobs, "high", Duration::from_secs(600), "the high job to end", |_| false).await;
    assert_eq!((h.phase, h.progress.step), (Some(Phase::Succeeded), Some(200)), "{h:?}");
    cluster::ends_undisturbed(&jobs, "low", steps, want).await;
    teardown(&client, &ns).await;
    delete(&client, "WorkloadPriorityClass", &class).await;
}
