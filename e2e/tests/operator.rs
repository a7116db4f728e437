//! Issue 5's acceptance, against a real API server: the CRD installs and rejects each invalid rule with its
//! message; a job gets every child with owner references and the right plan; phases follow the children and
//! MemoryX; admission is all-or-nothing and in order; suspend, resume, rescale, failures and deletion; a
//! second pass changes nothing; conflicting writers do not break it.
//!
//! There is no kubelet: the tests play it by setting pod status, and stand in for MemoryX with the operator's
//! `ScriptedCoordinator`. Without `KUBECONFIG` they start the local API server with `e2e/apiserver/up.sh`
//! (building it the first time); if that fails, they fail with the script's reason.

use std::collections::BTreeMap;
use std::time::Duration;

use crds::CheckpointRef;
use crds::contract::{MemoryxPhase, MemoryxStatus};
use crds::{Phase, TrainingJob};
use e2e::{RunningOperator, install_crd, job, namespace, set_pod_phase, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};

const WAIT: Duration = Duration::from_secs(30);

async fn setup(prefix: &str) -> (Client, String) {
    let client = match e2e::client().await {
        Ok(c) => c,
        Err(e) => panic!("no API server for the integration tests: {e}"),
    };
    if let Err(e) = install_crd(&client).await {
        panic!("cannot install the TrainingJob CRD: {e}");
    }
    let ns = match namespace(&client, prefix).await {
        Ok(ns) => ns,
        Err(e) => panic!("cannot create a namespace: {e}"),
    };
    (client, ns)
}

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

async fn create(api: &Api<TrainingJob>, j: &TrainingJob) -> TrainingJob {
    ok(api.create(&PostParams::default(), j).await, "create job")
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
        Err(e) => {
            let now = api.get(name).await.ok().and_then(|j| j.status);
            panic!("{e}; status now: {now:#?}")
        }
    }
}

fn running(step: u64, checkpoint: Option<u64>) -> MemoryxStatus {
    let mut s = MemoryxStatus::at(MemoryxPhase::Running, step);
    s.progress = crds::Progress {
        total_steps: Some(100),
        loss: Some(0.75),
        samples_per_second: Some(1234.5),
        simulated_step_seconds: Some(0.002),
        last_checkpoint: checkpoint.map(|s| CheckpointRef { step: s, path: format!("ckpt-{s:08}") }),
        ..s.progress
    };
    s
}

async fn pods_of(pods: &Api<Pod>, job: &str, role: &str) -> Vec<Pod> {
    let sel = format!("weightstream.dev/job={job},weightstream.dev/role={role}");
    let mut v = ok(pods.list(&ListParams::default().labels(&sel)).await, "list pods").items;
    v.retain(|p| p.metadata.deletion_timestamp.is_none());
    v.sort_by_key(|p| p.name_any());
    v
}

/// Plays the kubelet for every engine, SwarmX and input pod of `job`: waits until `engines` engines and as many
/// input workers (the test jobs' one per CS-2) exist, then marks all of them and the SwarmX pods Running and Ready.
async fn start_pods(pods: &Api<Pod>, job: &str, engines: usize) {
    // The operator creates the SwarmX nodes, then the engines, then the input workers (one per engine), one by
    // one: waiting for the engines alone left input workers that were not created yet Pending, and the job short
    // of Running.
    let what = format!("{engines} engine pods and {engines} input workers of {job}");
    ok(
        wait_for(WAIT, &what, || async {
            let all = pods_of(pods, job, "engine").await.len() == engines
                && pods_of(pods, job, "input").await.len() == engines;
            all.then_some(())
        })
        .await,
        "engines and input workers",
    );
    for role in ["engine", "swarmx", "input"] {
        for p in pods_of(pods, job, role).await {
            ok(set_pod_phase(pods, &p.name_any(), "Running").await, "mark pod running");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_rejects_each_invalid_spec_with_its_message() {
    let (client, ns) = setup("invalid").await;
    let ar = ApiResource::erase::<TrainingJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let base = ok(serde_json::to_value(job("base", 2)), "job as JSON");
    let reject = |name: &str, edit: &dyn Fn(&mut serde_json::Value), want: &str| {
        let mut v = base.clone();
        v["metadata"]["name"] = name.into();
        edit(&mut v);
        let api = api.clone();
        let want = want.to_string();
        let name = name.to_string();
        async move {
            let obj: DynamicObject = ok(serde_json::from_value(v), "dynamic object");
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => panic!("{name}: the server accepted an invalid spec (wanted: {want})"),
                Err(kube::Error::Api(e)) => {
                    assert_eq!(e.code, 422, "{name}: {e:?}");
                    assert!(e.message.contains(&want), "{name}: message {:?} lacks {want:?}", e.message);
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
    };
    reject("batch", &|v| v["spec"]["training"]["batchSize"] = 63.into(), "must be divisible by spec.cs2").await;
    reject("both", &|v| v["spec"]["training"]["epochs"] = 1.into(), "either steps or epochs, not both").await;
    reject(
        "neither",
        &|v| {
            v["spec"]["training"].as_object_mut().map(|t| t.remove("steps"));
        },
        "either steps or epochs, not both",
    )
    .await;
    reject("pixels", &|v| v["spec"]["model"]["layers"] = serde_json::json!([700, 32, 10]), "must start with 784").await;
    reject("short", &|v| v["spec"]["model"]["layers"] = serde_json::json!([784]), "at least an input and an output")
        .await;
    reject("width", &|v| v["spec"]["model"]["layers"] = serde_json::json!([784, 0, 10]), "greater than or equal to 1")
        .await;
    reject(
        "lr",
        &|v| v["spec"]["training"]["optimizer"]["learningRate"] = 0.0.into(),
        "learningRate must be a positive",
    )
    .await;
    reject("momentum", &|v| v["spec"]["training"]["optimizer"]["momentum"] = 1.0.into(), "must lie in [0, 1)").await;
    reject("eps", &|v| v["spec"]["training"]["optimizer"]["epsilon"] = 0.0.into(), "epsilon must be a positive").await;
    reject(
        "floor",
        &|v| v["spec"]["training"]["schedule"] = serde_json::json!({"minLearningRate": 0.5}),
        "minLearningRate must lie between 0 and the learning rate",
    )
    .await;
    reject("zero", &|v| v["spec"]["cs2"] = 0.into(), "greater than or equal to 1").await;
    reject("many", &|v| v["spec"]["cs2"] = 193.into(), "less than or equal to 192").await;
    reject("sparse", &|v| v["spec"]["model"]["sparsity"] = 1.5.into(), "less than or equal to 0.99").await;
    reject("kind", &|v| v["spec"]["model"]["kind"] = "cnn".into(), "Unsupported value: \"cnn\"").await;
    reject("keep", &|v| v["spec"]["checkpoint"]["keep"] = 0.into(), "greater than or equal to 1").await;
    reject("restarts", &|v| v["spec"]["restartLimit"] = 101.into(), "less than or equal to 100").await;
    reject("mode", &|v| v["spec"]["executionMode"] = "magic".into(), "Unsupported value: \"magic\"").await;
    reject("a-name-that-is-much-too-long-for-the-pod-names", &|_| {}, "at most 40 characters").await;
    let llama = |v: &mut serde_json::Value| {
        v["spec"]["model"] = serde_json::json!({"kind": "llama", "width": 64, "heads": 4, "kvHeads": 3, "blocks": 2, "contextLength": 32, "intermediateSize": 96});
        v["spec"]["data"] = serde_json::json!({"kind": "text", "path": "moby-dick.txt.gz"});
    };
    reject("gqa", &llama, "heads by kvHeads").await;
    reject(
        "pretrained",
        &|v| {
            llama(v);
            v["spec"]["model"]["kvHeads"] = 2.into();
            v["spec"]["model"]["from"] = "models/smollm2-135m".into();
        },
        "reads its pretrained folder from its data volume",
    )
    .await;
    reject(
        "pretrained-escape",
        &|v| {
            llama(v);
            v["spec"]["model"]["kvHeads"] = 2.into();
            v["spec"]["data"]["volume"] = "corpus".into();
            v["spec"]["model"]["from"] = "../models/smollm2-135m".into();
        },
        "no leading '/', no '..'",
    )
    .await;

    // The model cannot change under a job's checkpoints.
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create(&jobs, &job("fixed", 2)).await;
    let patch = serde_json::json!({ "spec": { "model": { "layers": [784, 128, 10] } } });
    match jobs.patch("fixed", &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => panic!("the server let spec.model change"),
        Err(kube::Error::Api(e)) => assert!(e.message.contains("spec.model is immutable"), "{}", e.message),
        Err(e) => panic!("{e}"),
    }
    // The CS-2 count may change (that is a rescale).
    let patch = serde_json::json!({ "spec": { "cs2": 4 } });
    ok(jobs.patch("fixed", &PatchParams::default(), &Patch::Merge(&patch)).await, "cs2 may change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_assembled_runs_survives_a_failed_engine_completes_and_is_cleaned_up() {
    let (client, ns) = setup("life").await;
    let op = RunningOperator::start(&client, &ns, 8);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let created = create(&jobs, &job("fc", 4)).await;
    let uid = created.uid().unwrap_or_default();

    let j = wait_phase(&jobs, "fc", Phase::Starting).await;
    let status = j.status.clone().unwrap_or_default();
    assert_eq!(status.allocated_cs2, Some(4));
    assert!(j.finalizers().iter().any(|f| f == operator::FINALIZER));

    // Every child, owned by the job.
    start_pods(&pods, "fc", 4).await;
    let engines: Vec<String> = pods_of(&pods, "fc", "engine").await.iter().map(|p| p.name_any()).collect();
    assert_eq!(engines, ["fc-engine-0", "fc-engine-1", "fc-engine-2", "fc-engine-3"]);
    let swarmx: Vec<String> = pods_of(&pods, "fc", "swarmx").await.iter().map(|p| p.name_any()).collect();
    assert_eq!(swarmx, ["fc-swarmx-0-0", "fc-swarmx-1-0", "fc-swarmx-1-1"]);
    let cm = ok(Api::<ConfigMap>::namespaced(client.clone(), &ns).get("fc-config").await, "config map");
    let sts = ok(Api::<StatefulSet>::namespaced(client.clone(), &ns).get("fc-memoryx").await, "memoryx");
    let svcs: Vec<Service> = {
        let api: Api<Service> = Api::namespaced(client.clone(), &ns);
        let mut v = Vec::new();
        for n in ["fc-memoryx", "fc-swarmx", "fc-engine", "fc-input"] {
            v.push(ok(api.get(n).await, n));
        }
        v
    };
    let mut metas = vec![cm.metadata.clone(), sts.metadata.clone()];
    metas.extend(svcs.iter().map(|s| s.metadata.clone()));
    for role in ["engine", "swarmx", "input"] {
        metas.extend(pods_of(&pods, "fc", role).await.into_iter().map(|p| p.metadata));
    }
    assert_eq!(metas.len(), 2 + 4 + 4 + 3 + 4, "ConfigMap, StatefulSet, Services, engines, SwarmX, input workers");
    for m in &metas {
        let owners = m.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{:?}", m.name);
        let o = &owners[0];
        assert_eq!((o.kind.as_str(), o.name.as_str(), o.uid.as_str()), ("TrainingJob", "fc", uid.as_str()));
        assert_eq!((o.controller, o.block_owner_deletion), (Some(true), Some(true)), "{:?}", m.name);
    }
    for s in &svcs {
        assert_eq!(s.spec.as_ref().and_then(|s| s.cluster_ip.clone()).as_deref(), Some("None"), "headless");
    }
    let sts_spec = sts.spec.clone().unwrap_or_default();
    assert_eq!(sts_spec.replicas, Some(1));
    assert_eq!(sts_spec.volume_claim_templates.map(|v| v.len()), Some(1), "a checkpoint volume");

    // The right plan in the status, and in the ConfigMap only what the data plane reads: the job.
    let spec = created.spec.clone();
    let want = ok(plan::appliance::Plan::new(&spec, 64 << 20, 2), "plan");
    let data = cm.data.clone().unwrap_or_default();
    assert_eq!(data.keys().collect::<Vec<_>>(), vec!["job.yaml"], "the ConfigMap holds the job alone");
    assert_eq!(ok(crds::parse_training_job(&data["job.yaml"]), "job.yaml").spec, spec);
    let plan = status.plan.clone().unwrap_or_else(|| panic!("no plan in the status"));
    assert_eq!((plan.cs2, plan.shard, plan.memoryx_bytes), (4, 16, want.memoryx_bytes));
    assert_eq!((plan.swarmx.depth, plan.swarmx.nodes.len(), plan.engines.len()), (2, 3, 4));
    assert_eq!(plan.swarmx.depth, want.swarmx.depth(), "the status shows the plan's tree");

    // Pods ready but MemoryX silent: still Starting, and the condition says why.
    let j = ok(
        wait_for(WAIT, "Ready=False CoordinatorUnreachable", || async {
            let j = jobs.get("fc").await.ok()?;
            let c = j.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
            (c.reason == "CoordinatorUnreachable").then_some(j)
        })
        .await,
        "coordinator condition",
    );
    assert_eq!(j.status.and_then(|s| s.phase), Some(Phase::Starting));

    // MemoryX reports progress: Running, with its numbers.
    op.coordinator.set(&format!("{ns}/fc"), running(5, None));
    let j = wait_phase(&jobs, "fc", Phase::Running).await;
    let s = j.status.clone().unwrap_or_default();
    assert_eq!(
        (s.progress.step, s.progress.total_steps, s.progress.loss, s.progress.samples_per_second),
        (Some(5), Some(100), Some(0.75), Some(1234.5))
    );
    assert_eq!(s.progress.simulated_step_seconds, Some(0.002));
    assert_eq!(s.observed_generation, j.metadata.generation);
    op.coordinator.set(&format!("{ns}/fc"), running(12, Some(10)));
    ok(
        wait_for(WAIT, "step 12", || async {
            let s = jobs.get("fc").await.ok()?.status?;
            (s.progress.step == Some(12) && s.progress.last_checkpoint.map(|c| c.step) == Some(10)).then_some(())
        })
        .await,
        "progress",
    );

    // Idempotent: with nothing new to observe, passes change no object.
    let versions = || async {
        let mut v: BTreeMap<String, String> = BTreeMap::new();
        let j = ok(jobs.get("fc").await, "job");
        v.insert("job".into(), j.resource_version().unwrap_or_default());
        let sel = ListParams::default().labels("weightstream.dev/job=fc");
        for p in ok(pods.list(&sel).await, "pods").items {
            v.insert(format!("pod/{}", p.name_any()), p.resource_version().unwrap_or_default());
        }
        let sts = ok(Api::<StatefulSet>::namespaced(client.clone(), &ns).get("fc-memoryx").await, "sts");
        v.insert("sts".into(), sts.resource_version().unwrap_or_default());
        let cm = ok(Api::<ConfigMap>::namespaced(client.clone(), &ns).get("fc-config").await, "cm");
        v.insert("cm".into(), cm.resource_version().unwrap_or_default());
        for s in ok(Api::<Service>::namespaced(client.clone(), &ns).list(&sel).await, "svcs").items {
            v.insert(format!("svc/{}", s.name_any()), s.resource_version().unwrap_or_default());
        }
        v
    };
    let before_passes = op.shared.metrics.encode();
    let before = versions().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = versions().await;
    assert_eq!(before, after, "a reconcile pass with nothing new changed something");
    assert_ne!(before_passes, op.shared.metrics.encode(), "the operator did not reconcile during the check");

    // An engine fails: it is replaced under the same name, counted, and the job carries on.
    let old_uid = pods_of(&pods, "fc", "engine").await[2].uid();
    ok(set_pod_phase(&pods, "fc-engine-2", "Failed").await, "fail engine");
    ok(
        wait_for(WAIT, "a replacement engine-2", || async {
            let p = pods.get("fc-engine-2").await.ok()?;
            (p.uid() != old_uid).then_some(())
        })
        .await,
        "replacement",
    );
    let j = ok(jobs.get("fc").await, "job");
    assert_eq!(j.status.as_ref().map(|s| s.restarts), Some(1));
    ok(set_pod_phase(&pods, "fc-engine-2", "Running").await, "replacement runs");
    wait_phase(&jobs, "fc", Phase::Running).await;

    // Events on phase changes.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reasons = ok(
        wait_for(WAIT, "events", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            let r: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
            (r.iter().any(|x| x == "Admitted") && r.iter().any(|x| x == "Training")).then_some(r)
        })
        .await,
        "events",
    );
    assert!(reasons.iter().any(|r| r == "ReplacingFailedPods"), "{reasons:?}");

    // MemoryX finishes: Succeeded, the CS-2s are given back, the checkpoint volume stays.
    op.coordinator
        .set(&format!("{ns}/fc"), MemoryxStatus { phase: MemoryxPhase::Succeeded, ..running(100, Some(100)) });
    let j = wait_phase(&jobs, "fc", Phase::Succeeded).await;
    let s = j.status.clone().unwrap_or_default();
    assert_eq!((s.allocated_cs2, s.progress.step), (None, Some(100)));
    assert!(s.completion_time.is_some() && s.start_time.is_some());
    ok(
        wait_for(WAIT, "engines released", || async { pods_of(&pods, "fc", "engine").await.is_empty().then_some(()) })
            .await,
        "release",
    );
    // A job that succeeded keeps its MemoryX (on no CS-2), so its checkpoints can still be pulled.
    let sts = ok(Api::<StatefulSet>::namespaced(client.clone(), &ns).get("fc-memoryx").await, "sts");
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(1));

    // Deleting the job removes every child.
    ok(jobs.delete("fc", &DeleteParams::default()).await, "delete job");
    ok(
        wait_for(WAIT, "the job and its children to be gone", || async {
            let sel = ListParams::default().labels("weightstream.dev/job=fc");
            let gone = jobs.get_opt("fc").await.ok()?.is_none()
                && pods.list(&sel).await.ok()?.items.is_empty()
                && Api::<StatefulSet>::namespaced(client.clone(), &ns).list(&sel).await.ok()?.items.is_empty()
                && Api::<Service>::namespaced(client.clone(), &ns).list(&sel).await.ok()?.items.is_empty()
                && Api::<ConfigMap>::namespaced(client.clone(), &ns).list(&sel).await.ok()?.items.is_empty();
            gone.then_some(())
        })
        .await,
        "deletion",
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_all_or_nothing_and_in_priority_then_arrival_order() {
    let (client, ns) = setup("gang").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Arrival order a, b, c (creation timestamps are in seconds, hence the pauses).
    create(&jobs, &job("a", 2)).await;
    wait_phase(&jobs, "a", Phase::Starting).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create(&jobs, &job("b", 4)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create(&jobs, &job("c", 2)).await;
    let b = wait_phase(&jobs, "b", Phase::Queued).await;
    let c = wait_phase(&jobs, "c", Phase::Queued).await;
    let reason = |j: &TrainingJob| {
        j.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Admitted")).map(|c| c.reason.clone())
    };
    assert_eq!(reason(&b).as_deref(), Some("InsufficientCapacity"));
    assert_eq!(reason(&c).as_deref(), Some("WaitingForEarlierJobs"), "c must not overtake b although 2 CS-2s are free");

    // Never a partial start: a job has either all its engines or none, and the pool is never exceeded.
    let check_gangs = || async {
        let all = ok(jobs.list(&ListParams::default()).await, "jobs").items;
        let held: u32 = all.iter().filter_map(|j| j.status.as_ref()?.allocated_cs2).sum();
        assert!(held <= 4, "the pool is overcommitted: {held} > 4");
        for j in &all {
            let n = pods_of(&pods, &j.name_any(), "engine").await.len() as u32;
            let holds = j.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
            assert!(n == 0 || n == holds, "{} has {n} engines but holds {holds}", j.name_any());
            assert!(holds == 0 || holds == j.spec.cs2, "{} holds {holds} of {}", j.name_any(), j.spec.cs2);
        }
    };
    check_gangs().await;
    assert!(pods_of(&pods, "b", "engine").await.is_empty() && pods_of(&pods, "c", "engine").await.is_empty());

    // A later, more urgent job goes ahead of both.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut urgent = job("urgent", 4);
    urgent.spec.priority = 10;
    create(&jobs, &urgent).await;
    wait_phase(&jobs, "urgent", Phase::Queued).await;

    let finish = |name: &str| {
        op.coordinator
            .set(&format!("{ns}/{name}"), MemoryxStatus { phase: MemoryxPhase::Succeeded, ..running(100, Some(100)) })
    };
    finish("a");
    wait_phase(&jobs, "a", Phase::Succeeded).await;
    wait_phase(&jobs, "urgent", Phase::Starting).await;
    check_gangs().await;
    assert_eq!(jobs.get("b").await.ok().and_then(|j| j.status?.phase), Some(Phase::Queued));
    finish("urgent");
    wait_phase(&jobs, "b", Phase::Starting).await;
    check_gangs().await;
    assert_eq!(jobs.get("c").await.ok().and_then(|j| j.status?.phase), Some(Phase::Queued));
    finish("b");
    wait_phase(&jobs, "c", Phase::Starting).await;
    check_gangs().await;

    // Deleting a job that holds CS-2s removes its pods and frees them for the next.
    ok(
        wait_for(WAIT, "c's engines", || async { (pods_of(&pods, "c", "engine").await.len() == 2).then_some(()) })
            .await,
        "engines of c",
    );
    create(&jobs, &job("d", 4)).await;
    wait_phase(&jobs, "d", Phase::Queued).await;
    ok(jobs.delete("c", &DeleteParams::default()).await, "delete c");
    ok(
        wait_for(WAIT, "c's pods to go", || async {
            let sel = ListParams::default().labels("weightstream.dev/job=c");
            pods.list(&sel).await.ok()?.items.is_empty().then_some(())
        })
        .await,
        "c cleaned up",
    );
    wait_phase(&jobs, "d", Phase::Starting).await;
    check_gangs().await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_cannot_fit_an_engine_fails_with_the_reason() {
    let (client, ns) = setup("nofit").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut j = job("huge", 1);
    j.spec.engine.sram_bytes = Some(1024);
    create(&jobs, &j).await;
    let j = wait_phase(&jobs, "huge", Phase::Failed).await;
    let failed = j.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failed")).cloned();
    let failed = failed.unwrap_or_else(|| panic!("no Failed condition"));
    assert_eq!(failed.reason, "PlanRejected");
    assert!(
        failed.message.contains("SRAM budget exceeded"),
        "the message should say what it lacks: {}",
        failed.message
    );
    assert_eq!(j.status.and_then(|s| s.allocated_cs2), None, "a job that cannot run holds no CS-2s");
    op.stop().await;
}

/// A memory budget below what a weight server needs for one layer: the job fails at once, holding nothing, and
/// its Failed condition gives the plan's numbers and what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_budget_too_small_for_a_layer_fails_the_job_with_the_numbers() {
    let (client, ns) = setup("budget").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut j = job("tight", 2);
    j.spec.memoryx.servers = Some(2);
    j.spec.memoryx.memory_bytes = Some(1 << 20);
    j.spec.model.layers = vec![784, 1024, 10];
    create(&jobs, &j).await;
    let j = wait_phase(&jobs, "tight", Phase::Failed).await;
    let failed = j.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failed")).cloned();
    let failed = failed.unwrap_or_else(|| panic!("no Failed condition"));
    assert_eq!(failed.reason, "PlanRejected");
    assert!(
        failed.message.contains("spec.memoryx.memoryBytes") && failed.message.contains("raise memoryBytes"),
        "the message should give the budget and the fix: {}",
        failed.message
    );
    assert_eq!(j.status.and_then(|s| s.allocated_cs2), None, "a job that cannot run holds no CS-2s");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(ok(sets.get_opt("tight-memoryx").await, "sts").is_none(), "nothing was assembled");
    op.stop().await;
}

/// Weight servers as the API server stores them: a StatefulSet of `spec.memoryx.servers`, the weights port on
/// the Service and the container, the other servers' addresses, and a template Pod Security "restricted" admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memoryx_is_assembled_as_a_statefulset_of_weight_servers() {
    let (client, ns) = setup("servers").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut j = job("ws", 2);
    j.spec.memoryx.servers = Some(3);
    create(&jobs, &j).await;
    wait_phase(&jobs, "ws", Phase::Starting).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let sts =
        ok(wait_for(WAIT, "MemoryX's StatefulSet", || async { sets.get_opt("ws-memoryx").await.ok()? }).await, "sts");
    let spec = sts.spec.clone().unwrap_or_default();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.clone().unwrap_or_default();
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default().join(" ");
    let want = format!(
        "--weight-servers https://ws-memoryx-1.ws-memoryx.{ns}.svc:7400,https://ws-memoryx-2.ws-memoryx.{ns}.svc:7400"
    );
    assert!(args.contains(&want) && args.contains("--listen 0.0.0.0:7400"), "{args}");
    let ports: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
    assert_eq!(ports, [7400, 8080]);
    let svc = ok(Api::<Service>::namespaced(client.clone(), &ns).get("ws-memoryx").await, "MemoryX's Service");
    let names: Vec<String> =
        svc.spec.and_then(|s| s.ports).unwrap_or_default().into_iter().filter_map(|p| p.name).collect();
    assert_eq!(names, ["weights", "http"]);
    // The template as the StatefulSet controller would stamp it for server 2 (its ordinal label added): the
    // namespace enforces Pod Security "restricted", so this shows every server's pod is admitted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut labels = spec.template.metadata.and_then(|m| m.labels).unwrap_or_default();
    labels.insert("apps.kubernetes.io/pod-index".into(), "2".into());
    let server = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("ws-memoryx-2".into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some({
            let mut spec = pod.clone();
            // The controller would add the claim's volume, named after its template; an emptyDir stands in for it.
            let volume = spec_claim_name(&spec_of(&sts));
            let scratch = serde_json::json!({ "name": volume, "emptyDir": {} });
            spec.volumes.get_or_insert_with(Vec::new).push(ok(serde_json::from_value(scratch), "volume"));
            spec
        }),
        ..Default::default()
    };
    ok(pods.create(&PostParams::default(), &server).await, "a weight server's pod passes Pod Security restricted");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_checkpoints_and_frees_the_cs2s_resume_and_rescale_continue_from_the_checkpoint() {
    let (client, ns) = setup("suspend").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let key = format!("{ns}/s");
    create(&jobs, &job("s", 2)).await;
    wait_phase(&jobs, "s", Phase::Starting).await;
    start_pods(&pods, "s", 2).await;
    op.coordinator.set(&key, running(20, Some(10)));
    wait_phase(&jobs, "s", Phase::Running).await;

    let suspend = |on: bool| serde_json::json!({ "spec": { "suspend": on } });
    ok(jobs.patch("s", &PatchParams::default(), &Patch::Merge(&suspend(true))).await, "suspend");
    let j = wait_phase(&jobs, "s", Phase::Suspended).await;
    assert_eq!(op.coordinator.checkpoint_requests(), vec![key.clone()], "one checkpoint request before suspending");
    let s = j.status.clone().unwrap_or_default();
    assert_eq!((s.allocated_cs2, s.progress.last_checkpoint.map(|c| c.step)), (None, Some(20)));
    ok(
        wait_for(WAIT, "engines of the suspended job to go", || async {
            pods_of(&pods, "s", "engine").await.is_empty().then_some(())
        })
        .await,
        "suspend releases",
    );
    let sts = ok(sets.get("s-memoryx").await, "memoryx kept");
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(0), "MemoryX scaled to zero, its volume kept");

    // The freed CS-2s are usable by others.
    create(&jobs, &job("other", 4)).await;
    wait_phase(&jobs, "other", Phase::Starting).await;
    // Resuming waits for them to be free again, then starts from the checkpoint.
    op.coordinator.clear(&key);
    ok(jobs.patch("s", &PatchParams::default(), &Patch::Merge(&suspend(false))).await, "resume");
    wait_phase(&jobs, "s", Phase::Queued).await;
    op.coordinator.set(&format!("{ns}/other"), MemoryxStatus { phase: MemoryxPhase::Succeeded, ..running(100, None) });
    let j = wait_phase(&jobs, "s", Phase::Starting).await;
    let ready = j.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Suspended")).cloned();
    assert_eq!(ready.map(|c| (c.status, c.reason)), Some(("False".to_string(), "Resumed".to_string())));
    assert_eq!(ok(sets.get("s-memoryx").await, "sts").spec.and_then(|s| s.replicas), Some(1));
    start_pods(&pods, "s", 2).await;
    op.coordinator.set(&key, running(21, Some(20)));
    wait_phase(&jobs, "s", Phase::Running).await;

    // Rescale 2 -> 4 between steps: a checkpoint first, then the appliance is reassembled at 4.
    let old_root = ok(pods.get("s-swarmx-0-0").await, "root").uid();
    let old_engine = ok(pods.get("s-engine-0").await, "engine 0").uid();
    let config_hash = |sts: StatefulSet| {
        sts.spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .map(|a| a["weightstream.dev/config-hash"].clone())
    };
    let old_config = config_hash(ok(sets.get("s-memoryx").await, "sts"));
    ok(
        jobs.patch("s", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"spec": {"cs2": 4}}))).await,
        "rescale",
    );
    ok(
        wait_for(WAIT, "the job to hold 4 CS-2s", || async {
            (jobs.get("s").await.ok()?.status?.allocated_cs2 == Some(4)).then_some(())
        })
        .await,
        "rescale",
    );
    assert_eq!(op.coordinator.checkpoint_requests().len(), 2, "rescaling checkpoints first");
    start_pods(&pods, "s", 4).await;
    let cm = ok(Api::<ConfigMap>::namespaced(client.clone(), &ns).get("s-config").await, "cm");
    let parsed = ok(crds::parse_training_job(&cm.data.unwrap_or_default()["job.yaml"]), "job.yaml");
    assert_eq!(parsed.spec.cs2, 4);
    ok(
        wait_for(WAIT, "a new SwarmX root for the new tree", || async {
            let p = pods.get("s-swarmx-0-0").await.ok()?;
            (p.uid() != old_root).then_some(())
        })
        .await,
        "new root",
    );
    start_pods(&pods, "s", 4).await;
    assert_ne!(ok(pods.get("s-engine-0").await, "engine 0").uid(), old_engine, "engines restart with the new shard");
    assert_ne!(config_hash(ok(sets.get("s-memoryx").await, "sts")), old_config, "MemoryX restarts at the new size");
    op.coordinator.set(&key, running(22, Some(21)));
    let j = wait_phase(&jobs, "s", Phase::Running).await;
    assert_eq!(j.status.and_then(|s| s.plan).map(|p| p.cs2), Some(4));
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_failures_fail_the_job_and_free_its_cs2s() {
    let (client, ns) = setup("limit").await;
    let op = RunningOperator::start(&client, &ns, 2);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut j = job("flaky", 2);
    j.spec.restart_limit = 1;
    create(&jobs, &j).await;
    start_pods(&pods, "flaky", 2).await;
    op.coordinator.set(&format!("{ns}/flaky"), running(3, None));
    wait_phase(&jobs, "flaky", Phase::Running).await;
    // First failure: an engine. It is replaced and the job carries on.
    let old = ok(pods.get("flaky-engine-0").await, "engine").uid();
    ok(set_pod_phase(&pods, "flaky-engine-0", "Failed").await, "fail");
    ok(
        wait_for(WAIT, "replacement", || async { (pods.get("flaky-engine-0").await.ok()?.uid() != old).then_some(()) })
            .await,
        "replace",
    );
    ok(set_pod_phase(&pods, "flaky-engine-0", "Running").await, "run");
    wait_phase(&jobs, "flaky", Phase::Running).await;
    assert_eq!(jobs.get("flaky").await.ok().and_then(|j| j.status).map(|s| s.restarts), Some(1));
    // Second failure: MemoryX's container restarts (its StatefulSet's pod, played here by hand as there is no
    // StatefulSet controller). That exceeds restartLimit = 1.
    // Made from the StatefulSet's template, as the controller would: the namespace enforces Pod Security
    // "restricted", so this also shows the template passes it.
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let set = ok(sets.get("flaky-memoryx").await, "memoryx statefulset");
    let volume = spec_claim_name(&spec_of(&set));
    let template = set.spec.map(|s| s.template).unwrap_or_default();
    let memoryx = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("flaky-memoryx-0".into()),
            labels: template.metadata.and_then(|m| m.labels),
            ..Default::default()
        },
        // The controller would add the claim's volume, named after its template; an emptyDir stands in for it.
        spec: template.spec.map(|mut spec| {
            let scratch = serde_json::json!({ "name": volume, "emptyDir": {} });
            spec.volumes.get_or_insert_with(Vec::new).push(ok(serde_json::from_value(scratch), "volume"));
            spec
        }),
        ..Default::default()
    };
    ok(pods.create(&PostParams::default(), &memoryx).await, "create memoryx pod");
    let restarted = serde_json::json!({ "status": { "phase": "Running", "containerStatuses": [ {
        "name": "memoryx", "image": "weightstream/runtime:0.1.0", "imageID": "", "ready": true, "restartCount": 1,
        "state": { "running": {} } } ] } });
    ok(pods.patch_status("flaky-memoryx-0", &PatchParams::default(), &Patch::Merge(&restarted)).await, "restart");
    let j = wait_phase(&jobs, "flaky", Phase::Failed).await;
    let failed = j.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failed")).cloned();
    let failed = failed.unwrap_or_else(|| panic!("no Failed condition"));
    assert_eq!(failed.reason, "RestartLimitExceeded");
    assert!(failed.message.contains("restartLimit = 1"), "{}", failed.message);
    assert_eq!(j.status.as_ref().and_then(|s| s.allocated_cs2), None);
    // Its post-mortem: kept at the failure, not among the job's children (no job label), so it outlives them
    // and the job (retain: Retain, the default).
    use crds::contract::postmortem::{POSTMORTEM_LABEL, REASON_KEY, STATUS_KEY, config_map_name};
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = config_map_name("flaky", &j.uid().unwrap_or_default());
    let kept = ok(maps.get(&name).await, "the post-mortem ConfigMap");
    let labels = kept.labels().clone();
    assert_eq!(labels.get(POSTMORTEM_LABEL).map(String::as_str), Some("flaky"));
    assert!(!labels.contains_key(crds::contract::JOB_LABEL), "{labels:?}");
    let data = kept.data.unwrap_or_default();
    assert!(data.get(REASON_KEY).is_some_and(|r| r.starts_with("RestartLimitExceeded: ")), "{data:?}");
    assert!(data.get(STATUS_KEY).is_some_and(|s| s.contains("\"phase\":\"Failed\"")), "{data:?}");
    ok(jobs.delete("flaky", &DeleteParams::default()).await, "delete the job");
    ok(
        wait_for(WAIT, "flaky to be gone", || async { jobs.get_opt("flaky").await.ok()?.is_none().then_some(()) })
            .await,
        "gone",
    );
    assert!(ok(maps.get_opt(&name).await, "read").is_some(), "the post-mortem went with the job");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_writers_do_not_stop_the_status_from_converging() {
    let (client, ns) = setup("conflict").await;
    let op = RunningOperator::start(&client, &ns, 2);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&jobs, &job("busy", 2)).await;
    start_pods(&pods, "busy", 2).await;
    // Someone else keeps writing the job while it runs: every write moves its resourceVersion, so the
    // operator's compare-and-swap status writes meet conflicts and must retry.
    let writer = {
        let jobs = jobs.clone();
        tokio::spawn(async move {
            for i in 0..60u32 {
                let patch = serde_json::json!({ "metadata": { "labels": { "touched": i.to_string() } } });
                let _ = jobs.patch("busy", &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    for step in 1..=30 {
        op.coordinator.set(&format!("{ns}/busy"), running(step, None));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok(writer.await, "writer");
    ok(
        wait_for(WAIT, "step 30 and Running", || async {
            let s = jobs.get("busy").await.ok()?.status?;
            (s.progress.step == Some(30) && s.phase == Some(Phase::Running)).then_some(())
        })
        .await,
        "converged",
    );
    let j = ok(jobs.get("busy").await, "job");
    assert_eq!(j.status.map(|s| s.restarts), Some(0), "conflicts must not count as failures");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_knows_what_the_pool_holds() {
    let (client, ns) = setup("restart-op").await;
    let op = RunningOperator::start(&client, &ns, 2);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create(&jobs, &job("first", 2)).await;
    wait_phase(&jobs, "first", Phase::Starting).await;
    op.stop().await;
    // A new operator process: it must not admit a second job into CS-2s the first holds.
    let op = RunningOperator::start(&client, &ns, 2);
    create(&jobs, &job("second", 2)).await;
    wait_phase(&jobs, "second", Phase::Queued).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(jobs.get("second").await.ok().and_then(|j| j.status?.phase), Some(Phase::Queued));
    let first = ok(jobs.get("first").await, "first");
    assert_eq!(first.status.and_then(|s| s.allocated_cs2), Some(2));
    op.stop().await;
}

/// One job whose MemoryX answers `/status` slowly (here 20 s a request, longer than a whole admission should
/// take) must not hold up another job: the slow call is made outside the admission critical section, and the
/// controller reconciles different jobs concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_memoryx_does_not_delay_another_jobs_admission() {
    let (client, ns) = setup("slow").await;
    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&jobs, &job("slow", 2)).await;
    wait_phase(&jobs, "slow", Phase::Starting).await;
    start_pods(&pods, "slow", 2).await;
    op.coordinator.set(&format!("{ns}/slow"), running(3, None));
    wait_phase(&jobs, "slow", Phase::Running).await;
    // From now on every pass over `slow` spends 20 s waiting for its MemoryX.
    op.coordinator.set_delay(&format!("{ns}/slow"), Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let asked = std::time::Instant::now();
    create(&jobs, &job("quick", 2)).await;
    let admitted = ok(
        // The claim (allocatedCs2) is written before the children and the phase after them: wait for both.
        wait_for(Duration::from_secs(15), "quick to be admitted", || async {
            let j = jobs.get("quick").await.ok()?;
            let s = j.status.as_ref()?;
            (s.allocated_cs2 == Some(2) && s.phase == Some(Phase::Starting)).then_some(j)
        })
        .await,
        "admission beside a slow MemoryX",
    );
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "admission waited {took:?} for another job's MemoryX");
    assert_eq!(admitted.status.and_then(|s| s.phase), Some(Phase::Starting));
    let held: u32 = ok(jobs.list(&ListParams::default()).await, "jobs")
        .items
        .iter()
        .filter_map(|j| j.status.as_ref()?.allocated_cs2)
        .sum();
    assert_eq!(held, 4, "both jobs hold their CS-2s and the pool is not exceeded");
    op.stop().await;
}

/// A job whose pods the API server refuses (here an admission policy that denies every pod of the namespace;
/// Pod Security, quotas and webhooks refuse the same way) says so within a pass: `Ready` is False with reason
/// `PodsForbidden` and the server's words, and a Warning Event carries the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pods_are_reported_in_the_status_and_an_event() {
    let (client, ns) = setup("refused").await;
    let policy_api = |kind: &str, plural: &str| {
        let gvk = kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        Api::<DynamicObject>::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, plural))
    };
    let (policies, bindings) = (
        policy_api("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        policy_api("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
    );
    let name = format!("deny-pods-{ns}");
    let policy: DynamicObject = ok(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": { "name": name },
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [ {
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"] } ] },
                "validations": [ { "expression": "false", "reason": "Forbidden", "message": "no pods may run here" } ]
            }
        })),
        "policy",
    );
    let binding: DynamicObject = ok(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": { "name": name },
            "spec": {
                "policyName": name, "validationActions": ["Deny"],
                "matchResources": { "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } } }
            }
        })),
        "binding",
    );
    ok(policies.create(&PostParams::default(), &policy).await, "create policy");
    ok(bindings.create(&PostParams::default(), &binding).await, "create binding");
    // The API server takes the policy up within a few seconds: wait until a plain pod is refused.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let probe: Pod = ok(
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "probe" }, "spec": { "containers": [ {
            "name": "p", "image": "i", "securityContext": { "allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" } } } ] } })),
        "probe pod",
    );
    ok(
        wait_for(WAIT, "the policy to take effect", || async {
            match pods.create(&PostParams::default(), &probe).await {
                Err(kube::Error::Api(e)) if e.code == 403 => Some(()),
                Ok(_) => {
                    let _ = pods.delete("probe", &DeleteParams::default()).await;
                    None
                }
                Err(_) => None,
            }
        })
        .await,
        "policy",
    );

    let op = RunningOperator::start(&client, &ns, 4);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create(&jobs, &job("blocked", 2)).await;
    let c = wait_for(WAIT, "Ready=False PodsForbidden", || async {
        let j = jobs.get("blocked").await.ok()?;
        let c = j.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (c.reason == "PodsForbidden").then_some(c)
    })
    .await;
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!(
            "{e}; status now: {:#?}",
            jobs.get("blocked").await.ok().and_then(|j| j.status.map(|s| s.conditions))
        ),
    };
    assert_eq!(c.status, "False");
    assert!(c.message.contains("no pods may run here"), "{}", c.message);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    ok(
        wait_for(WAIT, "a PodsForbidden event", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("PodsForbidden") && e.type_.as_deref() == Some("Warning"))
                .then_some(())
        })
        .await,
        "the refusal as an event",
    );
    op.stop().await;
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = policies.delete(&name, &DeleteParams::default()).await;
}

/// A StatefulSet's spec (empty when it has none).
fn spec_of(sts: &StatefulSet) -> k8s_openapi::api::apps::v1::StatefulSetSpec {
    sts.spec.clone().unwrap_or_default()
}

/// The name of the first claim template of `spec`: the volume its pods mount the claim as (`checkpoints-<uid>`
/// for MemoryX's).
fn spec_claim_name(spec: &k8s_openapi::api::apps::v1::StatefulSetSpec) -> String {
    let name = spec.volume_claim_templates.iter().flatten().find_map(|t| t.metadata.name.clone());
    name.unwrap_or_else(|| panic!("no claim template in {spec:?}"))
}
