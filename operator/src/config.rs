//! How an operator process runs: its flags and environment, or what a test sets.

use std::time::Duration;

use crate::DEFAULT_RUNTIME_IMAGE;
use crate::children::settings::OperatorPeer;

/// How the operator runs; flags and environment of the binary, or set directly by tests.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (and count only its jobs against the pool); all namespaces when unset.
    pub namespace: Option<String>,
    /// CS-2s in the pool when no node advertises `weightstream.dev/cs2`.
    pub pool: Option<u32>,
    /// The data-plane image when a job names none.
    pub default_image: String,
    /// Children per SwarmX node.
    pub fan_out: u32,
    /// How often a live job is reconciled (and MemoryX polled) without any change to trigger it.
    pub poll: Duration,
    /// The operator's own pods (namespace and labels), admitted by every job's NetworkPolicy.
    pub operator: OperatorPeer,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            pool: None,
            default_image: DEFAULT_RUNTIME_IMAGE.into(),
            fan_out: crds::contract::DEFAULT_FAN_OUT,
            poll: Duration::from_secs(3),
            operator: OperatorPeer::default(),
        }
    }
}
