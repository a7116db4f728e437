//! The plan: one function from a job to its appliance, computed once for everyone who needs it — the
//! operator (which pods, which arguments), `wsctl run` (which processes), `wsctl plan` (what a job gets) and
//! every role (what it may be asked to hold).
//!
//! - [`layout`]: the model as stream units, from the spec alone.
//! - [`preset`]: the figures of each engine generation (SRAM among them).
//! - [`program`]: the model program, the graph of operations a captured PyTorch module becomes.
//! - [`appliance`]: the [`appliance::Plan`] — execution mode, SRAM peak, MemoryX, the SwarmX tree, input workers.
//! - [`memoryx`]: MemoryX's weight servers and tiers, and the cut of a layer into their slices.
//! - [`limits`]: what any message or file of the job may make a role allocate.
//! - [`wiring`]: who dials whom, and each role's arguments, for any site (pods or local processes).
#![warn(missing_docs)]

pub mod appliance;
pub mod layout;
pub mod limits;
pub mod memoryx;
pub mod preset;
pub mod program;
pub mod wiring;
