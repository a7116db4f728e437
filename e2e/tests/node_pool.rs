//! The CS-2 pool from the nodes: with no node advertising `weightstream.dev/cs2` and no configured size a job
//! waits with `NoPool`; once a node advertises CS-2s, the pool is their sum and engines request one each. Runs
//! its own API server instance (`nodes`), because Nodes are cluster-wide and would change the other tests'
//! pools; with `KUBECONFIG` set it says so and fails rather than touch a real cluster's nodes.

use std::sync::Arc;
use std::time::Duration;

use crds::{Phase, TrainingJob};
use e2e::{install_crd, job, namespace, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use operator::config::Config;
use operator::coordinator::ScriptedCoordinator;
use operator::metrics::Shared;

const WAIT: Duration = Duration::from_secs(60);

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

async fn reason_of(jobs: &Api<TrainingJob>, name: &str, phase: Phase) -> String {
    let what = format!("{name} to reach {phase}");
    ok(
        wait_for(WAIT, &what, || async {
            let s = jobs.get(name).await.ok()?.status?;
            if s.phase != Some(phase) {
                return None;
            }
            s.conditions.iter().find(|c| c.type_ == "Admitted").map(|c| c.reason.clone())
        })
        .await,
        "phase",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_is_what_the_nodes_advertise() {
    assert!(
        std::env::var_os("KUBECONFIG").is_none(),
        "this test adds Nodes to its own local API server; unset KUBECONFIG to run it"
    );
    let path = ok(ok(tokio::task::spawn_blocking(|| e2e::up("nodes", 2)).await, "up.sh task"), "API server");
    let client = ok(e2e::client_for(&path).await, "client");
    ok(install_crd(&client).await, "CRD");
    let ns = ok(namespace(&client, "nodes").await, "namespace");
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ok(nodes.list(&ListParams::default()).await, "nodes").items {
        if let Some(name) = n.metadata.name {
            ok(nodes.delete(&name, &Default::default()).await, "remove a node left by an earlier run");
        }
    }

    let config =
        Config { namespace: Some(ns.clone()), pool: None, poll: Duration::from_millis(300), ..Config::default() };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(operator::reconcile::run(
        client.clone(),
        config,
        Arc::new(ScriptedCoordinator::default()),
        Shared::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    ok(jobs.create(&PostParams::default(), &job("first", 2)).await, "create");
    assert_eq!(reason_of(&jobs, "first", Phase::Queued).await, "NoPool");

    // A node with 3 CS-2s attached.
    let node: Node = ok(serde_json::from_value(serde_json::json!({ "metadata": { "name": "cs2-host" } })), "node");
    ok(nodes.create(&PostParams::default(), &node).await, "create node");
    let status = serde_json::json!({ "status": {
        "capacity": { "weightstream.dev/cs2": "3", "cpu": "8", "memory": "32Gi", "pods": "110" },
        "allocatable": { "weightstream.dev/cs2": "3", "cpu": "8", "memory": "32Gi", "pods": "110" } } });
    ok(nodes.patch_status("cs2-host", &PatchParams::default(), &Patch::Merge(&status)).await, "advertise");

    assert_eq!(reason_of(&jobs, "first", Phase::Starting).await, "Admitted");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let engine =
        ok(wait_for(WAIT, "engine 0", || async { pods.get_opt("first-engine-0").await.ok()? }).await, "engine pod");
    let limits = engine.spec.and_then(|s| s.containers[0].resources.clone()).and_then(|r| r.limits);
    assert_eq!(limits.map(|l| l["weightstream.dev/cs2"].0.clone()).as_deref(), Some("1"), "engines request a CS-2");

    // 3 - 2 = 1 free: a second two-CS-2 job waits.
    ok(jobs.create(&PostParams::default(), &job("second", 2)).await, "create second");
    assert_eq!(reason_of(&jobs, "second", Phase::Queued).await, "InsufficientCapacity");

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    ok(nodes.delete("cs2-host", &Default::default()).await, "remove the node");
}
