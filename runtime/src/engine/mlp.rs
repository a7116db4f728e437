//! The fully connected network on the engine: a linear unit per layer, the activation between them.

use crds::Activation;

use super::hw::Work;
use super::linear::{Grads, StreamedLinear};
use super::net::Net;
use crate::model::activation;
use errors::{Error, Result};
use kernels::tensor::Mat;
use plan::layout::ModelLayout;

/// An MLP's resident activations.
pub(super) struct MlpNet {
    activation: Activation,
    units: usize,
    /// Input to each layer computed so far: `x[0]` is the shard, `x[l]` the activation after layer `l − 1`.
    x: Vec<Mat>,
    /// Pre-activation of each hidden layer, kept for the activation's derivative.
    z: Vec<Mat>,
    /// The delta of the layer the backward pass reaches next.
    delta: Option<Mat>,
}

impl MlpNet {
    pub(super) fn new(layout: &ModelLayout) -> Self {
        MlpNet { activation: layout.activation, units: layout.linears.len(), x: Vec::new(), z: Vec::new(), delta: None }
    }
}

impl Net for MlpNet {
    fn begin(&mut self, inputs: Mat) -> Result<()> {
        self.clear();
        self.x.push(inputs);
        Ok(())
    }

    fn forward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Option<Mat>> {
        let l = unit.layer;
        let x = self.x.get(l).ok_or_else(|| Error::Protocol(format!("no input for layer {l}")))?;
        let z = unit.forward(x, works)?;
        works.push(Work::Elementwise { ops: 2 * z.data.len() as u64 });
        if l + 1 == self.units {
            return Ok(Some(z));
        }
        let a = Mat::from_vec(z.rows, z.cols, activation::forward(self.activation, &z.data));
        self.z.push(z);
        self.x.push(a);
        Ok(None)
    }

    fn start_backward(&mut self, d_logits: Mat) {
        self.delta = Some(d_logits);
    }

    fn backward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Grads> {
        let delta = self.delta.take().ok_or_else(|| Error::Protocol("no delta".into()))?;
        let x = self.x.pop().ok_or_else(|| Error::Protocol("no activation".into()))?;
        let (grads, dx) = unit.backward(&x, &delta, unit.layer > 0, works)?;
        if let Some(mut dx) = dx {
            let z = self.z.pop().ok_or_else(|| Error::Protocol("no pre-activation".into()))?;
            activation::backward(self.activation, &z.data, &mut dx.data);
            works.push(Work::Elementwise { ops: 2 * dx.data.len() as u64 });
            self.delta = Some(dx);
        }
        Ok(grads)
    }

    fn resident_bytes(&self) -> u64 {
        self.x.iter().chain(&self.z).chain(&self.delta).map(Mat::bytes).sum()
    }

    fn clear(&mut self) {
        self.x.clear();
        self.z.clear();
        self.delta = None;
    }
}
