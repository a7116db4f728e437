//! The layers a model is built from, and the layout of a model as the appliance sees it: a sequence of
//! weight layers, each one *stream unit* that MemoryX sends and the engine computes in turn.

pub mod activation;
pub mod linear;
pub mod loss;

use crds::{Activation, ModelKind, ModelSpec};

/// One weight layer: `outputs × inputs` weights plus a bias, dense or masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// Whether only a masked subset of the weights exists.
    pub sparse: bool,
}

impl LinearShape {
    /// Weights of the dense matrix, the unit every "dense-equivalent" figure is counted in.
    pub fn dense_weights(&self) -> usize {
        self.inputs * self.outputs
    }
}

/// The model as a sequence of stream units, shared by MemoryX (what to store and send), the engine (what to
/// compute) and the plan (what it costs).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLayout {
    /// The weight layers in forward order.
    pub linears: Vec<LinearShape>,
    /// The non-linearity after every layer but the last.
    pub activation: Activation,
    /// The fraction of zeros in every sparse layer's mask.
    pub sparsity: f64,
}

impl ModelLayout {
    /// The layout a validated spec describes.
    pub fn from_spec(spec: &ModelSpec) -> Self {
        match spec.kind {
            ModelKind::Mlp => {
                let sparse = spec.sparsity > 0.0;
                let linears = spec
                    .layers
                    .windows(2)
                    .map(|w| LinearShape { inputs: w[0] as usize, outputs: w[1] as usize, sparse })
                    .collect();
                ModelLayout { linears, activation: spec.activation, sparsity: spec.sparsity }
            }
        }
    }

    /// Input features of the first layer.
    pub fn inputs(&self) -> usize {
        self.linears.first().map_or(0, |l| l.inputs)
    }

    /// Output features (classes) of the last layer.
    pub fn outputs(&self) -> usize {
        self.linears.last().map_or(0, |l| l.outputs)
    }

    /// Parameters of the dense model (weights and biases).
    pub fn dense_parameters(&self) -> usize {
        self.linears.iter().map(|l| l.dense_weights() + l.outputs).sum()
    }

    /// Engine bytes for one shard's activations: the input plus each layer's pre-activation and output, all
    /// kept resident from the forward pass until the backward pass has used them.
    pub fn activation_bytes(&self, shard: usize) -> u64 {
        let per_token: usize = self.inputs() + self.linears.iter().map(|l| 2 * l.outputs).sum::<usize>();
        4 * (per_token * shard) as u64
    }
}

impl ModelLayout {
    /// Weights layer `l` is expected to keep: all of them when dense, `1 − sparsity` of them when masked.
    pub fn expected_weights(&self, l: usize) -> usize {
        let shape = self.linears[l];
        if shape.sparse {
            ((1.0 - self.sparsity) * shape.dense_weights() as f64).round() as usize
        } else {
            shape.dense_weights()
        }
    }

    /// Expected bytes of layer `l`'s forward stream: values (and a 4-byte index each plus line pointers when
    /// sparse) and the bias. The engine reserves this much for the layer it prefetches.
    pub fn forward_stream_bytes(&self, l: usize) -> u64 {
        let shape = self.linears[l];
        let nnz = self.expected_weights(l) as u64;
        let index = if shape.sparse { 4 * nnz + 4 * (2 * shape.outputs as u64 + 1) } else { 0 };
        4 * nnz + index + 4 * shape.outputs as u64
    }
}
