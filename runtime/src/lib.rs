//! The math and the roles of weight streaming.
//!
//! - [`kernels`]: dense GEMM (through a kept crate) and the sparse AXPY/SDDMM kernels, with references.
//! - [`model`]: the layers and the model layout, one stream unit per weight layer.
//! - [`memoryx`]: the weight and optimizer store that streams layers and applies gradients.
//! - [`swarmx`]: the fabric that broadcasts layers to engines and sums their gradients.
//! - [`engine`]: what an engine does with streamed layers, against a small hardware trait.
//! - [`driver`]: one job from checkpoint to summary, for MemoryX's program and in-process runs alike.
//! - [`train`]: the loop that drives the three; [`plan`]: what a job needs before it runs; [`sample`]: text
//!   decoded from a trained language model.
//! - [`protocol`]: the messages between roles; [`data`]: data sets, batching and sharding.

pub mod data;
pub mod driver;
pub mod engine;
pub mod error;
pub mod https;
pub mod identity;
pub mod input;
pub mod kernels;
pub mod memoryx;
pub mod model;
pub mod optim;
pub mod plan;
pub mod protocol;
pub mod sample;
pub mod swarmx;
pub mod tensor;
pub mod tiles;
pub mod transport;
pub mod train;
pub mod units;

pub use error::{Error, Result};
