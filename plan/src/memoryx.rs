//! How MemoryX's state is spread over its weight servers and, on each, between memory and its disk tier; and
//! the one cut of a layer into the servers' slices.

use crds::TrainingJobSpec;
use serde::Serialize;

use crate::layout::ModelLayout;
use errors::{Error, Result};

/// Values the optimizer `kind` keeps beside each parameter (momentum 1, Adam's two moments 2): what MemoryX
/// stores and checkpoints besides the weights, so the plan and the store count state alike.
pub fn optimizer_values(kind: crds::OptimizerKind) -> u64 {
    match kind {
        crds::OptimizerKind::Sgd => 0,
        crds::OptimizerKind::Momentum => 1,
        crds::OptimizerKind::Adam | crds::OptimizerKind::Adamw => 2,
    }
}

/// How MemoryX's state is spread over its weight servers and, on each, between memory and its disk.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryxPlan {
    /// Weight servers: each owns an equal slice of every layer.
    pub servers: u32,
    /// Bytes of state (weights, biases, optimizer moments) the busiest server holds: its slice of every layer.
    pub server_bytes: u64,
    /// Of those, what it keeps in memory (`spec.memoryx.memoryBytes` caps it).
    pub memory_bytes: u64,
    /// Of those, what lives on its volume (the disk tier), read ahead in stream order.
    pub disk_bytes: u64,
    /// The least memory a server can work in: its slice of the largest layer with its staged gradient, twice:
    /// one being updated while the next is read ahead.
    pub min_memory_bytes: u64,
}

/// Bytes a server's slice of a layer of `values` values takes with its staged gradient.
fn values_with_grad(values: u64, servers: u32, per_value: u64) -> u64 {
    values.div_ceil(u64::from(servers)) * (per_value + 4)
}

/// Most weight servers the plan chooses by itself; more must be asked for (`spec.memoryx.servers`).
pub const AUTO_SERVERS_MAX: u32 = 8;

/// The part of slice `index` of `count` in a tensor of `len` values: equal contiguous ranges in stored order,
/// the first ones one shorter when `len` does not divide. Every server, the coordinator and every checkpoint
/// reader cut a layer with this one function.
pub fn slice_range(len: usize, index: u32, count: u32) -> std::ops::Range<usize> {
    let n = count.max(1) as usize;
    let i = (index as usize).min(n);
    len * i / n..len * (i + 1).min(n) / n
}

/// Whether the SwarmX root streams each layer straight from the weight servers and hands them their slices of
/// the gradients, so MemoryX's bytes never pass through its coordinator (which keeps the plan, the step and the
/// checkpoints): when MemoryX has servers besides the coordinator and the job has a SwarmX tree to stream into
/// (more than one engine). The coordinator, the SwarmX root and the operator's NetworkPolicy decide it here.
pub fn streams_from_servers(servers: u32, engines: u32) -> bool {
    servers > 1 && engines > 1
}

impl MemoryxPlan {
    /// The spread of the job `spec`'s state.
    pub fn for_spec(spec: &TrainingJobSpec) -> Result<MemoryxPlan> {
        let layout = ModelLayout::from_spec(&spec.model);
        let layer_values: Vec<u64> = (0..layout.linears.len())
            .map(|l| {
                let s = layout.linears[l];
                (if s.tied_to.is_some() { 0 } else { layout.expected_weights(l) } + s.vector_len()) as u64
            })
            .collect();
        MemoryxPlan::new(&spec.memoryx, &layer_values, optimizer_values(spec.training.optimizer.kind))
    }

    /// Spreads a state whose layers hold `layer_values[l]` stored values (weights and bias; 0 for a tied
    /// layer) with `opt` optimizer values beside each, as `spec` asks, refusing a spread that cannot work.
    pub fn new(spec: &crds::MemoryxSpec, layer_values: &[u64], opt: u64) -> Result<MemoryxPlan> {
        let per_value = 4 * (1 + opt);
        let total_values: u64 = layer_values.iter().sum();
        let state = total_values * per_value;
        let servers = match (spec.servers, spec.memory_bytes) {
            (Some(n), _) => n.max(1),
            (None, Some(budget)) => state.div_ceil(budget.max(1)).clamp(1, AUTO_SERVERS_MAX as u64) as u32,
            (None, None) => 1,
        };
        if u64::from(servers) > total_values {
            return Err(Error::Plan(format!(
                "spec.memoryx.servers is {servers} but the model stores only {total_values} parameters: every weight \
                 server must own at least one; use at most {total_values} servers"
            )));
        }
        let slice = |values: u64| values.div_ceil(u64::from(servers)) * per_value;
        let server_bytes: u64 = layer_values.iter().map(|&v| slice(v)).sum();
        // A layer in use also has its staged gradient beside it.
        let largest = layer_values.iter().map(|&v| values_with_grad(v, servers, per_value)).max().unwrap_or(0);
        let min_memory_bytes = 2 * largest;
        let memory_bytes = spec.memory_bytes.map_or(server_bytes, |b| b.min(server_bytes));
        if let Some(budget) = spec.memory_bytes
            && budget < server_bytes
            && budget < min_memory_bytes
        {
            return Err(Error::Plan(format!(
                "spec.memoryx.memoryBytes is {} but each of the {servers} weight servers needs at least {} in \
                 memory: its slice of the largest layer ({}) being updated while the next one is read ahead; \
                 raise memoryBytes to {min_memory_bytes} or more, or add weight servers (spec.memoryx.servers)",
                errors::units::bytes(budget),
                errors::units::bytes(min_memory_bytes),
                errors::units::bytes(largest)
            )));
        }
        Ok(MemoryxPlan {
            servers,
            server_bytes,
            memory_bytes,
            disk_bytes: server_bytes - memory_bytes,
            min_memory_bytes,
        })
    }
}

#[cfg(test)]
mod servers_tests {
    use super::*;

    #[test]
    fn slices_cover_every_value_once() {
        for len in [0usize, 1, 7, 10, 1000] {
            for n in 1..=5u32 {
                let ranges: Vec<_> = (0..n).map(|i| slice_range(len, i, n)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[n as usize - 1].end, len);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "{len} {n}: {ranges:?}");
            }
        }
    }

    #[test]
    fn servers_are_chosen_from_the_budget_and_a_spread_that_cannot_work_is_refused() {
        let spec = |servers, memory_bytes| crds::MemoryxSpec { servers, memory_bytes };
        // 4 layers of 1000 values with Adam: 12 kB each, 48 kB in all.
        let layers = [1000u64; 4];
        let one = MemoryxPlan::new(&spec(None, None), &layers, 2).unwrap();
        assert_eq!((one.servers, one.server_bytes, one.memory_bytes, one.disk_bytes), (1, 48_000, 48_000, 0));
        let auto = MemoryxPlan::new(&spec(None, Some(16_000)), &layers, 2).unwrap();
        assert_eq!((auto.servers, auto.server_bytes, auto.disk_bytes), (3, 16_032, 32), "48 kB over 16 kB servers");
        let tiered = MemoryxPlan::new(&spec(Some(2), Some(16_000)), &layers, 2).unwrap();
        assert_eq!(
            (tiered.server_bytes, tiered.memory_bytes, tiered.disk_bytes, tiered.min_memory_bytes),
            (24_000, 16_000, 8_000, 16_000)
        );
        let err = MemoryxPlan::new(&spec(Some(2), Some(5_000)), &layers, 2).unwrap_err().to_string();
        assert!(err.contains("memoryBytes") && err.contains("largest layer"), "{err}");
        let err = MemoryxPlan::new(&spec(Some(5), None), &[2, 2], 2).unwrap_err().to_string();
        assert!(err.contains("only 4 parameters"), "{err}");
    }
}
