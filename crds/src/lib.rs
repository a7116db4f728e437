//! The weightstream API, `weightstream.dev/v1beta1` (`v1alpha1` still served): the [`TrainingJob`] a user declares and the status the
//! appliance reports. It depends on no other crate of ours, so the operator, the runtime and `wsctl` all parse
//! and validate jobs through exactly this code.

#![warn(missing_docs)]

pub mod conditions;
pub mod contract;
mod error;
mod execution;
pub mod pretrained;
mod reason_guide;
mod spec;
mod status;
pub mod testing;
mod validate;
pub mod version;

pub use error::ApiError;
pub use execution::ExecutionMode;
pub use spec::*;
pub use status::*;
pub use validate::{
    MAX_BATCH, MAX_EPOCHS, MAX_KEEP, MAX_SEED, MAX_SERVERS, MAX_SRAM_BYTES, MAX_STEPS, MAX_VOCAB, MAX_WIDTH,
};
pub use validate::{
    escapes, is_dns_label, is_dns_subdomain, is_quantity, parse_training_job, parse_training_job_with, quantity_bytes,
};

/// The CustomResourceDefinition, generated from the types: every version of [`version::ApiVersion`] served, the
/// current one stored. Everything that installs the API (the chart's copy, the tests' API servers) installs this.
pub fn crd()
-> Result<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition, ApiError> {
    use kube::CustomResourceExt;
    version::with_every_version(TrainingJob::crd())
}

/// [`crd`] as YAML, so the checked-in copy can be compared with it.
pub fn crd_yaml() -> Result<String, ApiError> {
    serde_yaml::to_string(&crd()?).map_err(|e| ApiError::Internal(e.to_string()))
}
