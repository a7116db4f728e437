//! A linear unit as the engine meets it: a layer's streamed weights and its shape. Both model families run
//! every weight layer through the same two calls, so choosing the kernel (dense GEMM or sparse AXPY/SDDMM) and
//! noting the work it took for the hardware model happen once, here.

use super::hw::Work;
use crate::model::linear;
use crate::protocol::{LayerStream, WeightPayload};
use errors::{Error, Result};
use kernels::tensor::Mat;
use kernels::tiles::{Acts, ActsRef, Layout};
use plan::layout::LinearShape;

/// A unit's weight and bias gradients, in the stream's weight order; the bias gradient is empty when the unit
/// has no bias. Named so the model families and the engine agree on which half is which.
pub(super) type Grads = (Vec<f32>, Vec<f32>);

/// One weight layer with the weights streamed for it: what a model family needs to run the layer, in either
/// pass, without looking at the wire format.
#[derive(Clone, Copy)]
pub(super) struct StreamedLinear<'s> {
    /// Index of the weight layer (the stream unit), 0-based in forward order.
    pub layer: usize,
    /// Its shape in the model layout.
    pub shape: LinearShape,
    /// Its weights (and bias, forward) as they arrived.
    pub stream: &'s LayerStream,
}

impl<'s> StreamedLinear<'s> {
    /// The weights, or a protocol error when the stream carries only a mask or nothing: the engine checks
    /// shapes before it computes, but a unit that needs values must never silently run without them.
    fn weights(&self) -> Result<linear::Weights<'s>> {
        self.stream.weights.weights().ok_or_else(|| Error::Protocol("weight values are missing".into()))
    }

    /// The streamed vector split into the unit's bias (empty when it has none) and the parameters of the norm
    /// its input passes through (see [`plan::layout::InputNorm`]). A forward stream carries the whole vector; a
    /// backward stream may carry none, and then both parts are empty.
    pub fn vector_parts(&self) -> Result<(&'s [f32], &'s [f32])> {
        let stream: &'s LayerStream = self.stream;
        let v: &'s [f32] = &stream.bias;
        if v.is_empty() {
            return Ok((v, v));
        }
        if v.len() != self.shape.vector_len() {
            return Err(Error::Protocol(format!(
                "layer {} streamed {} vector values; it has {}",
                self.layer,
                v.len(),
                self.shape.vector_len()
            )));
        }
        Ok(v.split_at(self.shape.bias_len()))
    }

    /// The kernel that multiplies these weights by `tokens` columns producing `m × tokens` from `k` rows: a
    /// sparse AXPY per non-zero, or a dense GEMM. The forward pass and the input gradient take the same kind.
    fn product(&self, m: usize, tokens: usize, k: usize) -> Work<'s> {
        let stream: &'s LayerStream = self.stream;
        match &stream.weights {
            WeightPayload::Sparse { pattern, .. } => Work::SparseAxpy { pattern, tokens },
            _ => Work::Gemm { m, n: tokens, k },
        }
    }

    /// Forward through the unit over input `x`, noting the kernel it took.
    pub fn forward(&self, x: &Mat, works: &mut Vec<Work<'s>>) -> Result<Mat> {
        self.forward_as(x.into(), works)
    }

    /// [`StreamedLinear::forward`] over an input in either layout, the output in rows.
    pub fn forward_as(&self, x: ActsRef<'_>, works: &mut Vec<Work<'s>>) -> Result<Mat> {
        let y = linear::forward_from(self.weights()?, self.vector_parts()?.0, x);
        works.push(self.product(y.rows, x.tokens(), x.rows()));
        Ok(y)
    }

    /// [`StreamedLinear::forward`] without the bias, which is returned for the pass that reads the output
    /// next to add (one value per output row): that pass adds it as it goes, where adding it here is one more
    /// pass over the whole output.
    pub fn forward_leaving_bias(&self, x: &Mat, works: &mut Vec<Work<'s>>) -> Result<(Mat, &'s [f32])> {
        let (y, bias) = self.forward_leaving_bias_as(x.into(), Layout::Rows, works)?;
        Ok((y.into_rows(), bias))
    }

    /// [`StreamedLinear::forward_leaving_bias`] over an input in either layout, the output in `layout` when
    /// the weights take the sparse kernel (rows otherwise, see [`Layout::Tiles`]).
    pub fn forward_leaving_bias_as(
        &self,
        x: ActsRef<'_>,
        layout: Layout,
        works: &mut Vec<Work<'s>>,
    ) -> Result<(Acts, &'s [f32])> {
        let y = linear::forward_as(self.weights()?, x, layout);
        works.push(self.product(y.rows(), x.tokens(), x.rows()));
        Ok((y, self.vector_parts()?.0))
    }

    /// Backward through the unit whose input was `x`, given the gradient `dy` of its output: the weight
    /// gradient (only at the mask's positions when sparse), the bias gradient when the unit has a bias, and —
    /// when `need_dx` — the gradient of the input.
    pub fn backward(
        &self,
        x: &Mat,
        dy: &Mat,
        need_dx: bool,
        works: &mut Vec<Work<'s>>,
    ) -> Result<(Grads, Option<Mat>)> {
        let (grads, dx) = self.backward_as(x.into(), dy.into(), need_dx.then_some(Layout::Rows), works)?;
        Ok((grads, dx.map(Acts::into_rows)))
    }

    /// [`StreamedLinear::backward`] over operands in either layout; `dx`, when asked for, in its layout when
    /// the weights take the sparse kernel (rows otherwise).
    pub fn backward_as(
        &self,
        x: ActsRef<'_>,
        dy: ActsRef<'_>,
        dx: Option<Layout>,
        works: &mut Vec<Work<'s>>,
    ) -> Result<(Grads, Option<Acts>)> {
        let (need_dx, layout) = (dx.is_some(), dx.unwrap_or(Layout::Rows));
        let (shape, tokens) = (self.shape, x.tokens());
        // Both gradients at once: a dense layer's are independent products that run side by side; a sparse
        // layer's both read the output gradient, in one pass over the mask.
        if need_dx {
            let both = match self.stream.weights.weights() {
                Some(linear::Weights::Dense(w)) => {
                    works.push(Work::Gemm { m: shape.outputs, n: shape.inputs, k: tokens });
                    let (dw, dx) = linear::backward_dense(w, &x.to_rows(), &dy.to_rows());
                    Some((dw, Acts::Rows(dx)))
                }
                Some(linear::Weights::Sparse { pattern, values }) => {
                    works.push(Work::SparseDot { pattern, tokens });
                    Some(linear::backward_sparse(pattern, values, x, dy, layout))
                }
                None => None,
            };
            if let Some((weights, dx)) = both {
                works.push(self.product(shape.inputs, tokens, shape.outputs));
                let bias = if shape.bias { linear::bias_grad_as(dy) } else { Vec::new() };
                return Ok(((weights, bias), Some(dx)));
            }
        }
        let weights = match self.stream.weights.pattern() {
            Some(pattern) => {
                works.push(Work::SparseDot { pattern, tokens });
                linear::weight_grad_sparse(pattern, x, dy)
            }
            None => {
                works.push(Work::Gemm { m: shape.outputs, n: shape.inputs, k: tokens });
                linear::weight_grad_dense(&dy.to_rows(), &x.to_rows())
            }
        };
        let bias = if shape.bias { linear::bias_grad_as(dy) } else { Vec::new() };
        let dx = if need_dx {
            let w = self.weights()?;
            works.push(self.product(shape.inputs, tokens, shape.outputs));
            Some(Acts::Rows(linear::backward_input(w, shape.inputs, &dy.to_rows())))
        } else {
            None
        };
        Ok(((weights, bias), dx))
    }
}
