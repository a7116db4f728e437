//! `sim-wse`: a simulated Wafer-Scale Engine. It is the hardware the runtime's engine program runs on: an
//! SRAM budget the program must fit in, and counters for what crosses its boundary and what it computes
//! (FLOPs done against the dense equivalent, so sparsity's savings are measured, not assumed).

pub mod preset;

use runtime::engine::{EngineCounters, EngineHw, Wse, Work};
use runtime::model::ModelLayout;

pub use preset::EngineModel;

/// A simulated engine of a given generation.
#[derive(Clone, Debug)]
pub struct SimWse {
    model: EngineModel,
    sram: u64,
    counters: EngineCounters,
}

impl SimWse {
    /// An engine of `model` with `sram` bytes of SRAM (the preset's unless overridden).
    pub fn new(model: EngineModel, sram: u64) -> Self {
        SimWse { model, sram, counters: EngineCounters::default() }
    }

    /// The figures it simulates.
    pub fn model(&self) -> &EngineModel {
        &self.model
    }
}

impl EngineHw for SimWse {
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

/// The engine program for `layout` running on a simulated engine as `spec` describes it.
pub fn engine(name: impl Into<String>, layout: ModelLayout, spec: &crds::EngineSpec) -> Wse<SimWse> {
    let model = preset::model(spec.preset);
    Wse::new(name, layout, SimWse::new(model, preset::sram_bytes(spec)))
}
