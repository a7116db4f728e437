//! The Helm chart, rendered by a real `helm` (built from its Go module by `e2e/tools/helm.sh`) and checked as
//! Kubernetes objects: the CRD is the generated one, the operator's permissions are exactly the ones it uses,
//! its pod is locked down, and the optional parts (device plugin, ServiceMonitor, Grafana dashboards) appear
//! only when asked for. No cluster needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

const RELEASE: &str = "weightstream";
const NAMESPACE: &str = "weightstream-system";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    root().join("charts/weightstream")
}

/// The helm binary, built once per test process (the script caches it across runs too).
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash").arg(root().join("e2e/tools/helm.sh")).output().expect("run e2e/tools/helm.sh");
        assert!(out.status.success(), "e2e/tools/helm.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// `helm template` with `--set` pairs: the rendered objects, or helm's error output.
fn try_template(sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE]).arg(chart()).args(["--namespace", NAMESPACE, "--include-crds"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm template");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("helm renders valid YAML");
        if !v.is_null() {
            objects.push(v);
        }
    }
    Ok(objects)
}

fn template(sets: &[&str]) -> Vec<Value> {
    try_template(sets).unwrap_or_else(|e| panic!("helm template {sets:?} failed:\n{e}"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn typed<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> T {
    let v = find(objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name} in {:?}", kinds(objects)));
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{kind} {name} does not parse: {e}"))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?")))
        .collect()
}

fn operator_container(objects: &[Value]) -> Container {
    let d: Deployment = typed(objects, "Deployment", "weightstream-operator");
    d.spec.unwrap().template.spec.unwrap().containers.into_iter().find(|c| c.name == "operator").unwrap()
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.as_ref()?.iter().find(|e| e.name == name)?.value.as_deref()
}

/// (apiGroup, resource) → verbs, for comparing rules regardless of how they are grouped.
fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.clone().unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn expect_grants(spec: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    spec.iter().flat_map(|(g, r, vs)| vs.iter().map(move |v| (g.to_string(), r.to_string(), v.to_string()))).collect()
}

#[test]
fn the_charts_crd_is_the_generated_one() {
    let generated = std::fs::read_to_string(root().join("crds/trainingjob.yaml")).unwrap();
    let copy = std::fs::read_to_string(chart().join("crds/trainingjob.yaml")).unwrap();
    assert!(
        generated == copy,
        "charts/weightstream/crds/trainingjob.yaml differs from crds/trainingjob.yaml: \
         cp crds/trainingjob.yaml charts/weightstream/crds/"
    );
    let objects = template(&[]);
    let crd = find(&objects, "CustomResourceDefinition", "trainingjobs.weightstream.dev").expect("the CRD is rendered");
    let parsed: Value = serde_yaml::from_str(&generated).unwrap();
    assert_eq!(crd, &parsed, "helm renders the CRD unchanged");
}

/// What the operator does to jobs and their children, in whichever namespaces it watches.
fn namespaced_grants() -> BTreeSet<(String, String, String)> {
    expect_grants(&[
        ("weightstream.dev", "trainingjobs", &["get", "list", "watch", "patch"]),
        ("weightstream.dev", "trainingjobs/status", &["patch"]),
        ("weightstream.dev", "trainingjobs/finalizers", &["update"]),
        ("", "pods", &["list", "watch", "create", "patch", "delete"]),
        ("apps", "statefulsets", &["get", "list", "watch", "create", "patch", "delete"]),
        ("", "services", &["list", "create", "patch", "delete"]),
        // The job's settings, and its post-mortem (read back to add a replaced pod's log).
        ("", "configmaps", &["get", "list", "create", "patch", "delete"]),
        // The end of each pod's log, for the post-mortem.
        ("", "pods/log", &["get"]),
        ("", "secrets", &["get", "list", "create", "delete"]),
        // MemoryX's checkpoint claims are removed with the job; a job's data claim is read to say when it is missing.
        ("", "persistentvolumeclaims", &["get", "list", "delete"]),
        ("events.k8s.io", "events", &["create", "patch"]),
        ("networking.k8s.io", "networkpolicies", &["list", "create", "patch", "delete"]),
        ("", "events", &["list"]),
        // A job under Kueue: its Workload, PodsReady/Finished and an evicted reservation given back, where it waits.
        ("kueue.x-k8s.io", "workloads", &["get", "list", "watch", "create", "patch", "delete"]),
        ("kueue.x-k8s.io", "workloads/status", &["patch"]),
        ("kueue.x-k8s.io", "localqueues", &["get"]),
        ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", &["get"]),
    ])
}

/// The reads of cluster-scoped objects, which no Role can grant: the pool, the PriorityClasses, and Kueue's
/// flavors and WorkloadPriorityClasses.
fn cluster_reads() -> BTreeSet<(String, String, String)> {
    expect_grants(&[
        ("", "nodes", &["list"]),
        ("scheduling.k8s.io", "priorityclasses", &["list"]),
        ("kueue.x-k8s.io", "resourceflavors", &["get"]),
        ("kueue.x-k8s.io", "workloadpriorityclasses", &["get"]),
    ])
}

#[test]
fn the_operator_may_do_exactly_what_it_does() {
    let objects = template(&[]);
    let role: ClusterRole = typed(&objects, "ClusterRole", "weightstream-operator");
    assert_eq!(grants(&role.rules.unwrap_or_default()), namespaced_grants());
    let reads: ClusterRole = typed(&objects, "ClusterRole", "weightstream-operator-cluster-reads");
    assert_eq!(grants(&reads.rules.unwrap_or_default()), cluster_reads());
    let lease: Role = typed(&objects, "Role", "weightstream-operator-leader-election");
    assert_eq!(
        grants(&lease.rules.unwrap_or_default()),
        expect_grants(&[("coordination.k8s.io", "leases", &["get", "create", "update"])])
    );
    assert_eq!(lease.metadata.namespace.as_deref(), Some(NAMESPACE));
    // Bound cluster-wide by default (every namespace is watched), to the chart's ServiceAccount.
    let binding = find(&objects, "ClusterRoleBinding", "weightstream-operator").expect("a ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["name"], "weightstream-operator");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    assert!(find(&objects, "ServiceAccount", "weightstream-operator").is_some());
    // No wildcard in any rule of any role; secrets (the jobs' identities) only where the operator's rules
    // name them, never `update`/`patch`/`watch`: an identity is issued once and only read back.
    for rule in objects.iter().filter_map(|o| o["rules"].as_array()).flatten() {
        for key in ["verbs", "resources", "apiGroups"] {
            for v in rule[key].as_array().into_iter().flatten() {
                assert!(v != "*", "{v} granted in {rule}");
            }
        }
        if rule["resources"].as_array().is_some_and(|r| r.iter().any(|v| v == "secrets")) {
            assert!(
                rule["verbs"].as_array().unwrap().iter().all(|v| v != "update" && v != "patch" && v != "watch"),
                "{rule}"
            );
        }
    }
}

#[test]
fn the_default_operator_is_locked_down_probed_and_elects_a_leader() {
    let objects = template(&[]);
    let d: Deployment = typed(&objects, "Deployment", "weightstream-operator");
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("weightstream-operator"));
    let psc = pod.security_context.unwrap();
    assert_eq!((psc.run_as_non_root, psc.run_as_user), (Some(true), Some(65532)));
    let c = operator_container(&objects);
    assert_eq!(c.image.as_deref(), Some("weightstream/operator:0.1.0"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(c.command.as_deref(), Some(&["weightstream-operator".to_string()][..]));
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| p.clone().unwrap().http_get.unwrap().path.unwrap();
    assert_eq!(path(&c.liveness_probe), "/healthz");
    assert_eq!(path(&c.readiness_probe), "/readyz");
    let res = c.resources.clone().unwrap();
    assert!(res.requests.unwrap().contains_key("memory") && res.limits.unwrap().contains_key("memory"));
    let args = c.args.clone().unwrap();
    assert!(args.contains(&"--runtime-image=weightstream/runtime:0.1.0".into()), "{args:?}");
    assert!(args.contains(&"--swarmx-fan-out=8".into()), "{args:?}");
    assert!(!args.iter().any(|a| a == "--no-leader-election" || a.starts_with("--namespace")), "{args:?}");
    assert_eq!(env(&c, "WS_CS2_POOL"), Some("8"));
    let pod_ns = c.env.as_ref().unwrap().iter().find(|e| e.name == "POD_NAMESPACE").unwrap();
    assert_eq!(pod_ns.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "metadata.namespace");
    // The labels every job's NetworkPolicy admits are the operator pods' own selector labels.
    let admitted =
        operator::children::settings::OperatorPeer::parse_labels(env(&c, "WS_OPERATOR_POD_LABELS").unwrap()).unwrap();
    let pod_labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    assert_eq!(admitted, spec.selector.match_labels.clone().unwrap(), "exactly the Deployment's selector");
    assert!(admitted.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "{admitted:?} ⊄ {pod_labels:?}");
    assert!(find(&objects, "DaemonSet", "weightstream-device-plugin").is_none(), "no device plugin by default");
    assert!(!objects.iter().any(|o| o["kind"] == "ServiceMonitor"), "no ServiceMonitor by default");
    assert!(find(&objects, "Service", "weightstream-operator-metrics").is_some());
}

#[test]
fn overrides_reach_the_objects() {
    let objects = template(&[
        "operator.image.repository=registry.example/ws/operator",
        "operator.image.tag=dev",
        "operator.image.pullPolicy=Never",
        "runtime.image.repository=registry.example/ws/runtime",
        "runtime.image.tag=dev",
        "operator.leaderElection.enabled=false",
        "operator.replicas=1",
        "operator.watchNamespace=ml",
        "cs2.pool=null",
        "devicePlugin.enabled=true",
        "devicePlugin.devicesPerNode=2",
        "metrics.serviceMonitor.enabled=true",
    ]);
    let c = operator_container(&objects);
    assert_eq!(c.image.as_deref(), Some("registry.example/ws/operator:dev"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
    let args = c.args.clone().unwrap();
    for a in ["--runtime-image=registry.example/ws/runtime:dev", "--no-leader-election", "--namespace=ml"] {
        assert!(args.contains(&a.to_string()), "{a} missing from {args:?}");
    }
    assert_eq!(env(&c, "WS_CS2_POOL"), None, "no fallback pool when cs2.pool is null");
    // One namespace: the job permissions are bound there only (see the watch-namespace test), and no Lease
    // permission without an election.
    let binding =
        find(&objects, "RoleBinding", "weightstream-operator").expect("a RoleBinding in the watched namespace");
    assert_eq!(binding["metadata"]["namespace"], "ml");
    // What it binds grants the job's NetworkPolicy there too.
    let bound_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default().to_string();
    let bound_name = binding["roleRef"]["name"].as_str().unwrap_or_default().to_string();
    let bound =
        find(&objects, &bound_kind, &bound_name).unwrap_or_else(|| panic!("{bound_kind} {bound_name} is not rendered"));
    let rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = serde_json::from_value(bound["rules"].clone()).unwrap();
    let want = expect_grants(&[("networking.k8s.io", "networkpolicies", &["list", "create", "patch", "delete"])]);
    assert!(want.is_subset(&grants(&rules)), "the watched namespace's binding lacks networkpolicies");
    assert!(find(&objects, "ClusterRoleBinding", "weightstream-operator").is_none());
    assert!(
        find(&objects, "ClusterRoleBinding", "weightstream-operator-cluster-reads").is_some(),
        "nodes stay readable"
    );
    assert!(find(&objects, "Role", "weightstream-operator-leader-election").is_none());

    let ds: DaemonSet = typed(&objects, "DaemonSet", "weightstream-device-plugin");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let dp = &pod.containers[0];
    assert_eq!(dp.image.as_deref(), Some("registry.example/ws/operator:dev"), "the plugin ships in the operator image");
    assert_eq!(dp.command.as_deref(), Some(&["weightstream-device-plugin".to_string()][..]));
    assert!(dp.args.clone().unwrap().contains(&"--devices=2".to_string()));
    let sc = dp.security_context.clone().unwrap();
    assert_eq!((sc.read_only_root_filesystem, sc.allow_privilege_escalation), (Some(true), Some(false)));
    assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    let host = pod.volumes.unwrap()[0].host_path.clone().unwrap();
    assert_eq!(host.path, "/var/lib/kubelet/device-plugins");
    assert_eq!(dp.volume_mounts.clone().unwrap()[0].mount_path, "/var/lib/kubelet/device-plugins");

    let sm = objects.iter().find(|o| o["kind"] == "ServiceMonitor").expect("a ServiceMonitor when enabled");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn with_a_watch_namespace_only_a_role_and_role_binding_grant_namespaced_objects() {
    let objects = template(&["operator.watchNamespace=ml"]);
    // The job permissions: a Role in the watched namespace, bound there by a RoleBinding that names the Role.
    let role: Role = typed(&objects, "Role", "weightstream-operator");
    assert_eq!(role.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(grants(&role.rules.unwrap_or_default()), namespaced_grants());
    let binding = find(&objects, "RoleBinding", "weightstream-operator").expect("a RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "ml");
    assert_eq!(
        (binding["roleRef"]["kind"].as_str(), binding["roleRef"]["name"].as_str()),
        (Some("Role"), Some("weightstream-operator"))
    );
    assert_eq!(binding["subjects"][0]["name"], "weightstream-operator");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    // Nothing cluster-wide but the read-only cluster-scoped lists: no ClusterRole grants any namespaced object.
    assert!(find(&objects, "ClusterRole", "weightstream-operator").is_none());
    assert!(find(&objects, "ClusterRoleBinding", "weightstream-operator").is_none());
    let mut cluster_wide = BTreeSet::new();
    for o in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
        let r: ClusterRole = serde_json::from_value(o.clone()).expect("a ClusterRole");
        cluster_wide.extend(grants(&r.rules.unwrap_or_default()));
    }
    assert_eq!(cluster_wide, cluster_reads());
    for b in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding") {
        assert_eq!(b["roleRef"]["name"], "weightstream-operator-cluster-reads", "{b}");
    }
    // Every RoleBinding lives in the watched namespace or the release's (the Lease).
    for b in objects.iter().filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "Role") {
        let ns = b["metadata"]["namespace"].as_str();
        assert!(ns == Some("ml") || ns == Some(NAMESPACE), "{b}");
    }
}

#[test]
fn impossible_values_are_refused_with_the_reason() {
    let e = try_template(&["operator.leaderElection.enabled=false"]).unwrap_err();
    assert!(e.contains("operator.replicas > 1 needs operator.leaderElection.enabled"), "{e}");
    let e = try_template(&["devicePlugin.enabled=true", "devicePlugin.devicesPerNode=0"]).unwrap_err();
    assert!(e.contains("devicePlugin.devicesPerNode must be in 1..1024"), "{e}");
    let e = try_template(&["operator.swarmxFanOut=1"]).unwrap_err();
    assert!(e.contains("operator.swarmxFanOut must be at least 2"), "{e}");
}

#[test]
fn helm_lint_is_clean() {
    for sets in [&[][..], &["devicePlugin.enabled=true", "metrics.serviceMonitor.enabled=true"][..]] {
        let mut cmd = Command::new(helm());
        cmd.args(["lint", "--strict"]).arg(chart());
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("run helm lint");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "helm lint {sets:?} failed:\n{text}");
        assert!(text.contains("0 chart(s) failed"), "{text}");
        assert!(!text.contains("[WARNING]") && !text.contains("[ERROR]"), "helm lint {sets:?}:\n{text}");
    }
}

/// The Grafana dashboards are off by default; on, they are one ConfigMap labelled for Grafana's dashboard sidecar
/// (in the namespace asked for) holding each file of `dashboards/` as it is, and each is a dashboard Grafana
/// loads: a uid and title, the Prometheus data source as a variable every query uses, panels placed on the grid
/// with at least one PromQL query each. (wsctl's appliance test checks that every metric they query is exported.)
#[test]
fn grafana_dashboards_are_a_configmap_for_grafanas_sidecar() {
    let none = template(&[]);
    assert!(find(&none, "ConfigMap", "weightstream-dashboards").is_none(), "{:?}", kinds(&none));
    let on = template(&["metrics.grafanaDashboards.enabled=true", "metrics.grafanaDashboards.namespace=monitoring"]);
    let cm: ConfigMap = typed(&on, "ConfigMap", "weightstream-dashboards");
    assert_eq!(cm.metadata.namespace.as_deref(), Some("monitoring"));
    assert_eq!(cm.metadata.labels.unwrap_or_default().get("grafana_dashboard").map(String::as_str), Some("1"));
    let data = cm.data.unwrap_or_default();
    let files: Vec<PathBuf> = std::fs::read_dir(chart().join("dashboards"))
        .expect("charts/weightstream/dashboards")
        .map(|e| e.expect("a dashboard file").path())
        .collect();
    assert_eq!(data.len(), files.len(), "{:?}", data.keys());
    assert!(files.len() >= 2, "{files:?}");
    let mut uids = BTreeSet::new();
    for file in files {
        let name = file.file_name().unwrap_or_default().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file).expect("a dashboard");
        assert_eq!(data.get(&format!("weightstream-{name}")).map(|t| t.trim()), Some(text.trim()), "{name}");
        let d: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        assert!(uids.insert(d["uid"].as_str().unwrap_or_default().to_string()), "{name}: a uid of its own");
        assert!(d["title"].as_str().is_some_and(|t| t.starts_with("weightstream")), "{name}");
        assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "{name}");
        let variables = d["templating"]["list"].as_array().cloned().unwrap_or_default();
        assert!(variables.iter().any(|v| v["name"] == "datasource" && v["query"] == "prometheus"), "{name}");
        let panels = d["panels"].as_array().cloned().unwrap_or_default();
        assert!(!panels.is_empty(), "{name}");
        for p in &panels {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(["h", "w", "x", "y"].iter().all(|k| p["gridPos"][k].is_u64()), "{name}: {title}");
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {title}");
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "{name}: {title}");
            for t in targets {
                assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{name}: {title}");
            }
        }
    }
}
