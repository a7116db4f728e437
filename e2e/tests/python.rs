//! The Python package's own suite (`python/tests`, pytest) run against the local cluster: `python/setup.sh`
//! installs the package (bundling the wsctl this workspace built) and its test dependencies into the models
//! venv, and the cluster with the chart, a fresh namespace and its kubeconfig are handed to pytest, so every
//! cluster call of the package (and the example notebook's cluster section) meets a real API server and real
//! pods. The local tests of the package run in the same pytest session.

use std::path::PathBuf;
use std::process::Command;

use e2e::cluster;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_passes_its_suite_against_the_cluster() {
    let kc = cluster::with_chart().unwrap_or_else(|e| panic!("{e}"));
    let client = ok(e2e::client_for(&kc).await, "client");
    let ns = ok(e2e::namespace(&client, "py").await, "namespace");
    let root = cluster::repo_root();
    let setup = ok(Command::new("bash").arg(root.join("python/setup.sh")).output(), "python/setup.sh");
    assert!(setup.status.success(), "python/setup.sh failed: {}", String::from_utf8_lossy(&setup.stderr));
    let stdout = String::from_utf8_lossy(&setup.stdout);
    let python = PathBuf::from(stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim());
    let out = tokio::task::spawn_blocking({
        let (root, kc, ns) = (root.clone(), kc.clone(), ns.clone());
        move || {
            Command::new(python)
                .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests"])
                .current_dir(root)
                .env("WEIGHTSTREAM_TEST_KUBECONFIG", kc)
                .env("WEIGHTSTREAM_TEST_NAMESPACE", ns)
                .output()
        }
    })
    .await;
    let out = ok(ok(out, "pytest task"), "pytest");
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{report}");
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(&ns, &DeleteParams::default()).await;
    assert!(out.status.success(), "pytest failed:\n{report}");
    assert!(!report.contains(" skipped"), "with the cluster up no test may be skipped:\n{report}");
}
