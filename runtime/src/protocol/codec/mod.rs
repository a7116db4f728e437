//! Layer streams and gradients on the wire: cut into chunks of at most 1 MiB and put back together with every
//! length and index checked, so a truncated stream, a wrong shape or a bad index is refused before it reaches a
//! kernel or MemoryX's state. Every kind has a meter (`LayerMeter`, `GradMeter`, `StateMeter`) that checks each
//! chunk against the plan's [`plan::limits::Limits`] before the chunk is kept, used by the decoders and by every
//! stage that only relays chunks, so no stream can make a stage hold more than the job's model.
//!
//! One codec per message kind — `layer` (what MemoryX streams), `grad` (what engines send back), `state` (a
//! pipelined replica), `step` (a pipelined step's reply) — over the chunking helpers of `chunk`, which they all
//! share, and `uncached`, the copy of a large layer's words around the cache.

pub mod chunk;
pub mod grad;
pub mod layer;
pub mod state;
pub mod step;
mod uncached;
