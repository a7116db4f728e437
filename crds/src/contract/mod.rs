//! The contract between the control plane (the operator, `wsctl`) and the data plane (the role programs):
//! which roles exist, each program's arguments, the ports they serve, the readiness and progress handshake a
//! local supervisor reads, the SwarmX tree, and what MemoryX reports on `GET /status`.
//!
//! Both sides compile against these types: the programs parse their command lines with the parsers defined
//! here, and the operator and the local runner render argv from the same structs, so a renamed flag is a
//! compile error or a failing round-trip test, never a pod that crashes at run time.

mod args;
pub mod exit;
mod handshake;
pub mod postmortem;
mod role;
mod status;
mod tree;

pub use args::{CommonArgs, EngineArgs, InputArgs, MemoryxArgs, RoleArgs, SwarmxArgs};
pub use handshake::{Handshake, ProgressReport};
pub use role::{
    DATA_MOUNT, HTTP_PORT, JOB_LABEL, JOB_UID_LABEL, METRICS_SCRAPER_LABEL, PULL_POLICY_ANNOTATION, ROLE_LABEL,
    RUN_FOLDER, RUNTIME_IMAGE_ANNOTATION, Role, input_workers_of,
};
pub use status::{MemoryxPhase, MemoryxStatus};
pub use tree::{DEFAULT_FAN_OUT, SwarmxChild, SwarmxNode, SwarmxTree};
