//! A weight server's slice: which part of every layer it owns, and the layer tensors it keeps of it.

use plan::memoryx::slice_range;

/// Which slice of every layer a server owns: `index` of `count` equal contiguous ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceId {
    /// This server's place, 0-based; 0 is the coordinator.
    pub index: u32,
    /// How many servers share the state.
    pub count: u32,
}

impl SliceId {
    /// The whole state: what a single MemoryX holds.
    pub const WHOLE: SliceId = SliceId { index: 0, count: 1 };

    /// This slice of a tensor of `len` values.
    pub fn range(self, len: usize) -> std::ops::Range<usize> {
        slice_range(len, self.index, self.count)
    }

    /// This slice's lengths of every layer whose whole tensors have `whole` lengths.
    pub fn lengths(self, whole: &[LayerLengths]) -> Vec<LayerLengths> {
        whole.iter().map(|w| w.map(|len| self.range(len).len())).collect()
    }
}

impl std::fmt::Display for SliceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "weight server {} of {}", self.index, self.count)
    }
}

/// One layer's slice as a server holds it, in [`super::checkpoint::KINDS`] order: weights, bias, and the optimizer's
/// two moments of each (empty when the optimizer keeps none).
pub type LayerTensors = [Vec<f32>; 6];

/// Lengths of a layer's whole tensors, in [`super::checkpoint::KINDS`] order: what the coordinator cuts.
pub type LayerLengths = [usize; 6];
