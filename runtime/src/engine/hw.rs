//! What an engine tells the hardware it runs on. The engine program never times itself against a wafer: it
//! reports every piece of work as a [`Work`] to an [`EngineHw`], which owns the SRAM budget and the counters, so
//! the same program runs on a simulator with a cost model (`sim-wse`) or on [`CountingHw`] in tests.

use serde::Serialize;

use kernels::sparse::SparsePattern;

/// A piece of work the engine did, reported to the hardware model.
#[derive(Clone, Copy, Debug)]
pub enum Work<'a> {
    /// Bytes arrived from SwarmX (weights or data).
    Received {
        /// How many.
        bytes: u64,
    },
    /// Bytes sent towards SwarmX (gradients, losses).
    Sent {
        /// How many.
        bytes: u64,
    },
    /// A dense `m × k` by `k × n` product.
    Gemm {
        /// Rows of the result.
        m: usize,
        /// Columns of the result.
        n: usize,
        /// The summed dimension.
        k: usize,
    },
    /// One AXPY over `tokens` per non-zero of `pattern`.
    SparseAxpy {
        /// The mask, so a cost model can see how the non-zeros spread over lines.
        pattern: &'a SparsePattern,
        /// Length of every AXPY.
        tokens: usize,
    },
    /// One dot product over `tokens` per non-zero of `pattern`.
    SparseDot {
        /// The mask.
        pattern: &'a SparsePattern,
        /// Length of every dot product.
        tokens: usize,
    },
    /// Element-wise work (activations, loss), `ops` floating-point operations.
    Elementwise {
        /// Floating-point operations.
        ops: u64,
    },
}

impl Work<'_> {
    /// Floating-point operations actually performed.
    pub fn flops(&self) -> u64 {
        match *self {
            Work::Gemm { m, n, k } => 2 * (m * n * k) as u64,
            Work::SparseAxpy { pattern, tokens } | Work::SparseDot { pattern, tokens } => {
                2 * (pattern.nnz() * tokens) as u64
            }
            Work::Elementwise { ops } => ops,
            Work::Received { .. } | Work::Sent { .. } => 0,
        }
    }

    /// Floating-point operations the same work would take with dense weights.
    pub fn dense_flops(&self) -> u64 {
        match *self {
            Work::SparseAxpy { pattern, tokens } | Work::SparseDot { pattern, tokens } => {
                2 * (pattern.outer() * pattern.inner() * tokens) as u64
            }
            other => other.flops(),
        }
    }
}

/// What an engine has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct EngineCounters {
    /// Bytes received (weights streamed in, plus data).
    pub bytes_received: u64,
    /// Bytes sent (gradients and loss reports).
    pub bytes_sent: u64,
    /// FLOPs the work would take with dense weights.
    pub dense_equivalent_flops: u64,
    /// FLOPs actually done: zeros are skipped.
    pub flops: u64,
    /// Seconds a real wafer would have taken, when the hardware model has a cost model (0 otherwise).
    pub simulated_s: f64,
}

impl EngineCounters {
    /// Adds one piece of work: the accounting every hardware model shares.
    pub fn count(&mut self, work: &Work<'_>) {
        match *work {
            Work::Received { bytes } => self.bytes_received += bytes,
            Work::Sent { bytes } => self.bytes_sent += bytes,
            _ => {
                self.flops += work.flops();
                self.dense_equivalent_flops += work.dense_flops();
            }
        }
    }
}

/// The hardware an engine runs on.
pub trait EngineHw: Send {
    /// On-chip memory for activations and streamed weights, in bytes.
    fn sram_bytes(&self) -> u64;
    /// Sees every piece of work, to count it and charge its time.
    fn record(&mut self, work: &Work<'_>);
    /// Totals so far.
    fn counters(&self) -> EngineCounters;
}

/// The simplest hardware: a budget and counters, no cost model. For tests and the runtime's own use.
#[derive(Clone, Debug)]
pub struct CountingHw {
    sram: u64,
    counters: EngineCounters,
}

impl CountingHw {
    /// An engine with `sram` bytes of memory.
    pub fn new(sram: u64) -> Self {
        CountingHw { sram, counters: EngineCounters::default() }
    }
}

impl EngineHw for CountingHw {
    fn sram_bytes(&self) -> u64 {
        self.sram
    }
    fn record(&mut self, work: &Work<'_>) {
        self.counters.count(work);
    }
    fn counters(&self) -> EngineCounters {
        self.counters
    }
}
