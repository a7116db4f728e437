//! The messages that cross role boundaries: what MemoryX streams, what engines send back. In one process they
//! are passed by reference; over the network [`codec`] cuts exactly these into chunks of the gRPC protocol in
//! `proto/weightstream/v1alpha1/stage.proto`, so both count the same bytes. (How a message travels — TLS,
//! deadlines, errors as statuses — is the `wire` crate's.)
//!
//! - [`reduce`]: summing engines' gradients, the reduction SwarmX performs.
//! - [`codec`]: the chunked codecs of every message.
//! - [`zero_copy`]: layer streams sent from the chunks' own buffers.
//! - [`direct`] (over [`frames`]): a stage's layer calls read from HTTP/2's frames, gradients answered from their
//!   own buffers.

pub mod codec;
pub mod direct;
mod frames;
pub mod reduce;
pub mod zero_copy;

/// The generated gRPC messages and `Stage` service.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("weightstream.v1alpha1");
}

/// Serves a `Stage` service (an engine, a SwarmX node) on an already bound listener until the process ends, over
/// the job's mutual TLS ([`wire::grpc::serve`]); each message is a chunk of at most 1 MiB.
pub async fn serve_stage<S: pb::stage_server::Stage>(
    service: Arc<S>,
    listener: tokio::net::TcpListener,
    identity: &wire::identity::Identity,
) -> errors::Result<()> {
    wire::grpc::serve(stage_server(service), listener, identity).await
}

/// [`serve_stage`] for a stage whose layer calls read their chunks from HTTP/2's frames and answer from their own
/// buffers ([`direct::DirectStage`]): an engine.
pub async fn serve_layer_stage<S: direct::LayerCalls>(
    service: Arc<S>,
    listener: tokio::net::TcpListener,
    identity: &wire::identity::Identity,
) -> errors::Result<()> {
    let direct = direct::DirectStage::new(service.clone(), stage_server(service), STAGE_MESSAGE_BYTES);
    wire::grpc::serve(direct, listener, identity).await
}

/// The largest message a `Stage` service takes or sends: a chunk of at most 1 MiB, with room to spare.
pub const STAGE_MESSAGE_BYTES: usize = 8 << 20;

/// The `Stage` service of `service` for the network: each message a chunk of at most 1 MiB.
pub fn stage_server<S: pb::stage_server::Stage>(service: Arc<S>) -> pb::stage_server::StageServer<S> {
    pb::stage_server::StageServer::from_arc(service)
        .max_decoding_message_size(STAGE_MESSAGE_BYTES)
        .max_encoding_message_size(STAGE_MESSAGE_BYTES)
}

use std::sync::Arc;

use crate::model::linear::Weights;
use kernels::sparse::SparsePattern;

/// Which pass a stream feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Layers 1..L, to compute activations.
    Forward,
    /// Layers L..1, to compute deltas and weight gradients.
    Backward,
}

/// A layer's weights as they travel.
#[derive(Clone, Debug)]
pub enum WeightPayload {
    /// Every value, row-major `outputs × inputs`.
    Dense(Vec<f32>),
    /// Non-zero values tagged by the pattern's indices (by output row forward, by input column backward).
    Sparse {
        /// Where the non-zeros sit; static for the whole run.
        pattern: Arc<SparsePattern>,
        /// The current values, in the pattern's order.
        values: Vec<f32>,
    },
    /// The mask alone: all the first layer's backward pass needs, since it computes weight gradients but no
    /// deltas, and a weight gradient needs to know only where weights exist.
    Mask(Arc<SparsePattern>),
    /// Nothing: the first dense layer's backward pass needs no weights at all.
    Nothing,
}

impl WeightPayload {
    /// The weights as the layer math takes them, when the payload carries values.
    pub fn weights(&self) -> Option<Weights<'_>> {
        match self {
            WeightPayload::Dense(v) => Some(Weights::Dense(v)),
            WeightPayload::Sparse { pattern, values } => Some(Weights::Sparse { pattern, values }),
            WeightPayload::Mask(_) | WeightPayload::Nothing => None,
        }
    }

    /// The mask, when the payload is sparse.
    pub fn pattern(&self) -> Option<&SparsePattern> {
        match self {
            WeightPayload::Sparse { pattern, .. } | WeightPayload::Mask(pattern) => Some(pattern),
            _ => None,
        }
    }

    /// The values' buffer, for reuse once the layer is computed (empty when the payload has none).
    pub fn into_values(self) -> Vec<f32> {
        match self {
            WeightPayload::Dense(v) | WeightPayload::Sparse { values: v, .. } => v,
            WeightPayload::Mask(_) | WeightPayload::Nothing => Vec::new(),
        }
    }

    /// Bytes on the wire: 4 per value plus the pattern's indices.
    pub fn wire_bytes(&self) -> u64 {
        match self {
            WeightPayload::Dense(v) => 4 * v.len() as u64,
            WeightPayload::Sparse { pattern, values } => pattern.wire_bytes() + 4 * values.len() as u64,
            WeightPayload::Mask(pattern) => pattern.wire_bytes(),
            WeightPayload::Nothing => 0,
        }
    }
}

/// One layer streamed from MemoryX to the engines.
#[derive(Clone, Debug)]
pub struct LayerStream {
    /// Index of the weight layer, 0-based in forward order.
    pub layer: usize,
    /// The pass it feeds.
    pub pass: Pass,
    /// The weights.
    pub weights: WeightPayload,
    /// The bias (forward only; the backward pass does not need it).
    pub bias: Vec<f32>,
}

impl LayerStream {
    /// Bytes this stream puts on the wire.
    pub fn wire_bytes(&self) -> u64 {
        self.weights.wire_bytes() + 4 * self.bias.len() as u64
    }
}

/// A layer's gradients, from the engines back to MemoryX, summed over engines by SwarmX.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerGrad {
    /// Index of the weight layer.
    pub layer: usize,
    /// Weight gradients in the order of the backward stream's weights (row-major for dense layers, the
    /// backward pattern's order for sparse ones).
    pub weights: Vec<f32>,
    /// Bias gradients.
    pub bias: Vec<f32>,
}

impl LayerGrad {
    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        4 * (self.weights.len() + self.bias.len()) as u64
    }
}

/// A loss report as it crosses the wire: the same three sums.
impl From<crate::model::loss::LossSum> for pb::LossReply {
    fn from(s: crate::model::loss::LossSum) -> Self {
        pb::LossReply { loss: s.loss, correct: s.correct, samples: s.samples }
    }
}

/// A loss report back from the wire.
impl From<pb::LossReply> for crate::model::loss::LossSum {
    fn from(r: pb::LossReply) -> Self {
        crate::model::loss::LossSum { loss: r.loss, correct: r.correct, samples: r.samples }
    }
}
