//! The weightstream API, `weightstream.dev/v1alpha1`: the [`TrainingJob`] a user declares and the status the
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

/// The CustomResourceDefinition as YAML, generated from the types so the checked-in copy can be compared with it.
pub fn crd_yaml() -> Result<String, ApiError> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&TrainingJob::crd()).map_err(|e| ApiError::Internal(e.to_string()))
}
