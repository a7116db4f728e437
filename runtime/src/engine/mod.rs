//! The engine side of a step: what a WSE does with the layers streamed to it. It keeps its shard's
//! activations resident from the forward pass to the backward pass, holds one layer's weights at a time (plus
//! room for the next, prefetched), and sends back weight gradients.
//!
//! The hardware it runs on is a small trait, [`hw::EngineHw`]: an SRAM budget and a hook that sees every piece of
//! work, so a simulator can count bytes and FLOPs and charge time. `sim-wse` implements it; the tests here use
//! [`hw::CountingHw`]. [`server`] puts an engine on the network.
//!
//! - `hw`: the work an engine reports and the hardware trait that counts it.
//! - `role`: [`role::EngineRole`], what SwarmX drives (with a [`data::shard::Shard`] of the batch), and the
//!   [`role::EngineStats`] it reads.
//! - `wse`: [`wse::Wse`], the engine program every model family shares.
//! - `linear`: a weight layer over its streamed weights, the one place a kernel is chosen.
//! - `mlp`, `gpt`, `llama`: the model families' layers; `program`: a model program's stages.

mod gpt;
pub mod hw;
mod linear;
mod llama;
mod mlp;
mod net;
pub mod program;
pub mod replica;
pub mod role;
pub mod server;
pub mod wse;
