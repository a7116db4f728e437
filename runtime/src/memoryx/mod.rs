//! MemoryX: the store that owns every weight and all optimizer state. It streams each layer to the engines
//! (forward, then again backward), receives the summed gradients and runs the optimizer. The engines never hold
//! the model; MemoryX never computes activations.
//!
//! - `store`: [`MemoryX`] and the [`WeightStore`] trait the training loop drives it through.
//! - `tied`: a tied layer's gradient, held until its target layer's arrives.
//! - [`checkpoint`]: the tensors' names and the checkpoint files they are written to.
//! - [`node`]: the MemoryX program, which also coordinates the job.
//! - [`serve`]: its checkpoints over HTTPS, for the user to take home.

pub mod checkpoint;
pub mod node;
pub mod serve;
mod store;
mod tied;

pub use checkpoint::Tensors;
pub use store::{mask, MemoryX, WeightStore};
