//! The wafer's cost model: how many cycles a real engine spends on each piece of work, following the seeds'
//! description of sparse GEMM on the WSE, and (in [`cluster`]) how a cluster of engines fed by MemoryX through
//! SwarmX turns that into step time.
//!
//! One product `Y = W·X` with `W` of `lines × features` (possibly masked) and `X` of `features × tokens`:
//! - activations are spread over the core mesh, features to rows and tokens to columns, so each core holds a
//!   few features of a few tokens;
//! - each non-zero weight arrives tagged with its feature index and is fanned out to the row holding that
//!   feature, where every core does one AXPY over its tokens (a multiply-add per token, its 4 units working
//!   through them back to back);
//! - when a line (output feature) is complete, every core spends the partial-sum step (4 cycles) handing its
//!   accumulator to the reduction thread: this is paid per line whatever the sparsity, which is Amdahl's law;
//! - features are sorted by their non-zero count and dealt round-robin to the rows; the slowest row sets the
//!   time of the whole product (the tail-worker effect), computed from the mask's actual counts.
//!
//! A dense product is the same mapping with every weight present, which makes it `FLOPs / (cores × FLOPs per
//! core per cycle)` cycles when the shape divides the mesh, plus the partial sums.

pub mod cluster;
pub mod sample;

use kernels::sparse::SparsePattern;
use runtime::engine::hw::Work;
use serde::Serialize;

use plan::preset::EngineModel;

pub use cluster::{Cluster, Estimate, LayerWork, Workload, estimate};

/// How one product's features and tokens sit on the mesh. Tokens take at most the mesh's columns; when there
/// are fewer tokens than columns the spare cores hold more features instead, so a small batch still uses the
/// wafer (as the compiler would lay it out) rather than leaving most of it idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Mapping {
    /// Rows the features are dealt over.
    pub rows: u64,
    /// Columns the tokens are spread over.
    pub cols: u64,
    /// Tokens each core holds: the length of every AXPY.
    pub tokens_per_core: u64,
}

impl Mapping {
    /// The layout of a product over `features` features and `tokens` tokens on `engine`.
    pub fn new(engine: &EngineModel, features: usize, tokens: usize) -> Self {
        let features = (features as u64).max(1);
        let tokens = (tokens as u64).max(1);
        let cores = engine.cores.max(1);
        let first_cols = tokens.min(engine.grid_cols).max(1);
        let rows = features.min(cores / first_cols).max(1);
        let cols = tokens.min(cores / rows).max(1);
        Mapping { rows, cols, tokens_per_core: tokens.div_ceil(cols) }
    }

    /// Cycles a core spends on `nonzeros` AXPYs (or dot products) over its tokens: its floating-point units
    /// work through the `nonzeros × tokens per core` multiply-adds back to back, so an AXPY shorter than the
    /// number of units does not leave the rest idle.
    pub fn axpy_cycles(&self, engine: &EngineModel, nonzeros: u64) -> u64 {
        (nonzeros * self.tokens_per_core).div_ceil(engine.fmas_per_core_cycle.max(1))
    }

    /// Cores the product occupies.
    pub fn cores(&self) -> u64 {
        self.rows * self.cols
    }
}

/// How features are assigned to physical rows, so the balancing the seeds describe can be compared with not
/// balancing at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dealing {
    /// Sorted by non-zero count, heaviest first, and dealt round-robin: the optimizer's layout.
    SortedRoundRobin,
    /// In index order, each row taking the next contiguous block: what a naive layout would do.
    Contiguous,
}

/// Non-zeros each row must absorb when the features with `counts` non-zeros are laid over `rows` rows.
pub fn row_loads(counts: &[u32], rows: usize, dealing: Dealing) -> Vec<u64> {
    let rows = rows.max(1);
    match dealing {
        Dealing::SortedRoundRobin => {
            let mut sorted = counts.to_vec();
            sort_heaviest_first(&mut sorted);
            deal_sorted(&sorted, rows)
        }
        Dealing::Contiguous => {
            let mut loads = vec![0u64; rows];
            let block = counts.len().div_ceil(rows).max(1);
            for (i, &c) in counts.iter().enumerate() {
                loads[i / block] += c as u64;
            }
            loads
        }
    }
}

/// Sorts counts heaviest first, the order [`SparsePattern`] stores its lines in.
pub fn sort_heaviest_first(counts: &mut [u32]) {
    counts.sort_unstable_by(|a, b| b.cmp(a));
}

/// Round-robin dealing of counts already sorted heaviest first.
fn deal_sorted(sorted: &[u32], rows: usize) -> Vec<u64> {
    let rows = rows.max(1);
    let mut loads = vec![0u64; rows];
    for (i, &c) in sorted.iter().enumerate() {
        loads[i % rows] += c as u64;
    }
    loads
}

/// Non-zeros per feature (inner index) of a mask: what each feature's row receives when the mask's product
/// runs on the wafer. A forward pattern is stored by output line, so its features are the inputs; for the
/// backward pattern they are the outputs. Either way they are the `line_counts()` of the transposed pattern.
pub fn feature_counts(pattern: &SparsePattern) -> Vec<u32> {
    let mut counts = vec![0u32; pattern.inner()];
    for &i in pattern.idx() {
        if let Some(c) = counts.get_mut(i as usize) {
            *c += 1;
        }
    }
    counts
}

/// Cycles of one product, split so reports can show where the time goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GemmCycles {
    /// AXPY cycles of the slowest row: the time the product's arithmetic takes.
    pub axpy: u64,
    /// AXPY cycles of the average row: what perfect balance would give, to measure the tail-worker effect.
    pub mean_axpy: f64,
    /// Partial-sum cycles, one step per line.
    pub partial_sums: u64,
}

impl GemmCycles {
    /// Cycles the product takes.
    pub fn total(&self) -> u64 {
        self.axpy + self.partial_sums
    }
}

/// A masked product: `lines` output lines, `counts_sorted` non-zeros per feature (heaviest first), over
/// `tokens` tokens.
pub fn sparse_gemm_sorted(engine: &EngineModel, lines: usize, counts_sorted: &[u32], tokens: usize) -> GemmCycles {
    let map = Mapping::new(engine, counts_sorted.len(), tokens);
    let loads = deal_sorted(counts_sorted, map.rows as usize);
    let max = loads.iter().copied().max().unwrap_or(0);
    let mean = loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64;
    GemmCycles {
        axpy: map.axpy_cycles(engine, max),
        mean_axpy: mean * map.tokens_per_core as f64 / engine.fmas_per_core_cycle.max(1) as f64,
        partial_sums: lines as u64 * engine.partial_sum_cycles,
    }
}

/// A masked product whose features hold `counts` non-zeros, in any order.
pub fn sparse_gemm(engine: &EngineModel, lines: usize, counts: &[u32], tokens: usize) -> GemmCycles {
    let mut sorted = counts.to_vec();
    sort_heaviest_first(&mut sorted);
    sparse_gemm_sorted(engine, lines, &sorted, tokens)
}

/// A dense `m × k` by `k × n` product: `m` lines, `k` features, `n` tokens, every weight present.
pub fn dense_gemm(engine: &EngineModel, m: usize, n: usize, k: usize) -> GemmCycles {
    let map = Mapping::new(engine, k, n);
    let per_row = (k as u64).div_ceil(map.rows) * m as u64;
    GemmCycles {
        axpy: map.axpy_cycles(engine, per_row),
        mean_axpy: (k as u64 * m as u64) as f64 / map.rows as f64 * map.tokens_per_core as f64
            / engine.fmas_per_core_cycle.max(1) as f64,
        partial_sums: m as u64 * engine.partial_sum_cycles,
    }
}

/// Element-wise work spread over the whole wafer: each floating-point unit does one operation per cycle.
pub fn elementwise_cycles(engine: &EngineModel, ops: u64) -> u64 {
    ops.div_ceil((engine.cores * engine.fmas_per_core_cycle).max(1))
}

/// Cycles the engine computes for one piece of work; transfers cost no compute cycles (their time is the
/// stream's, see [`cluster`]).
pub fn work_cycles(engine: &EngineModel, work: &Work<'_>) -> u64 {
    match *work {
        Work::Gemm { m, n, k } => dense_gemm(engine, m, n, k).total(),
        Work::SparseAxpy { pattern, tokens } | Work::SparseDot { pattern, tokens } => {
            sparse_gemm(engine, pattern.outer(), &feature_counts(pattern), tokens).total()
        }
        Work::Elementwise { ops } => elementwise_cycles(engine, ops),
        Work::Received { .. } | Work::Sent { .. } => 0,
    }
}

#[cfg(test)]
mod tests;
