//! The pipelined step's reply: an engine that holds the whole model runs a step in one call and answers with
//! its loss and, unless it applied them itself, its gradients, in one stream.

use super::grad::encode_grads;
use crate::protocol::LayerGrad;
use crate::protocol::pb::{LossReply, StepChunk};

/// A pipelined step's reply: the loss first, then the gradients (none when the stage applied them itself).
pub fn encode_step(loss: LossReply, grads: Vec<LayerGrad>) -> Vec<StepChunk> {
    std::iter::once(StepChunk { loss: Some(loss), grad: None })
        .chain(encode_grads(grads).into_iter().map(|g| StepChunk { loss: None, grad: Some(g) }))
        .collect()
}
