//! The math and the roles of weight streaming. Below it: `crds` (the API), `plan` (the appliance a job gets),
//! `data` (what a job trains on),
//! `wire` (identity, gRPC, errors, the program scaffold) and `kernels` (the arithmetic).
//!
//! - [`model`]: the layers (linear, activations, norms, attention, loss) over the kernels.
//! - [`optim`]: the optimizers and the learning-rate schedule (the data, its sampler and batch shards are the
//!   `data` crate's).
//! - [`protocol`]: the messages between roles and one codec per message kind.
//! - The roles, each a room of its own with its service, client and program: [`input`] (input workers),
//!   [`engine`] (what an engine does with streamed layers, against a small hardware trait), [`swarmx`] (the
//!   fabric that broadcasts layers and sums gradients) and [`memoryx`] (the store that streams layers and
//!   applies gradients, over weight servers; its program is the coordinator's, below).
//! - [`coordinator`]: MemoryX's server 0, which drives the job: the step loop, the one job driver (for
//!   MemoryX's program and in-process runs alike), decoding samples, and the MemoryX program; [`process`]: the
//!   process's memory and allocator; [`tensorboard`]: TensorBoard's event files.
#![warn(missing_docs)]

pub mod coordinator;
pub mod engine;
pub mod input;
pub mod memoryx;
pub mod model;
pub mod optim;
pub mod process;
pub mod protocol;
pub mod swarmx;
pub mod tensorboard;
