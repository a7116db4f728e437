//! Kueue's objects as the operator reads and writes them (`kueue.x-k8s.io/v1beta2`): `Workload`, `LocalQueue` and
//! `ResourceFlavor` generated from the CRD schemas of the Kueue the e2e suite pins (`generate.sh`), and the
//! visibility API's answer, which no CRD describes. The operator never writes back a whole object it read (only
//! its own fields, by server-side apply or a merge patch), so fields a newer Kueue adds are not lost.

pub mod localqueues;
pub mod resourceflavors;
pub mod visibility;
pub mod workloads;

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version the operator speaks (served and stored by Kueue since v0.16).
pub const VERSION: &str = "v1beta2";

#[cfg(test)]
mod tests {
    use super::workloads::Workload;

    /// A Workload as Kueue v0.19 stores it after admission decodes into the generated types, and what the
    /// operator reads from it survives.
    #[test]
    fn an_admitted_workload_from_kueue_decodes() {
        let stored = serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "trainingjob-a-1b2c3", "namespace": "ml", "uid": "u",
                         "finalizers": ["kueue.x-k8s.io/resource-in-use"]},
            "spec": {"queueName": "team", "active": true, "priority": 0,
                     "podSets": [{"name": "engine", "count": 4, "minCount": 2,
                                  "template": {"spec": {"containers": [{"name": "sim-wse"}]}}}]},
            "status": {
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "engine", "count": 2, "flavors": {"weightstream.dev/cs2": "cs2"},
                     "resourceUsage": {"weightstream.dev/cs2": "2"}}]},
                "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok",
                                "lastTransitionTime": "2026-11-29T20:00:00Z", "observedGeneration": 1}],
                "requeueState": {"count": 1},
                "resourceRequests": [{"name": "engine", "resources": {"cpu": "1"}}]
            }
        });
        let w: Workload = serde_json::from_value(stored).unwrap();
        let sets = w.spec.pod_sets.unwrap_or_default();
        assert_eq!((sets[0].min_count, sets[0].template.spec.as_ref().map(|s| s.containers.len())), (Some(2), Some(1)));
        let a = w.status.unwrap().admission.unwrap();
        let engine = &a.pod_set_assignments.unwrap_or_default()[0];
        assert_eq!((a.cluster_queue.as_deref(), engine.count), (Some("cq"), Some(2)));
        assert_eq!(engine.flavors.as_ref().map(|f| f["weightstream.dev/cs2"].as_str()), Some("cs2"));
    }

    /// The generated files name the Kueue they came from; it is the one the e2e suite builds and installs.
    #[test]
    fn the_types_come_from_the_kueue_the_suite_pins() {
        let build = include_str!("../../../../e2e/kueue/build.sh");
        let pin = build.lines().find_map(|l| l.strip_prefix("KUEUE_VERSION=\"${WS_KUEUE_VERSION:-")).unwrap();
        let pin = pin.trim_end_matches("}\"");
        for (file, text) in [
            ("workloads.rs", include_str!("workloads.rs")),
            ("localqueues.rs", include_str!("localqueues.rs")),
            ("resourceflavors.rs", include_str!("resourceflavors.rs")),
        ] {
            assert!(
                text.contains(&format!("sigs.k8s.io/kueue@v{pin},")),
                "{file} is not generated from Kueue v{pin}: run bash operator/src/kueue/api/generate.sh"
            );
        }
    }
}
