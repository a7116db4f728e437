//! The fully connected network on the engine: a linear unit per layer, the activation between them.

use crds::Activation;

use super::{linear_backward, linear_forward, Net, Work};
use crate::error::{Error, Result};
use crate::model::{activation, LinearShape, ModelLayout};
use crate::protocol::LayerStream;
use crate::tensor::Mat;

/// An MLP's resident activations.
pub(super) struct MlpNet {
    activation: Activation,
    units: usize,
    /// Input to each layer computed so far: `x[0]` is the shard, `x[l]` the activation after layer `l − 1`.
    x: Vec<Mat>,
    /// Pre-activation of each hidden layer, kept for the activation's derivative.
    z: Vec<Mat>,
    logits: Option<Mat>,
    /// The delta of the layer the backward pass reaches next.
    delta: Option<Mat>,
}

impl MlpNet {
    pub(super) fn new(layout: &ModelLayout) -> Self {
        MlpNet {
            activation: layout.activation,
            units: layout.linears.len(),
            x: Vec::new(),
            z: Vec::new(),
            logits: None,
            delta: None,
        }
    }
}

impl Net for MlpNet {
    fn begin(&mut self, inputs: Mat) -> Result<()> {
        self.clear();
        self.x.push(inputs);
        Ok(())
    }

    fn forward<'s>(&mut self, l: usize, stream: &'s LayerStream, works: &mut Vec<Work<'s>>) -> Result<()> {
        let x = self.x.get(l).ok_or_else(|| Error::Protocol(format!("no input for layer {l}")))?;
        let z = linear_forward(stream, x, works)?;
        works.push(Work::Elementwise { ops: 2 * z.data.len() as u64 });
        if l + 1 == self.units {
            self.logits = Some(z);
        } else {
            let mut a = Mat::zeros(z.rows, z.cols);
            activation::forward(self.activation, &z.data, &mut a.data);
            self.z.push(z);
            self.x.push(a);
        }
        Ok(())
    }

    fn logits(&self) -> Option<&Mat> {
        self.logits.as_ref()
    }

    fn take_logits(&mut self) -> Option<Mat> {
        self.logits.take()
    }

    fn start_backward(&mut self, d_logits: Mat) {
        self.delta = Some(d_logits);
    }

    fn backward<'s>(
        &mut self,
        l: usize,
        shape: LinearShape,
        stream: &'s LayerStream,
        works: &mut Vec<Work<'s>>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let delta = self.delta.take().ok_or_else(|| Error::Protocol("no delta".into()))?;
        let x = self.x.pop().ok_or_else(|| Error::Protocol("no activation".into()))?;
        let (weights, bias, dx) = linear_backward(stream, shape, &x, &delta, l > 0, works)?;
        if let Some(mut dx) = dx {
            let z = self.z.pop().ok_or_else(|| Error::Protocol("no pre-activation".into()))?;
            activation::backward(self.activation, &z.data, &mut dx.data);
            works.push(Work::Elementwise { ops: 2 * dx.data.len() as u64 });
            self.delta = Some(dx);
        }
        Ok((weights, bias))
    }

    fn resident_bytes(&self) -> u64 {
        self.x.iter().chain(&self.z).chain(&self.logits).chain(&self.delta).map(Mat::bytes).sum()
    }

    fn clear(&mut self) {
        self.x.clear();
        self.z.clear();
        self.logits = None;
        self.delta = None;
    }
}
