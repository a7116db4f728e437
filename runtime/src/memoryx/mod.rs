//! MemoryX: the store that owns every weight and all optimizer state. It streams each layer to the engines
//! (forward, then again backward), receives the summed gradients and runs the optimizer. The engines never hold
//! the model; MemoryX never computes activations. The state can be spread over weight servers, each owning a
//! slice of every layer and keeping what does not fit its memory on disk.
//!
//! - [`store`]: [`store::MemoryX`], the coordinator's view, and the [`store::WeightStore`] trait the training loop drives.
//! - [`weight_server`]: a weight server ([`weight_server::WeightServer`]) and the one in this process
//!   ([`weight_server::LocalSlice`]).
//! - [`slice`]: which part of every layer a server owns ([`slice::SliceId`]), and the tensors it keeps of it.
//! - [`tier`]: a server's disk tier, read ahead in stream order.
//! - [`remote`] and [`grpc_service`]: a weight server on the network, and the gRPC service it answers with.
//! - `tied`: a tied layer's gradient, held until its target layer's arrives.
//! - [`checkpoint`]: the tensors' names and the checkpoint files they are written to; [`manifest`]: the
//!   checkpoints of a state spread over several servers, a slice each and a manifest written last.
//! - The MemoryX program (weight servers and the coordinator, server 0) is [`crate::coordinator::program`].
//! - [`checkpoint_routes`]: its checkpoints over HTTPS, for the user to take home.

pub mod checkpoint;
pub mod checkpoint_routes;
pub mod grpc_service;
pub mod huggingface;
pub mod manifest;
pub mod remote;
pub mod slice;
pub mod store;
mod tied;
pub mod tier;
pub mod weight_server;
