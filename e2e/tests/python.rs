//! The Python package's own suite (`python/tests`, pytest) run against the local cluster, in the models venv
//! `python/setup.sh` fills (the package installed, its test dependencies), on the package's current sources and
//! the wsctl this build made. The cluster with the chart, a fresh namespace and its kubeconfig are handed to
//! pytest, so every cluster call of the package (and the example notebook's cluster section) meets a real API
//! server and real pods. The local tests of the package run in the same pytest session.

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
    // The venv python/setup.sh made (`.ci/run` runs it): the package's dependencies and test tools. The suite
    // runs the package's current sources and the wsctl this build made; installing here would build wsctl
    // through maturin while other tests run that binary.
    let python = root.join("models/.venv/bin/python");
    let wsctl = cluster::wsctl().unwrap_or_else(|e| panic!("{e}"));
    let check = ok(Command::new(&python).args(["-c", "import pytest, weightstream"]).output(), "the venv's python");
    assert!(
        check.status.success(),
        "{} cannot import pytest and weightstream: run `bash python/setup.sh` first: {}",
        python.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    let out = tokio::task::spawn_blocking({
        let (root, kc, ns) = (root.clone(), kc.clone(), ns.clone());
        move || {
            Command::new(python)
                .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests"])
                .env("PYTHONPATH", root.join("python/src"))
                .current_dir(root)
                .env("WEIGHTSTREAM_WSCTL", wsctl)
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
