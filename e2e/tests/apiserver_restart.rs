//! The operator survives its API server going away and coming back, and leader election hands over a lease
//! only when its holder stops renewing. This file runs its own API server instance (`restart`, ports shifted by
//! one) so restarting it disturbs no other test; with `KUBECONFIG` set there is no server to restart and the
//! restart test says so and fails, rather than pretending.

use std::time::Duration;

use crds::contract::{MemoryxPhase, MemoryxStatus};
use crds::{Phase, TrainingJob};
use e2e::{RunningOperator, install_crd, job, namespace, set_pod_phase, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use operator::leader::Election;

const INSTANCE: &str = "restart";
const WAIT: Duration = Duration::from_secs(60);

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

async fn own_server() -> Client {
    let path = ok(tokio::task::spawn_blocking(|| e2e::up(INSTANCE, 1)).await, "up.sh task");
    let path = ok(path, "no API server for the restart test");
    ok(e2e::client_for(&path).await, "client")
}

async fn phase_is(api: &Api<TrainingJob>, name: &str, phase: Phase) {
    let what = format!("{name} to reach {phase}");
    ok(
        wait_for(WAIT, &what, || async { (api.get(name).await.ok()?.status?.phase == Some(phase)).then_some(()) })
            .await,
        "phase",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_carries_on_after_the_api_server_restarts() {
    assert!(
        std::env::var_os("KUBECONFIG").is_none(),
        "this test restarts its own local API server; unset KUBECONFIG to run it (the other e2e tests use KUBECONFIG)"
    );
    let client = own_server().await;
    ok(install_crd(&client).await, "CRD");
    let ns = ok(namespace(&client, "restart").await, "namespace");
    let op = RunningOperator::start(&client, &ns, 2);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    ok(jobs.create(&PostParams::default(), &job("r", 2)).await, "create");
    phase_is(&jobs, "r", Phase::Starting).await;
    ok(
        wait_for(WAIT, "pods", || async {
            // The SwarmX root, two engines and their two input workers.
            (pods.list(&ListParams::default().labels("weightstream.dev/job=r")).await.ok()?.items.len() == 5)
                .then_some(())
        })
        .await,
        "pods",
    );
    for p in ok(pods.list(&ListParams::default().labels("weightstream.dev/job=r")).await, "pods").items {
        ok(set_pod_phase(&pods, &p.name_any(), "Running").await, "ready");
    }
    let key = format!("{ns}/r");
    op.coordinator.set(&key, MemoryxStatus::at(MemoryxPhase::Running, 1));
    phase_is(&jobs, "r", Phase::Running).await;

    // The API server (and etcd) go away for a while; progress made meanwhile must still reach the status.
    ok(tokio::task::spawn_blocking(|| e2e::down(INSTANCE, false)).await, "down.sh task")
        .unwrap_or_else(|e| panic!("{e}"));
    op.coordinator.set(&key, MemoryxStatus::at(MemoryxPhase::Running, 42));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _client_again = own_server().await;
    ok(
        wait_for(WAIT, "step 42 after the restart", || async {
            (jobs.get("r").await.ok()?.status?.progress.step == Some(42)).then_some(())
        })
        .await,
        "progress after restart",
    );
    // And it still reacts to new objects: a new job is queued (the first holds the pool), then admitted.
    ok(jobs.create(&PostParams::default(), &job("after", 2)).await, "create after restart");
    phase_is(&jobs, "after", Phase::Queued).await;
    op.coordinator.set(&key, MemoryxStatus::at(MemoryxPhase::Succeeded, 100));
    phase_is(&jobs, "after", Phase::Starting).await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_goes_to_one_replica_and_moves_only_when_it_stops_renewing() {
    let client = match e2e::client().await {
        Ok(c) => c,
        Err(e) => panic!("no API server for the integration tests: {e}"),
    };
    let ns = ok(namespace(&client, "lease").await, "namespace");
    let election = |who: &str| Election {
        namespace: ns.clone(),
        name: "weightstream-operator".into(),
        identity: who.into(),
        lease_duration: Duration::from_secs(2),
    };
    let (a, b) = (election("a"), election("b"));
    assert!(ok(a.try_acquire(&client).await, "a acquires"));
    assert!(!ok(b.try_acquire(&client).await, "b tries"), "b took a lease a holds");
    assert!(ok(a.try_acquire(&client).await, "a renews"));
    // a stops renewing: after the lease duration b may take it, and then a may not.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(ok(b.try_acquire(&client).await, "b takes over"));
    assert!(!ok(a.try_acquire(&client).await, "a returns"), "a took back a lease b holds");
}
