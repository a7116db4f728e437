//! `sim-wse`: a simulated Wafer-Scale Engine. It is the hardware the runtime's engine program runs on: an
//! SRAM budget the program must fit in, counters for what crosses its boundary and what it computes (FLOPs
//! done against the dense equivalent, so sparsity's savings are measured, not assumed), and a cost model
//! ([`cost`]) that charges the time a real wafer would take, so a run reports it beside the CPU's.

#![warn(missing_docs)]

pub mod cost;
pub mod funnel;
pub mod models;
pub mod node;
mod plot;
pub mod report;

use plan::layout::ModelLayout;
use plan::preset::{self, EngineModel};
use runtime::engine::hw::{EngineCounters, EngineHw, Work};
use runtime::engine::wse::Wse;

/// Time charged since the last layer boundary: streaming and computing overlap (the next layer is prefetched
/// while this one computes), so a layer costs the longest of the three, not their sum.
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    stream_in_s: f64,
    stream_out_s: f64,
    compute_s: f64,
}

impl Pending {
    fn time(&self) -> f64 {
        self.compute_s.max(self.stream_in_s).max(self.stream_out_s)
    }
}

/// A simulated engine of a given generation.
#[derive(Clone, Debug)]
pub struct SimWse {
    model: EngineModel,
    sram: u64,
    memoryx_bandwidth: f64,
    counters: EngineCounters,
    settled_s: f64,
    pending: Pending,
}

impl SimWse {
    /// An engine of `model` with `sram` bytes of SRAM (the preset's unless overridden), fed at MemoryX's
    /// bandwidth.
    pub fn new(model: EngineModel, sram: u64) -> Self {
        SimWse {
            model,
            sram,
            memoryx_bandwidth: preset::MEMORYX_BANDWIDTH,
            counters: EngineCounters::default(),
            settled_s: 0.0,
            pending: Pending::default(),
        }
    }

    /// The figures it simulates.
    pub fn model(&self) -> &EngineModel {
        &self.model
    }

    fn settle(&mut self) {
        self.settled_s += self.pending.time();
        self.pending = Pending::default();
    }
}

impl EngineHw for SimWse {
    fn sram_bytes(&self) -> u64 {
        self.sram
    }

    fn record(&mut self, work: &Work<'_>) {
        self.counters.count(work);
        match *work {
            Work::Received { bytes } => {
                // A stream arriving after computation starts the next layer.
                if self.pending.compute_s > 0.0 {
                    self.settle();
                }
                self.pending.stream_in_s += bytes as f64 / self.memoryx_bandwidth;
            }
            Work::Sent { bytes } => self.pending.stream_out_s += bytes as f64 / self.memoryx_bandwidth,
            _ => self.pending.compute_s += cost::work_cycles(&self.model, work) as f64 / self.model.clock_hz,
        }
    }

    fn counters(&self) -> EngineCounters {
        let mut c = self.counters;
        c.simulated_s = self.settled_s + self.pending.time();
        c
    }
}

/// The engine program for `layout` running on a simulated engine as `spec` describes it.
pub fn engine(name: impl Into<String>, layout: ModelLayout, spec: &crds::EngineSpec) -> Wse<SimWse> {
    let model = preset::model(spec.preset);
    Wse::new(name, layout, SimWse::new(model, preset::sram_bytes(spec)))
}
