//! One step's layers streamed from MemoryX through the fabric: every layer forward, then backward, each summed
//! gradient staged on MemoryX as it arrives. The coordinator streams this way through the SwarmX root; a SwarmX
//! root that streams straight from the weight servers ([`super::streamer`]) the same way through its children.
//! The next layer is always being fetched while the engines compute the current one, and never more than that.

use std::sync::mpsc;

use super::{StepRequest, Swarm};
use crate::memoryx::store::WeightStore;
use crate::model::loss::LossSum;
use crate::protocol::LayerStream;
use errors::{Error, Result};

/// Streams one pass's layers in the given order on a helper thread, one ahead of the consumer: the
/// rendezvous channel means MemoryX prepares layer `l + 1` while the engines compute layer `l`, and no more.
fn with_prefetch<T>(
    store: &dyn WeightStore,
    order: Vec<(usize, bool)>,
    consume: impl FnOnce(&mut dyn FnMut() -> Result<LayerStream>) -> Result<T>,
) -> Result<T> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<Result<LayerStream>>(0);
        scope.spawn(move || {
            for (layer, forward) in order {
                let stream = if forward { store.forward_stream(layer) } else { store.backward_stream(layer) };
                let failed = stream.is_err();
                if tx.send(stream).is_err() || failed {
                    return;
                }
            }
        });
        let mut next = || rx.recv().map_err(|_| Error::Protocol("MemoryX stopped streaming mid-step".into()))?;
        consume(&mut next)
    })
}

/// Begins training step `request` on the engines and streams its `layers` layers forward and back, staging
/// each layer's summed gradient on `store` as it arrives (the caller commits the step). Returns the loss summed
/// over the engines and the bytes moved between MemoryX and the fabric.
pub fn train_passes(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    layers: usize,
    request: &StepRequest,
) -> Result<(LossSum, u64)> {
    let step = request.step;
    swarm.begin_step(request)?;
    let order = (0..layers).map(|l| (l, true)).chain((0..layers).rev().map(|l| (l, false))).collect();
    let (loss, grads, bytes) = with_prefetch(store, order, |next| {
        let mut bytes = 0;
        let mut counted = || {
            let s = next()?;
            bytes += s.wire_bytes();
            Ok(s)
        };
        let loss = swarm.forward_pass(layers, &mut counted)?;
        let (mut grads, mut grad_bytes) = (0, 0);
        swarm.backward_pass_into(layers, &mut counted, &mut |g| {
            grads += 1;
            grad_bytes += g.wire_bytes();
            store.stage(g, step)
        })?;
        Ok((loss, grads, bytes + grad_bytes))
    })?;
    if grads != layers {
        return Err(Error::Protocol(format!("{grads} layer gradients returned for {layers} layers")));
    }
    Ok((loss, bytes))
}

/// Begins the held-out batch `request` on the engines and streams its `layers` layers forward: the loss summed
/// over the engines.
pub fn eval_pass(
    store: &dyn WeightStore,
    swarm: &mut dyn Swarm,
    layers: usize,
    request: &StepRequest,
) -> Result<LossSum> {
    swarm.begin_step(request)?;
    let order = (0..layers).map(|l| (l, true)).collect();
    with_prefetch(store, order, |next| swarm.forward_pass(layers, next))
}
