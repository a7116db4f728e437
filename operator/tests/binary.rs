//! The `weightstream-operator` binary as a cluster runs it: it reaches the API server from a kubeconfig, takes
//! the leader Lease, serves `/healthz` `/readyz` `/metrics`, logs JSON, and admits a job from its configured
//! pool. Uses `KUBECONFIG` when set, else the local API server of `e2e/apiserver/up.sh` (built on first use).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crds::{Phase, TrainingJob};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

fn kubeconfig() -> PathBuf {
    if let Some(k) = std::env::var_os("KUBECONFIG") {
        return PathBuf::from(k);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/apiserver/up.sh");
    let out = Command::new("bash").arg(&script).output().unwrap_or_else(|e| panic!("cannot run {script:?}: {e}"));
    assert!(out.status.success(), "e2e/apiserver/up.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim())
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_leads_serves_its_endpoints_and_admits_jobs() {
    let path = kubeconfig();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
    let client = Client::try_from(config).unwrap();

    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd = crds::crd().unwrap();
    crds.patch(
        "trainingjobs.weightstream.dev",
        &kube::api::PatchParams::apply("weightstream-test").force(),
        &kube::api::Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let ns = format!("binary-{:x}", nanos % 0xffffff);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let n: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    namespaces.create(&PostParams::default(), &n).await.unwrap();

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let log = std::env::temp_dir().join(format!("{ns}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_weightstream-operator"))
        .args(["--namespace", &ns, "--cs2-pool", "2", "--http", &format!("127.0.0.1:{port}")])
        .args(["--lease-namespace", &ns, "--identity", "replica-a", "--poll-seconds", "1"])
        .env("KUBECONFIG", &path)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _op = Operator(child);

    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    until("/readyz", || async { (http.get(url("/readyz")).send().await.ok()?.status() == 200).then_some(()) }).await;
    assert_eq!(http.get(url("/healthz")).send().await.unwrap().status(), 200);

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = until("the lease", || async { leases.get_opt("weightstream-operator").await.ok()? }).await;
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("replica-a"));

    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut job = crds::testing::mlp_job("bin", &ns, 2);
    job.metadata.uid = None;
    jobs.create(&PostParams::default(), &job).await.unwrap();
    // No MemoryX answers here (no data plane), so the job is admitted and waits, saying why.
    let status = until("the job to be admitted", || async {
        let s = jobs.get("bin").await.ok()?.status?;
        (s.phase == Some(Phase::Starting) && s.allocated_cs2 == Some(2)).then_some(s)
    })
    .await;
    assert!(status.conditions.iter().any(|c| c.type_ == "Admitted" && c.status == "True"));

    let metrics = until("metrics with a reconcile", || async {
        let body = http.get(url("/metrics")).send().await.ok()?.text().await.ok()?;
        body.contains("weightstream_operator_reconciles_total{result=\"ok\"}").then_some(body)
    })
    .await;
    assert!(metrics.contains("weightstream_operator_cs2_pool 2"), "{metrics}");

    let text = std::fs::read_to_string(&log).unwrap();
    let first = text.lines().next().unwrap_or_default();
    let parsed: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {first}"));
    assert!(parsed.get("level").is_some() && parsed.get("fields").is_some(), "{first}");
}
