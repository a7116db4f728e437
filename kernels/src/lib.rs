//! The engine's arithmetic. Dense GEMM goes through the `gemm` crate; the sparse kernels are ours, because
//! skipping zeros is the product. Each kernel has a plain reference implementation in [`reference`] that the
//! tests compare against. [`tensor`] holds the row-major matrices every kernel reads and writes, and [`tiles`]
//! the layout the sparse kernels keep activations in (lanes of [`tiles::TILE`] tokens per feature).
#![warn(missing_docs)]

pub mod dense;
pub mod reference;
pub mod small;
pub mod sparse;
pub mod tensor;
pub mod tiles;

/// Above this many multiply-adds a GEMM is split over threads; below it the fork/join costs more than it saves.
pub(crate) const PARALLEL_MIN_FLOPS: usize = 1 << 18;

/// Runs `f` on one of rayon's worker threads and returns what it returns: how an engine runs a pass or a step.
///
/// Every stage of a step forks over the cores (each GEMM, the attention heads, every norm and element-wise
/// pass). Forked from a thread outside the pool, a stage hands its work to the pool and puts the caller to sleep
/// until it is done: a wake-up and two context switches per stage, hundreds a gpt-small step. Forked from a
/// worker, it is a join whose other half the second worker steals. (A 40-step gpt-small run: 31,900 context
/// switches before, 9,200 after, and the step about 3% faster.)
///
/// Two rules for `f`, because a worker waiting at a join may run another caller's whole `f` meanwhile, and a
/// worker that blocks is a core the pool cannot use. It must not wait for a lock, channel or thread that another
/// thread can hold up (take such locks first, then call this; the locks of state only `f`'s caller can reach
/// are fine). And it must not hold, across a parallel stage, anything another caller's `f` may want on the same
/// thread (the sparse kernels' thread-local buffers are taken out for a call, not borrowed).
pub fn on_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    // `scope` runs its body on a worker of the global pool (the calling thread waits once, for all of it).
    rayon::scope(|_| f())
}
