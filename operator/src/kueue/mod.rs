//! Kueue integration, as Kueue's job framework does it for its own job kinds: a TrainingJob labelled
//! `kueue.x-k8s.io/queue-name` waits as a `Workload` the operator creates, runs when Kueue admits it (on the
//! CS-2s and flavors admitted), checkpoints and requeues when Kueue evicts it, and finishes it at the end. The
//! operator's own queue then leaves the job alone.

pub mod api;
pub mod cluster;
pub mod seen;
pub mod workload;
