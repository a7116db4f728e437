//! Sharing the cluster between groups, on the real cluster: with the chart's `operator.preemption: allowed`, a
//! job of a higher PriorityClass that finds the pool taken preempts the running lower job, which checkpoints,
//! gives its CS-2s back, waits in the queue saying by whom, resumes from that checkpoint once the higher job is
//! done, and ends with exactly its steps and its undisturbed losses, bit for bit. (Who is preempted and when is
//! tested against an API server alone in `shared_cluster.rs`, and as a pure function in the operator.)
//!
//! Once the preempted job runs again, `helm upgrade` changes the operator's configuration mid-run: new operator
//! pods take over, and the job still ends as undisturbed.
//!
//! For this file the chart offers 1 CS-2 per node, so one job of the pool's size (1 on the local node, 2 on
//! kind) fills it; the suite's values are put back at the end, also when the test fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crds::{Phase, TrainingJob};
use e2e::cluster;
use k8s_openapi::api::core::v1::{Event, Namespace, Node};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use operator::children::pods::engine::CS2_RESOURCE;

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The chart values of this file besides the suite's.
const VALUES: [&str; 2] = ["operator.preemption=allowed", "devicePlugin.devicesPerNode=1"];

/// Puts the suite's chart values back when dropped.
struct Restore(PathBuf);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Err(e) = cluster::install_chart(&self.0) {
            eprintln!("putting the chart's values back failed: {e}");
        }
    }
}

/// The pool once every real node offers 1 CS-2 (kwok's fake nodes, should the scale test have left any, aside).
async fn pool_of_ones(client: &Client) -> u32 {
    let nodes: Api<Node> = Api::all(client.clone());
    let pool = e2e::wait_for(Duration::from_secs(120), "every node to offer 1 CS-2", || async {
        let list = nodes.list(&ListParams::default()).await.ok()?;
        let offered: Vec<String> = list
            .items
            .iter()
            .filter(|n| n.annotations().get("kwok.x-k8s.io/node").is_none_or(|v| v != "fake"))
            .filter_map(|n| Some(n.status.as_ref()?.allocatable.as_ref()?.get(CS2_RESOURCE)?.0.clone()))
            .collect();
        (!offered.is_empty() && offered.iter().all(|q| q == "1")).then_some(offered.len() as u32)
    })
    .await;
    ok(pool, "the device plugin at 1 CS-2 per node")
}

/// The operator's running pods, by name.
async fn operator_pods(client: &Client) -> Vec<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), cluster::SYSTEM_NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/component=operator");
    let listed = ok(pods.list(&selector).await, "the operator's pods").items;
    listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| p.name_any()).collect()
}

/// `fc-mnist-sparse` on `cs2` CS-2s for `steps` steps, a checkpoint every 100, its claims deleted with it.
fn job(name: &str, cs2: u32, steps: u64) -> TrainingJob {
    let mut j = ok(cluster::example("fc-mnist-sparse.yaml"), "the example");
    j.metadata.name = Some(name.into());
    j.spec.cs2 = cs2;
    (j.spec.training.epochs, j.spec.training.steps) = (None, Some(steps));
    j.spec.checkpoint.interval_steps = 100;
    j.spec.checkpoint.retain = crds::RetainPolicy::Delete;
    j
}

fn admitted_reason(s: &crds::TrainingJobStatus) -> Option<&str> {
    s.conditions.iter().find(|c| c.type_ == "Admitted").map(|c| c.reason.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_class_preempts_a_running_job_which_resumes_and_ends_as_undisturbed() {
    let kc = ok(cluster::kubeconfig(), "no cluster");
    let _restore = Restore(kc.clone());
    ok(cluster::install_chart_with(&kc, &VALUES), "the chart with preemption allowed");
    let client = ok(e2e::client_for(&kc).await, "a client");
    let pool = pool_of_ones(&client).await;
    let ns = ok(e2e::namespace(&client, "preempt").await, "a namespace");
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let class_name = format!("{ns}-high");
    let class = PriorityClass {
        metadata: ObjectMeta { name: Some(class_name.clone()), ..Default::default() },
        value: 1000,
        ..Default::default()
    };
    ok(classes.create(&PostParams::default(), &class).await, "create the PriorityClass");

    let steps = 1_500;
    let low = job("low", pool, steps);
    let want = cluster::undisturbed_beside(&low, &[]);
    ok(jobs.create(&PostParams::default(), &low).await, "create the low job");
    let s = e2e::wait_job(&jobs, "low", Duration::from_secs(300), "the low job to train", |s| {
        s.phase == Some(Phase::Running) && s.progress.step.is_some_and(|n| n >= 100)
    })
    .await;
    assert_eq!(s.phase, Some(Phase::Running), "{s:?}");
    let mut high = job("high", pool, 200);
    high.spec.priority_class_name = Some(class_name.clone());
    ok(jobs.create(&PostParams::default(), &high).await, "create the high job");
    let asked = Instant::now();
    let s = e2e::wait_job(&jobs, "low", Duration::from_secs(180), "the low job to be preempted", |s| {
        admitted_reason(s) == Some("Preempted") && s.allocated_cs2.is_none()
    })
    .await;
    let at = s.progress.last_checkpoint.as_ref().map(|c| c.step);
    eprintln!("low: preempted at checkpoint {at:?} of {steps}, {:.1?} after the high job came", asked.elapsed());
    assert!(at.is_some_and(|n| n >= 100 && n < steps), "preempted mid-run with a checkpoint: {s:?}");
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let said: Vec<String> = ok(events.list(&ListParams::default()).await, "events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Preempted") && e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.message)
        .collect();
    assert!(said.iter().any(|m| m.contains(&format!("preempted by {ns}/high"))), "{said:?}");

    let h = e2e::wait_job(&jobs, "high", Duration::from_secs(600), "the high job to end", |_| false).await;
    assert_eq!((h.phase, h.progress.step), (Some(Phase::Succeeded), Some(200)), "{h:?}");
    // A `helm upgrade` while the resumed job runs: new operator pods (another configuration) take over mid-run.
    let resumed = e2e::wait_job(&jobs, "low", Duration::from_secs(300), "the low job to run again", |s| {
        s.phase == Some(Phase::Running) && s.progress.step.is_some_and(|n| n > at.unwrap_or(0))
    })
    .await;
    let before = operator_pods(&client).await;
    let upgraded = [&VALUES[..], &["operator.pollSeconds=2", "operator.podAnnotations.e2e/upgraded=yes"]].concat();
    let started = Instant::now();
    ok(cluster::install_chart_with(&kc, &upgraded), "helm upgrade mid-run");
    let after = operator_pods(&client).await;
    let s = ok(jobs.get("low").await, "the low job").status.unwrap_or_default();
    eprintln!(
        "helm upgrade mid-run: {:.0?}, operator pods {before:?} -> {after:?}, low at step {:?} -> {:?} ({:?})",
        started.elapsed(),
        resumed.progress.step,
        s.progress.step,
        s.phase
    );
    assert!(after.iter().all(|p| !before.contains(p)), "new operator pods: {before:?} -> {after:?}");
    cluster::ends_undisturbed(&jobs, "low", steps, want).await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client).delete(&ns, &DeleteParams::default()).await;
}
