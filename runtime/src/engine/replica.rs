//! An engine that keeps the whole model (pipelined execution): the replica it holds, one step on it, and the
//! update of it. The engine's gRPC service and the in-process fabric both run replicas through here.

use std::sync::Arc;

use errors::{Error, Result};
use kernels::on_workers;

use super::role::EngineRole;
use crate::memoryx::store::MemoryX;
use crate::model::loss::LossSum;
use crate::protocol::{LayerGrad, Pass};

/// Builds an empty replica of the job's model (the masks and shapes; the values come with `Prime`). A replica
/// is one weight server in this process's memory: its steps run on [`on_workers`], which must not wait on other
/// servers' threads or calls.
/// Fallible, since an engine learns the run's length (the optimizer's schedule) from its input workers.
pub type ReplicaFactory = Arc<dyn Fn() -> Result<MemoryX> + Send + Sync>;

/// One training step on a replica the engine holds: the streaming loop's order — forward, loss, backward in
/// reverse — with every layer read from the engine's own memory instead of the fabric. Runs on
/// [`on_workers`]: the caller holds whatever locks guard the engine and the replica.
pub fn resident_pass(engine: &mut dyn EngineRole, store: &MemoryX, layers: usize) -> Result<(LossSum, Vec<LayerGrad>)> {
    on_workers(|| {
        for l in 0..layers {
            store.with_stream(l, Pass::Forward, |s| engine.forward(s))?;
        }
        let loss = engine.loss()?;
        let grads = (0..layers)
            .rev()
            .map(|l| store.with_stream(l, Pass::Backward, |s| engine.backward(s)))
            .collect::<Result<Vec<_>>>()?;
        Ok((loss, grads))
    })
}

/// Applies a step's summed gradients to a replica, in the order the streaming loop applies them. Runs on
/// [`on_workers`] like [`resident_pass`].
pub fn apply_all(store: &MemoryX, grads: &[LayerGrad], step: u64) -> Result<()> {
    if store.step() != step {
        return Err(Error::Protocol(format!("gradients of step {step} reached a replica of step {}", store.step())));
    }
    on_workers(|| store.apply_step(grads, step))
}
