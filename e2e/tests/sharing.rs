//! Sharing the cluster between groups, on the real cluster: with the chart's `operator.preemption: allowed`, a
//! job of a higher PriorityClass that finds the pool taken preempts the running lower job, which checkpoints,
//! gives its CS-2s back, waits in the queue saying by whom, resumes from that checkpoint once the higher job is
//! done, and ends with exactly its steps and its undisturbed losses, bit for bit. (Who is preempted and when is
//! tested against an API server alone in `shared_cluster.rs`, and as a pure function in the operator.)
//!
//! Once the preempted job runs again, `helm upgrade` changes the operator's configuration mid-run: new operator
//! pods take over, and the job still ends as undisturbed.
//!
//! The same job is an upgrade of the API version too. It is created as `weightstream.dev/v1alpha1` while the CRD
//! stores `v1alpha1` (as a release before `v1beta1` left it); mid-run, beside the `helm upgrade`, this release's
//! CRD is applied (`v1beta1` stored) and `wsctl admin migrate-storage` rewrites the stored jobs and narrows the
//! CRD's stored versions to `v1beta1`. A `v1alpha1` manifest still applies afterwards and reads back as the same
//! job in `v1beta1`.
//!
//! For this file the chart offers 1 CS-2 per node, so one job of the pool's size (1 on the local node, 2 on
//! kind) fills it; the suite's values are put back at the end, also when the test fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crds::version::ApiVersion;
use crds::{Phase, TrainingJob};
use e2e::cluster;
use k8s_openapi::api::core::v1::{Event, Namespace, Node};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::{Client, CustomResourceExt, Resource, ResourceExt};
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

/// This release's CRD, but stored as `version` (every version served).
fn crd_storing(version: ApiVersion) -> CustomResourceDefinition {
    let mut crd = ok(crds::crd(), "the CRD");
    for v in &mut crd.spec.versions {
        v.storage = v.name == version.as_str();
    }
    crd
}

/// Applies `crd` (server-side, as `kubectl apply --server-side` would) and waits until the API server stores
/// TrainingJobs as it says.
async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    let stored = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone());
    ok(crds.patch(&name, &PatchParams::apply("e2e-sharing").force(), &Patch::Apply(crd)).await, "apply the CRD");
    let settled = e2e::wait_for(Duration::from_secs(60), "the CRD to be established", || async {
        let c = crds.get(&name).await.ok()?;
        let established =
            c.status.as_ref()?.conditions.iter().flatten().any(|c| c.type_ == "Established" && c.status == "True");
        let storing = c.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone());
        (established && storing == stored).then_some(())
    })
    .await;
    ok(settled, "the CRD");
}

/// The API of TrainingJobs in `version`, undecoded.
fn jobs_in(client: &Client, ns: &str, version: ApiVersion) -> Api<DynamicObject> {
    let mut ar = ApiResource::erase::<TrainingJob>(&());
    ar.version = version.as_str().into();
    ar.api_version = version.api_version();
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// `job` as its user wrote it for `version`.
fn manifest_in(job: &TrainingJob, version: ApiVersion) -> DynamicObject {
    let mut value = ok(serde_json::to_value(job), "the job as JSON");
    value["apiVersion"] = version.api_version().into();
    ok(serde_json::from_value(value), "the job as an object")
}

/// The CRD's stored versions.
async fn stored_versions(client: &Client) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ok(crds.get(TrainingJob::crd_name()).await, "the CRD");
    crd.status.and_then(|s| s.stored_versions).unwrap_or_default()
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
    // The low job as a user of the previous API version submits it, stored as v1alpha1.
    apply_crd(&client, &crd_storing(ApiVersion::V1alpha1)).await;
    let old_api = jobs_in(&client, &ns, ApiVersion::V1alpha1);
    ok(old_api.create(&PostParams::default(), &manifest_in(&low, ApiVersion::V1alpha1)).await, "create the low job");
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
    // The upgrade as the chart's notes give it: the CRD first (v1beta1 stored), then the chart, then the storage
    // migration.
    apply_crd(&client, &crd_storing(ApiVersion::STORED)).await;
    ok(cluster::install_chart_with(&kc, &upgraded), "helm upgrade mid-run");
    let wsctl = ok(cluster::wsctl(), "wsctl");
    let migrated = ok(
        tokio::process::Command::new(&wsctl).args(["admin", "migrate-storage"]).env("KUBECONFIG", &kc).output().await,
        "wsctl admin migrate-storage",
    );
    let said = String::from_utf8_lossy(&migrated.stdout).to_string() + &String::from_utf8_lossy(&migrated.stderr);
    eprintln!("wsctl admin migrate-storage: {}", said.trim());
    assert!(migrated.status.success() && said.contains("rewrote"), "wsctl admin migrate-storage: {said}");
    assert_eq!(stored_versions(&client).await, [ApiVersion::STORED.as_str()], "{said}");
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

    // A v1alpha1 manifest still applies, and reads back in v1beta1 as the same job applied as v1beta1 does.
    let mut old = job("old", pool, 10);
    old.spec.suspend = true;
    let mut new = old.clone();
    new.metadata.name = Some("new".into());
    ok(old_api.create(&PostParams::default(), &manifest_in(&old, ApiVersion::V1alpha1)).await, "a v1alpha1 job");
    ok(jobs.create(&PostParams::default(), &new).await, "a v1beta1 job");
    let (old, new) = (ok(jobs.get("old").await, "the v1alpha1 job"), ok(jobs.get("new").await, "the v1beta1 job"));
    assert_eq!(old.spec, new.spec, "a v1alpha1 manifest is the same job");
    assert_eq!(TrainingJob::api_version(&()), ApiVersion::STORED.api_version().as_str());
    for name in ["old", "new"] {
        let _ = jobs.delete(name, &DeleteParams::default()).await;
    }
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client).delete(&ns, &DeleteParams::default()).await;
}
