//! An operator no tenant can stall, against a real API server: a TrainingJob the Rust type cannot decode
//! (stored while the schema was looser) is reported on itself and the other jobs are still admitted; a job
//! naming a missing PriorityClass waits with `PriorityClassNotFound` and is admitted, its pods carrying the
//! class, once an admin creates it; a MemoryX pod refused by the API server (as the StatefulSet controller
//! reports it: a `FailedCreate` event, played here by the test as the kubelet is elsewhere) shows in `Ready`;
//! with preemption allowed, a job of a higher class takes a lower one's CS-2s through its checkpoint.
//!
//! The schema is loosened and restored cluster-wide, so this file runs its own API server instance
//! (`shared-cluster`, ports shifted by 7) and disturbs no other test. With `KUBECONFIG` set it uses that
//! cluster instead.

use std::time::Duration;

use crds::{Phase, TrainingJob};
use e2e::{RunningOperator, install_crd, job, namespace, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};

const INSTANCE: &str = "shared-cluster";
const WAIT: Duration = Duration::from_secs(60);

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

async fn setup(prefix: &str) -> (Client, String) {
    let client = if std::env::var_os("KUBECONFIG").is_some() {
        ok(e2e::client().await, "client")
    } else {
        let path = ok(tokio::task::spawn_blocking(|| e2e::up(INSTANCE, 7)).await, "up.sh task");
        let path = ok(path, "no API server for the shared-cluster tests");
        ok(e2e::client_for(&path).await, "client")
    };
    ok(install_crd(&client).await, "install the CRD");
    let ns = ok(namespace(&client, prefix).await, "namespace");
    (client, ns)
}

async fn wait_phase(api: &Api<TrainingJob>, name: &str, phase: Phase) -> TrainingJob {
    let what = format!("{name} to reach {phase}");
    let r = wait_for(WAIT, &what, || async {
        let j = api.get(name).await.ok()?;
        (j.status.as_ref()?.phase == Some(phase)).then_some(j)
    })
    .await;
    match r {
        Ok(j) => j,
        Err(e) => panic!("{e}; status now: {:#?}", api.get(name).await.ok().and_then(|j| j.status)),
    }
}

/// Waits for a Warning Event with `reason` about the object named `name`.
async fn warning(client: &Client, ns: &str, name: &str, reason: &str) -> Event {
    event(client, ns, name, reason, "Warning").await
}

/// The first Event of `type_` (`Normal`, `Warning`) with `reason` about job `name`, waited for.
async fn event(client: &Client, ns: &str, name: &str, reason: &str, type_: &str) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let what = format!("a {type_} {reason} event about {name}");
    ok(
        wait_for(WAIT, &what, || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some(type_)
                    && e.involved_object.name.as_deref() == Some(name)
            })
        })
        .await,
        "event",
    )
}

fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == "Ready")
}

/// The acceptance of issue 14: "an operator facing one broken object keeps reconciling the others". The
/// schema is loosened (batchSize loses its maximum, as before issue 14), a job with a batch size of 2^32 is
/// stored, the schema is restored; the typed list that the operator used to watch now fails as a whole, yet
/// a good job created afterwards is admitted, and the broken one says `InvalidSpec` on itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_undecodable_job_does_not_stop_the_others() {
    let (client, ns) = setup("undecodable").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ok(crds::crd(), "the CRD");
    let mut loose = ok(serde_json::to_value(&crd), "CRD as JSON");
    // Every served version's schema (they are one schema, converted by apiVersion alone).
    for version in loose["spec"]["versions"].as_array_mut().expect("the CRD's versions") {
        let batch = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["training"]["properties"]
            ["batchSize"];
        let batch = batch.as_object_mut().expect("the schema of spec.training.batchSize");
        assert!(batch.remove("maximum").is_some(), "batchSize has a maximum to loosen");
        batch.remove("format");
    }
    let manager = PatchParams::apply("weightstream-e2e").force();

    let ar = ApiResource::erase::<TrainingJob>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let mut broken = ok(serde_json::to_value(job("broken", 2)), "job as JSON");
    broken["spec"]["training"]["batchSize"] = serde_json::json!(4_294_967_296_u64);
    let broken: DynamicObject = ok(serde_json::from_value(broken), "dynamic object");
    // The API server takes the looser schema up within moments. The other tests of this file install the CRD
    // as they start, which may put the strict schema back meanwhile: loosen it again on each try.
    ok(
        wait_for(WAIT, "the server to store batchSize 2^32", || async {
            crds.patch(&crd.name_any(), &manager, &Patch::Apply(&loose)).await.ok()?;
            raw.create(&PostParams::default(), &broken).await.ok().map(|_| ())
        })
        .await,
        "store the broken job",
    );
    ok(install_crd(&client).await, "restore the CRD");
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    assert!(jobs.list(&ListParams::default()).await.is_err(), "a typed list of the namespace fails on the broken job");

    let op = RunningOperator::start(&client, &ns, 4);
    ok(jobs.create(&PostParams::default(), &job("good", 2)).await, "create the good job");
    let good = wait_phase(&jobs, "good", Phase::Starting).await;
    assert_eq!(good.status.and_then(|s| s.allocated_cs2), Some(2), "the good job is admitted");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    ok(
        wait_for(WAIT, "the good job's engines", || async {
            let sel = ListParams::default().labels("weightstream.dev/job=good,weightstream.dev/role=engine");
            (pods.list(&sel).await.ok()?.items.len() == 2).then_some(())
        })
        .await,
        "engines",
    );

    // The broken job says why on itself, and in a Warning Event; it holds nothing and gets no children.
    let c = wait_for(WAIT, "Ready=False InvalidSpec on the broken job", || async {
        let o = raw.get("broken").await.ok()?;
        let conditions: Vec<Condition> = serde_json::from_value(o.data["status"]["conditions"].clone()).ok()?;
        ready(&conditions).filter(|c| c.reason == "InvalidSpec").cloned()
    })
    .await;
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}; stored now: {:#?}", raw.get("broken").await.ok().map(|o| o.data)),
    };
    assert_eq!(c.status, "False");
    assert!(c.message.contains("spec.training.batchSize") && c.message.contains("4294967296"), "{}", c.message);
    let e = warning(&client, &ns, "broken", "InvalidSpec").await;
    assert!(e.message.unwrap_or_default().contains("spec.training.batchSize"));
    let sel = ListParams::default().labels("weightstream.dev/job=broken");
    assert!(ok(pods.list(&sel).await, "pods").items.is_empty(), "nothing is assembled from an unreadable spec");

    // Deleting it is not held up by the operator.
    ok(raw.delete("broken", &DeleteParams::default()).await, "delete the broken job");
    ok(
        wait_for(WAIT, "the broken job to be gone", || async {
            raw.get_opt("broken").await.ok()?.is_none().then_some(())
        })
        .await,
        "gone",
    );
    assert!(jobs.list(&ListParams::default()).await.is_ok(), "the namespace lists again");
    op.stop().await;
}

/// Admission priority comes from a PriorityClass, which only cluster admins create: a job naming one that does
/// not exist waits (`PriorityClassNotFound`, a Warning Event) and blocks no one; once the class exists the job
/// is admitted and its pods carry the class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_for_its_priority_class_and_its_pods_carry_it() {
    let (client, ns) = setup("prioclass").await;
    let class_name = format!("ws-e2e-{ns}");
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut classy = job("classy", 2);
    classy.spec.priority_class_name = Some(class_name.clone());
    ok(jobs.create(&PostParams::default(), &classy).await, "create the job naming a missing class");
    ok(jobs.create(&PostParams::default(), &job("plain", 2)).await, "create a plain job");
    let queued = wait_phase(&jobs, "classy", Phase::Queued).await;
    let admitted = queued.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Admitted")).cloned();
    let admitted = admitted.expect("an Admitted condition");
    assert_eq!(admitted.reason, "PriorityClassNotFound");
    assert!(admitted.message.contains(&class_name), "{}", admitted.message);
    warning(&client, &ns, "classy", "PriorityClassNotFound").await;
    wait_phase(&jobs, "plain", Phase::Starting).await;

    let classes: Api<PriorityClass> = Api::all(client.clone());
    let class = PriorityClass {
        metadata: ObjectMeta { name: Some(class_name.clone()), ..Default::default() },
        value: 1000,
        description: Some("weightstream e2e".into()),
        ..Default::default()
    };
    ok(classes.create(&PostParams::default(), &class).await, "create the PriorityClass");
    wait_phase(&jobs, "classy", Phase::Starting).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sel = ListParams::default().labels("weightstream.dev/job=classy");
    let with_class = ok(
        wait_for(WAIT, "the classy job's pods", || async {
            let list = pods.list(&sel).await.ok()?.items;
            (list.len() >= 3).then_some(list)
        })
        .await,
        "pods",
    );
    for p in &with_class {
        let spec = p.spec.clone().unwrap_or_default();
        assert_eq!(spec.priority_class_name.as_deref(), Some(class_name.as_str()), "{}", p.name_any());
        assert_eq!(spec.priority, Some(1000), "the API server resolved the class for {}", p.name_any());
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let memoryx = ok(sts.get("classy-memoryx").await, "MemoryX's StatefulSet");
    let template = memoryx.spec.and_then(|s| s.template.spec).unwrap_or_default();
    assert_eq!(template.priority_class_name.as_deref(), Some(class_name.as_str()));
    op.stop().await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
}

/// A job labelled for a Kueue queue on a cluster without Kueue waits and says why, holding nothing; an unlabelled
/// job beside it is admitted by the operator's own queue as always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kueue_a_job_labelled_for_it_waits_saying_so() {
    let (client, ns) = setup("nokueue").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut labelled = job("queued", 2);
    labelled.metadata.labels = Some([(operator::kueue::workload::QUEUE_LABEL.to_string(), "team".to_string())].into());
    ok(jobs.create(&PostParams::default(), &labelled).await, "create the labelled job");
    ok(jobs.create(&PostParams::default(), &job("plain", 2)).await, "create a plain job");
    let queued = wait_phase(&jobs, "queued", Phase::Queued).await;
    let status = queued.status.unwrap_or_default();
    let admitted = status.conditions.iter().find(|c| c.type_ == "Admitted").cloned().expect("an Admitted condition");
    assert_eq!(admitted.reason, "KueueQueued");
    assert!(admitted.message.contains("does not serve Kueue's Workloads"), "{}", admitted.message);
    assert_eq!(status.allocated_cs2, None);
    // The plain job is the operator's: it is admitted although the labelled one came first.
    wait_phase(&jobs, "plain", Phase::Starting).await;
    op.stop().await;
}

/// MemoryX's pod is created by the StatefulSet controller, so when the API server refuses it the refusal is
/// only on the StatefulSet, as a `FailedCreate` Warning Event. The test plays that controller (there is none
/// on this API server) and the job's `Ready` says `PodsForbidden` with the server's words within a pass, with a
/// Warning Event on the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_memoryx_pod_shows_in_the_jobs_ready_condition() {
    let (client, ns) = setup("memoryx-refused").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    ok(jobs.create(&PostParams::default(), &job("mx", 2)).await, "create the job");
    wait_phase(&jobs, "mx", Phase::Starting).await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let memoryx =
        ok(wait_for(WAIT, "MemoryX's StatefulSet", || async { sts.get("mx-memoryx").await.ok() }).await, "StatefulSet");
    let words = "pods \"mx-memoryx-0\" is forbidden: violates PodSecurity \"restricted:latest\": seccompProfile";
    let event = Event {
        metadata: ObjectMeta { name: Some("mx-memoryx.failed".into()), ..Default::default() },
        involved_object: ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("StatefulSet".into()),
            name: Some("mx-memoryx".into()),
            namespace: Some(ns.clone()),
            uid: memoryx.uid(),
            ..Default::default()
        },
        reason: Some("FailedCreate".into()),
        message: Some(format!("create Pod mx-memoryx-0 in StatefulSet mx-memoryx failed error: {words}")),
        type_: Some("Warning".into()),
        last_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        first_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        count: Some(1),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("statefulset-controller".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    ok(events.create(&PostParams::default(), &event).await, "play the StatefulSet controller's event");
    let c = wait_for(WAIT, "Ready=False PodsForbidden", || async {
        let j = jobs.get("mx").await.ok()?;
        ready(&j.status?.conditions).filter(|c| c.reason == "PodsForbidden").cloned()
    })
    .await;
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}; status now: {:#?}", jobs.get("mx").await.ok().and_then(|j| j.status)),
    };
    assert!(c.message.contains(words) && c.message.contains("MemoryX"), "{}", c.message);
    let e = warning(&client, &ns, "mx", "PodsForbidden").await;
    assert!(e.message.unwrap_or_default().contains("violates PodSecurity"));
    // Once the pod exists (the cause was fixed), the refusal is no longer reported.
    let pod: Pod = ok(
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "mx-memoryx-0", "labels": { "weightstream.dev/job": "mx", "weightstream.dev/role": "memoryx" } },
            "spec": { "containers": [ { "name": "memoryx", "image": "i", "securityContext": {
                "allowPrivilegeEscalation": false, "runAsNonRoot": true, "runAsUser": 65532,
                "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" } } } ] }
        })),
        "pod",
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    ok(pods.create(&PostParams::default(), &pod).await, "play the StatefulSet controller creating the pod");
    ok(
        wait_for(WAIT, "Ready to leave PodsForbidden", || async {
            let j = jobs.get("mx").await.ok()?;
            ready(&j.status?.conditions).filter(|c| c.reason != "PodsForbidden").map(|_| ())
        })
        .await,
        "recovered",
    );
    op.stop().await;
}

/// Preemption in the operator's own queue (`--preemption allowed`): a job of a higher PriorityClass that does not
/// fit takes the CS-2s of a running lower one, which checkpoints first (MemoryX is asked once), gives them back,
/// waits saying by whom, and resumes from that checkpoint once the higher job is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_class_preempts_a_lower_job_which_checkpoints_waits_and_resumes() {
    let (client, ns) = setup("preempt").await;
    let config = operator::config::Config {
        namespace: Some(ns.clone()),
        pool: Some(4),
        fan_out: 2,
        poll: Duration::from_millis(300),
        preemption: operator::config::Preemption::Allowed,
        ..Default::default()
    };
    let op = RunningOperator::start_with(&client, config);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let class_name = format!("ws-e2e-{ns}-high");
    let class = PriorityClass {
        metadata: ObjectMeta { name: Some(class_name.clone()), ..Default::default() },
        value: 1000,
        ..Default::default()
    };
    ok(classes.create(&PostParams::default(), &class).await, "create the PriorityClass");
    ok(jobs.create(&PostParams::default(), &job("low", 4)).await, "create the low job");
    wait_phase(&jobs, "low", Phase::Starting).await;
    let mut at = crds::contract::MemoryxStatus::at(crds::contract::MemoryxPhase::Running, 20);
    at.progress.total_steps = Some(100);
    op.coordinator.set(&format!("{ns}/low"), at);
    // A job of the same class waits behind it; the higher one does not.
    ok(jobs.create(&PostParams::default(), &job("peer", 4)).await, "create a job of the same class");
    let mut high = job("high", 4);
    high.spec.priority_class_name = Some(class_name.clone());
    ok(jobs.create(&PostParams::default(), &high).await, "create the high job");

    let low = wait_phase(&jobs, "low", Phase::Queued).await.status.unwrap_or_default();
    let admitted = low.conditions.iter().find(|c| c.type_ == "Admitted").cloned().expect("an Admitted condition");
    // Until it is admitted again, it says by whom it was preempted (the Warning Event below too).
    assert_eq!(admitted.reason, "Preempted", "{admitted:?}");
    assert!(admitted.message.contains(&format!("preempted by {ns}/high")), "{admitted:?}");
    assert_eq!((low.allocated_cs2, low.progress.last_checkpoint.map(|c| c.step)), (None, Some(20)));
    assert_eq!(op.coordinator.checkpoint_requests(), vec![format!("{ns}/low")], "one checkpoint first");
    let e = warning(&client, &ns, "low", "Preempted").await;
    let said = e.message.unwrap_or_default();
    assert!(said.contains(&format!("preempted by {ns}/high (PriorityClass '{class_name}')")), "{said}");
    let high = wait_phase(&jobs, "high", Phase::Starting).await;
    assert_eq!(high.status.and_then(|s| s.allocated_cs2), Some(4));

    // The higher job ends; the preempted one goes before the later job of its class, and resumes.
    let mut done = crds::contract::MemoryxStatus::at(crds::contract::MemoryxPhase::Succeeded, 10);
    done.progress.total_steps = Some(10);
    op.coordinator.set(&format!("{ns}/high"), done);
    wait_phase(&jobs, "high", Phase::Succeeded).await;
    let low = wait_phase(&jobs, "low", Phase::Starting).await.status.unwrap_or_default();
    assert_eq!(low.allocated_cs2, Some(4));
    // The pass that admitted it again says `Resumed` (a later pass may already say more): its Event holds it.
    event(&client, &ns, "low", "Resumed", "Normal").await;
    let peer = jobs.get("peer").await.ok().and_then(|j| j.status).unwrap_or_default();
    assert_eq!(
        (peer.phase, peer.allocated_cs2),
        (Some(Phase::Queued), None),
        "a job of the same class preempts no one"
    );
    op.stop().await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
}
