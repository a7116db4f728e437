//! The checked-in CRD must be exactly what the types generate; run with `WS_UPDATE_CRD=1` to rewrite it (and
//! the Helm chart's copy, which `e2e/tests/chart.rs` holds to the same text).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::Path;

#[test]
fn checked_in_crd_matches_the_types() {
    let generated = crds::crd_yaml().expect("the CRD serialises");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("trainingjob.yaml");
    let header = "# Generated from crds/src by `WS_UPDATE_CRD=1 cargo test --release -p crds`; do not edit.\n";
    let want = format!("{header}{generated}");
    if std::env::var_os("WS_UPDATE_CRD").is_some() {
        std::fs::write(&path, &want).expect("write the CRD");
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/weightstream/crds/trainingjob.yaml");
        std::fs::write(chart, &want).expect("write the chart's copy of the CRD");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "crds/trainingjob.yaml is out of date with the API types: run `WS_UPDATE_CRD=1 cargo test --release -p crds` \
         and commit the result"
    );
}

#[test]
fn crd_names_the_api() {
    let yaml = crds::crd_yaml().expect("the CRD serialises");
    for needle in ["group: weightstream.dev", "kind: TrainingJob", "- tj", "name: v1beta1", "status: {}"] {
        assert!(yaml.contains(needle), "missing `{needle}` in\n{yaml}");
    }
}

#[test]
fn crd_carries_the_cross_field_rules_and_the_status_schema() {
    let yaml = crds::crd_yaml().expect("the CRD serialises");
    for rule in [
        "self.training.batchSize % self.cs2 == 0",
        "has(self.steps) != has(self.epochs)",
        "self == oldSelf",
        "size(self.metadata.name) <= 40",
        "self.schedule.minLearningRate <= self.optimizer.learningRate",
    ] {
        assert!(yaml.contains(rule), "missing CEL rule `{rule}`");
    }
    for field in
        ["allocatedCs2:", "conditions:", "lastCheckpoint:", "simulatedStepSeconds:", "completionTime:", "plan:"]
    {
        assert!(yaml.contains(field), "status lacks `{field}`");
    }
}
