//! `wsctl dashboard` in a real browser (headless Chromium): a local run's page refreshes while the run goes on
//! and ends with one marker per recorded step, every process in the appliance's tree, each role's log and the
//! checkpoints; a namespace of 100 jobs lists within a second; nothing listens beyond loopback, and a request
//! addressed to another name is refused. (A running cluster job's page is checked in `cli.rs`, on the cluster
//! whose job it is.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::browser::{Dashboard, attributes, dump_dom, element, listens_beyond_loopback};
use kube::api::{Api, DeleteParams, PostParams};

const BROWSER_DEADLINE: Duration = Duration::from_secs(120);

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn wsctl() -> PathBuf {
    ok(e2e::cluster::wsctl(), "wsctl")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ws-e2e-dashboard-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    ok(std::fs::create_dir_all(&dir), "scratch folder");
    dir
}

/// A small MLP on the repository's MNIST sample, long enough to be watched while it runs.
fn job(dir: &Path, steps: u64) -> PathBuf {
    let data = e2e::cluster::repo_root().join("examples/data/mnist");
    let yaml = format!(
        "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: watched}}\nspec:\n  cs2: 2\n  \
         model: {{kind: mlp, layers: [784, 64, 32, 10], sparsity: 0.7}}\n  data: {{kind: mnist, path: {}}}\n  \
         training: {{batchSize: 64, steps: {steps}, seed: 5, optimizer: {{kind: adamw, learningRate: 0.002}}}}\n  \
         checkpoint: {{intervalSteps: {}, keep: 3}}\n",
        data.display(),
        steps / 4
    );
    let path = dir.join("job.yaml");
    ok(std::fs::write(&path, yaml), "job manifest");
    path
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

#[test]
fn a_local_runs_page_refreshes_while_it_runs_and_ends_with_every_step_process_log_and_checkpoint() {
    let dir = scratch("local");
    let out = dir.join("run");
    ok(std::fs::create_dir_all(&out), "run folder");
    let dash = ok(Dashboard::start(&wsctl(), &[&out.display().to_string()], None), "dashboard");
    assert!(!listens_beyond_loopback(dash.port), "the dashboard listens beyond 127.0.0.1");
    let listing = ok(dump_dom(&dash.url, 0, BROWSER_DEADLINE), "the listing");
    assert_eq!(attributes(&listing, "data-phase"), vec!["Waiting"], "{listing}");

    let manifest = job(&dir, 3000);
    let mut run = ok(
        Command::new(wsctl())
            .args(["run", &manifest.display().to_string(), "--out", &out.display().to_string()])
            .stdout(Stdio::null())
            .spawn(),
        "wsctl run",
    );
    let metrics = out.join("metrics.jsonl");
    let started = Instant::now();
    while lines(&metrics) < 10 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // While it runs the page takes in fresh content every few seconds (its script; virtual time runs fast).
    let running = ok(dump_dom(&format!("{}jobs/0", dash.url), 10_000, BROWSER_DEADLINE), "the running run's page");
    let refreshes = attributes(&running, "data-refreshes");
    assert!(refreshes.first().is_some_and(|n| n.parse::<u32>().unwrap_or(0) >= 1), "no refresh: {running}");
    assert!(ok(run.wait(), "wsctl run").success(), "the run failed");

    let page = ok(dump_dom(&format!("{}jobs/0", dash.url), 0, BROWSER_DEADLINE), "the finished run's page");
    let steps = lines(&metrics);
    let loss = element(&page, "<figure id=\"loss\"", "</figure>").unwrap_or_else(|| panic!("no loss chart: {page}"));
    assert_eq!(attributes(loss, "data-points"), vec![steps.to_string()]);
    // The curve's line (the longest: the axes' ticks are lines too) through every step, one marker a step, and
    // the legend's.
    let vertices = attributes(loss, "points").iter().map(|p| p.split_whitespace().count()).max().unwrap_or(0);
    assert_eq!(vertices, steps);
    assert_eq!(loss.matches("<circle").count(), steps + 1, "{steps} steps");
    assert!(loss.contains("held-out loss"), "no held-out point");
    let mut pods = attributes(&page, "data-name");
    let mut processes: Vec<String> = ok(std::fs::read_to_string(out.join("logs/processes")), "processes")
        .lines()
        .filter_map(|l| l.split('\t').next().map(String::from))
        .collect();
    pods.sort();
    processes.sort();
    assert_eq!(pods, processes, "the tree has every process");
    assert!(page.contains("<summary>memoryx</summary>"), "no coordinator log");
    let checkpoints = element(&page, "<table id=\"checkpoints\"", "</table>").unwrap_or_default();
    assert_eq!(checkpoints.matches("<tr>").count(), 1 + 3, "header and the 3 kept: {checkpoints}");
    assert!(page.contains(r#"data-phase="Succeeded""#));
    eprintln!("local run: {steps} steps, {} processes, refreshed {refreshes:?} times while running", pods.len());

    // Only this address by name; every answer carries the page's policy.
    let foreign = ok(dash.get("/", Some(&format!("rebound.example:{}", dash.port))), "foreign host");
    assert_eq!(foreign.status, 421);
    let own = ok(dash.get("/", None), "own host");
    let csp = own.header("content-security-policy");
    assert_eq!(own.status, 200);
    assert!(csp.is_some_and(|c| c.contains("script-src 'self'") && c.contains("frame-ancestors 'none'")), "{csp:?}");
    let missing = ok(dash.get("/jobs/1", None), "a run that is not there");
    assert!(missing.status == 404 && missing.body.contains("no job 1"), "{}: {}", missing.status, missing.body);
    drop(dash);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_jobs_are_listed_within_a_second() {
    let kubeconfig = match std::env::var_os("KUBECONFIG") {
        Some(kc) => PathBuf::from(kc),
        None => ok(ok(tokio::task::spawn_blocking(|| e2e::up("default", 0)).await, "up.sh"), "API server"),
    };
    let client = ok(e2e::client_for(&kubeconfig).await, "client");
    ok(e2e::install_crd(&client).await, "CRD");
    let ns = ok(e2e::namespace(&client, "dashboard").await, "namespace");
    let jobs: Api<crds::TrainingJob> = Api::namespaced(client.clone(), &ns);
    for i in 0..100 {
        ok(jobs.create(&PostParams::default(), &e2e::job(&format!("job-{i:03}"), 1)).await, "create a job");
    }
    let dash = ok(Dashboard::start(&wsctl(), &["-n", &ns], Some(&kubeconfig)), "dashboard");
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let answer = ok(dash.get("/", None), "the listing");
        times.push(start.elapsed());
        let rows = answer.body.matches("<tr class=\"job\"").count();
        assert_eq!((answer.status, rows), (200, 100), "{}", answer.body);
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!("100 jobs listed in {:?} (median of 5: {times:?})", median);
    assert!(median < Duration::from_secs(1), "the listing took {median:?}");
    let url = dash.url.clone();
    let dom = ok(tokio::task::spawn_blocking(move || dump_dom(&url, 0, BROWSER_DEADLINE)).await, "browser");
    let dom = ok(dom, "the listing in a browser");
    assert_eq!(dom.matches("<tr class=\"job\"").count(), 100);
    // A job with nothing running yet still has a page, which says where its records will come from.
    let url = format!("{}jobs/{ns}/job-007", dash.url);
    let dom = ok(ok(tokio::task::spawn_blocking(move || dump_dom(&url, 0, BROWSER_DEADLINE)).await, "browser"), "page");
    assert!(dom.contains("job-007") && dom.contains("no step recorded here"), "{dom}");
    drop(dash);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ok(namespaces.delete(&ns, &DeleteParams::default()).await.map(|_| ()), "delete the namespace");
}
