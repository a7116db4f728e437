//! The engines a CS-2 can carry, with the figures the seeds give for them. Every number about the hardware
//! lives here and nowhere else.

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
}

const GB: u64 = 1_000_000_000;

/// WSE-2 (CS-2): 850,000 cores, 40 GB SRAM, 20 PB/s memory, 28 PB/s fabric, 5.8 PFLOP/s dense.
pub const WSE2: EngineModel = EngineModel {
    name: "wse2",
    cores: 850_000,
    sram_bytes: 40 * GB,
    memory_bandwidth: 20e15,
    fabric_bandwidth: 28e15,
    dense_flops: 5.8e15,
};

/// WSE-3: 900,000 cores and 44 GB SRAM; its bandwidths and peak are scaled from WSE-2 by core count, since
/// the seeds give only cores and SRAM for it.
pub const WSE3: EngineModel = EngineModel {
    name: "wse3",
    cores: 900_000,
    sram_bytes: 44 * GB,
    memory_bandwidth: 20e15 * 900.0 / 850.0,
    fabric_bandwidth: 28e15 * 900.0 / 850.0,
    dense_flops: 5.8e15 * 900.0 / 850.0,
};

/// A scaled-down engine for tests: a thousandth of a WSE-2 in cores, 64 MiB of SRAM.
pub const TINY: EngineModel = EngineModel {
    name: "tiny",
    cores: 850,
    sram_bytes: 64 << 20,
    memory_bandwidth: 20e12,
    fabric_bandwidth: 28e12,
    dense_flops: 5.8e12,
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
