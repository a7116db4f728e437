//! The engines a CS-2 can carry, with the figures the seeds give for them, and the cluster around them. Every
//! number about the hardware lives here and nowhere else, so the cost model and the reports cannot disagree
//! about what a wafer is.

use crds::EnginePreset;
use serde::Serialize;

/// The figures of one engine generation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EngineModel {
    /// Name as users write it in `spec.engine.preset`.
    pub name: &'static str,
    /// Independently programmable cores.
    pub cores: u64,
    /// On-chip SRAM in bytes.
    pub sram_bytes: u64,
    /// Aggregate SRAM bandwidth in bytes per second.
    pub memory_bandwidth: f64,
    /// Aggregate fabric bandwidth in bytes per second.
    pub fabric_bandwidth: f64,
    /// Dense peak in FLOP/s.
    pub dense_flops: f64,
    /// Rows of the core mesh: the sparse GEMM spreads features over them, so their number decides how many
    /// lines of the mask each row must absorb and how hard the tail-worker effect can bite.
    pub grid_rows: u64,
    /// Columns of the core mesh: tokens spread over them, so their number decides how long each AXPY is.
    pub grid_cols: u64,
    /// Fused multiply-adds a core starts per cycle (its floating-point units), which sets how long one
    /// AXPY over a core's tokens takes.
    pub fmas_per_core_cycle: u64,
    /// Core clock in Hz, the unit every cycle count is turned into seconds with.
    pub clock_hz: f64,
    /// Cycles a core spends when an output feature completes (copy the sum, reset the accumulator, a
    /// double-wide add on the partial-sum chain): the part of the work sparsity cannot remove.
    pub partial_sum_cycles: u64,
}

impl EngineModel {
    /// FLOPs one core does per cycle (a multiply-add counts two), so dense work converts to cycles the way the
    /// seeds' peak figure does.
    pub const fn flops_per_core_cycle(&self) -> u64 {
        2 * self.fmas_per_core_cycle
    }
}

const GB: u64 = 1_000_000_000;

/// WSE-2 floating-point units per core: 3.4 million units over 850,000 cores.
const WSE2_FMAS_PER_CORE: u64 = 3_400_000 / 850_000;

/// The clock that makes `cores × 2·fmas × clock` equal the dense peak: the seeds give the peak and the units,
/// not the clock.
const fn clock(dense_flops: f64, cores: u64, fmas: u64) -> f64 {
    dense_flops / (cores as f64 * 2.0 * fmas as f64)
}

/// Cycles of the partial-sum step: 1 to copy the sum to the reduction thread, 1 to zero the accumulator, 2 for
/// the double-wide add on the chain.
const PARTIAL_SUM_CYCLES: u64 = 1 + 1 + 2;

/// WSE-2 (CS-2): 850,000 cores, 40 GB SRAM, 20 PB/s memory, 28 PB/s fabric, 5.8 PFLOP/s dense. The mesh is
/// taken as 850 rows of 1,000 cores (the seeds give only the count; 850 rows is what makes a 600-million-weight
/// matrix at 90% sparsity send "over 70 thousand" non-zeros to each row, as the seeds say).
pub const WSE2: EngineModel = EngineModel {
    name: "wse2",
    cores: 850_000,
    sram_bytes: 40 * GB,
    memory_bandwidth: 20e15,
    fabric_bandwidth: 28e15,
    dense_flops: 5.8e15,
    grid_rows: 850,
    grid_cols: 1_000,
    fmas_per_core_cycle: WSE2_FMAS_PER_CORE,
    clock_hz: clock(5.8e15, 850_000, WSE2_FMAS_PER_CORE),
    partial_sum_cycles: PARTIAL_SUM_CYCLES,
};

/// WSE-3: 900,000 cores and 44 GB SRAM; its bandwidths and peak are scaled from WSE-2 by core count, since
/// the seeds give only cores and SRAM for it (so the clock and per-core figures are WSE-2's).
pub const WSE3: EngineModel = EngineModel {
    name: "wse3",
    cores: 900_000,
    sram_bytes: 44 * GB,
    memory_bandwidth: 20e15 * 900.0 / 850.0,
    fabric_bandwidth: 28e15 * 900.0 / 850.0,
    dense_flops: 5.8e15 * 900.0 / 850.0,
    grid_rows: 900,
    grid_cols: 1_000,
    fmas_per_core_cycle: WSE2_FMAS_PER_CORE,
    clock_hz: clock(5.8e15 * 900.0 / 850.0, 900_000, WSE2_FMAS_PER_CORE),
    partial_sum_cycles: PARTIAL_SUM_CYCLES,
};

/// A scaled-down engine for tests: a thousandth of a WSE-2 in cores (a 25 × 34 mesh), 64 MiB of SRAM, the
/// same clock and per-core figures.
pub const TINY: EngineModel = EngineModel {
    name: "tiny",
    cores: 850,
    sram_bytes: 64 << 20,
    memory_bandwidth: 20e12,
    fabric_bandwidth: 28e12,
    dense_flops: 5.8e12,
    grid_rows: 25,
    grid_cols: 34,
    fmas_per_core_cycle: WSE2_FMAS_PER_CORE,
    clock_hz: clock(5.8e12, 850, WSE2_FMAS_PER_CORE),
    partial_sum_cycles: PARTIAL_SUM_CYCLES,
};

/// The figures for a preset named in a spec.
pub fn model(preset: EnginePreset) -> EngineModel {
    match preset {
        EnginePreset::Wse2 => WSE2,
        EnginePreset::Wse3 => WSE3,
        EnginePreset::Tiny => TINY,
    }
}

/// The SRAM an engine of `spec` has: the preset's, unless the spec overrides it.
pub fn sram_bytes(spec: &crds::EngineSpec) -> u64 {
    spec.sram_bytes.unwrap_or(model(spec.preset).sram_bytes)
}

/// MemoryX's bandwidth to the fabric in bytes per second (4 TB/s in the seeds): every engine receives the
/// whole weight stream at this rate, because SwarmX replicates it rather than dividing it.
pub const MEMORYX_BANDWIDTH: f64 = 4e12;

/// Seconds one hop of the SwarmX tree adds to the first byte of a broadcast or a reduction. Not in the seeds:
/// an assumed switch-plus-wire latency, charged only for filling and draining the tree once per step.
pub const SWARMX_HOP_LATENCY_S: f64 = 2e-6;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for m in [WSE2, WSE3, TINY] {
            assert_eq!(m.grid_rows * m.grid_cols, m.cores, "{}: mesh covers every core", m.name);
            let peak = m.cores as f64 * m.flops_per_core_cycle() as f64 * m.clock_hz;
            assert!((peak / m.dense_flops - 1.0).abs() < 1e-12, "{}: clock reproduces the dense peak", m.name);
        }
        assert_eq!(WSE2.fmas_per_core_cycle, 4);
        assert_eq!(WSE2.partial_sum_cycles, 4);
    }
}
