//! Test support shared by every crate's tests: one small, valid job, written once. Tests start from it and
//! change what they are about (`str::replace` on the YAML to break one rule, or a field of the parsed job), so
//! no test carries a copy of a whole manifest. It is plain code rather than a feature-gated module: a few lines,
//! and every crate's tests see the same fixture.

use crate::TrainingJob;

/// A small valid job as YAML: 2 CS-2s training a 784-32-10 MLP at 50% sparsity on the shipped MNIST digits
/// (`examples/data/mnist`, relative to the repository), 64 samples a step for 30 Adam steps.
pub const MLP_YAML: &str = include_str!("../fixtures/mlp-job.yaml");

/// [`MLP_YAML`] parsed, named `name` in `namespace` (with a uid, as the API server would give it, so owner
/// references can be built) and sized to `cs2` CS-2s (a divisor of 64), on the scaled-down `tiny` engine so a
/// plan for it is quick and fits.
pub fn mlp_job(name: &str, namespace: &str, cs2: u32) -> TrainingJob {
    let mut job = match crate::parse_training_job(MLP_YAML) {
        Ok(j) => j,
        Err(e) => panic!("the shared test job must be valid: {e}"),
    };
    job.metadata.name = Some(name.into());
    job.metadata.namespace = Some(namespace.into());
    job.metadata.uid = Some(format!("uid-{namespace}-{name}"));
    job.spec.cs2 = cs2;
    job.spec.engine.preset = crate::EnginePreset::Tiny;
    if let Err(e) = job.spec.validate() {
        panic!("the shared test job at {cs2} CS-2s must be valid: {e}");
    }
    job
}
