//! The engine's arithmetic. Dense GEMM goes through the `gemm` crate; the sparse kernels are ours, because
//! skipping zeros is the product. Each kernel has a plain reference implementation in [`reference`] that the
//! tests compare against.

pub mod dense;
pub mod reference;
pub mod small;
pub mod sparse;

/// Above this many multiply-adds a GEMM is split over threads; below it the fork/join costs more than it saves.
pub(crate) const PARALLEL_MIN_FLOPS: usize = 1 << 18;
