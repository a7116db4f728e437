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
    /// Whether a waiting job may take the CS-2s of running jobs of a lower PriorityClass.
    pub preemption: Preemption,
}

/// Whether the operator's queue preempts (`--preemption`, the chart's `operator.preemption`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Preemption {
    /// Running jobs keep their CS-2s; a higher-priority job only goes first in the queue.
    #[default]
    Never,
    /// A waiting job that fits the pool but not what is free takes the CS-2s of running jobs of a lower
    /// PriorityClass value, which checkpoint, give them back and wait ([`crate::admission::preempted_by`]).
    Allowed,
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
            preemption: Preemption::Never,
        }
    }
}
