//! The coordinator: MemoryX's weight server 0, which drives the job. It sits above every role it drives, so
//! the roles' rooms never import it.
//!
//! - [`driver`]: ONE job driver — resume, train, checkpoint, evaluate, sample, summary — run by the MemoryX
//!   program and by `wsctl run --in-process` alike.
//! - [`train`]: the step loop over a [`crate::swarmx::Swarm`] (streaming or pipelined, one retry policy).
//! - [`records`]: what a run records step by step: `metrics.jsonl` and TensorBoard event files;
//!   [`run_routes`]: those records over MemoryX's HTTPS (`GET /run`).
//! - [`sample`]: text decoded from a trained language model.
//! - [`program`]: the MemoryX program: the coordinator, or (with `--server-index` above 0) a weight server
//!   serving its slice.

pub mod driver;
pub mod program;
pub mod records;
pub mod run_routes;
pub mod sample;
pub mod train;
