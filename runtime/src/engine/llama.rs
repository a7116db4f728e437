//! A Llama-architecture decoder on the engine. MemoryX streams it as matrices — the token embedding, then per
//! block QKV (with the attention norm's gain), attention output, gate and up (with the MLP norm's gain) and
//! down, then the head (with the final norm's gain) — and everything between them runs here over activations
//! that stay resident: RMSNorm, rotary positions, grouped-query causal attention, SwiGLU and the residual
//! stream.

use super::hw::Work;
use super::linear::{Grads, StreamedLinear};
use super::net::{Net, missing_input_grad};
use crate::model::attention::{self, Geometry};
use crate::model::rmsnorm;
use crate::model::rope::Rope;
use crate::model::swiglu;
use crate::protocol::WeightPayload;
use errors::{Error, Result};
use kernels::small;
use kernels::tensor::{Mat, Spare};
use plan::layout::{DecoderUnit, LlamaShape};

/// An RMSNorm's state for the backward pass: the normalised stream before its gain, each token's reciprocal
/// root mean square, the gain as it streamed and the gained stream the next matrix read.
#[derive(Default)]
struct Normed {
    xhat: Mat,
    rstd: Vec<f32>,
    gain: Vec<f32>,
    input: Mat,
}

impl Normed {
    /// The statistics of `x`, waiting for the gain that streams with the next unit.
    fn of(x: &Mat, eps: f32, works: &mut Vec<Work<'_>>) -> Normed {
        let (xhat, rstd) = rmsnorm::forward(x, eps);
        works.push(Work::Elementwise { ops: 4 * x.data.len() as u64 });
        Normed { xhat, rstd, ..Normed::default() }
    }

    /// Applies `gain` (the unit's streamed vector) and returns the unit's input.
    fn gained(&mut self, gain: &[f32], works: &mut Vec<Work<'_>>) -> Result<&Mat> {
        if gain.len() != self.xhat.rows {
            return Err(Error::Protocol(format!("{} norm gains streamed for {} features", gain.len(), self.xhat.rows)));
        }
        self.gain = gain.to_vec();
        self.input = rmsnorm::apply_gain(&self.xhat, gain);
        works.push(Work::Elementwise { ops: self.xhat.data.len() as u64 });
        Ok(&self.input)
    }

    /// Backward through the unit that read this norm: its weight gradient and the gain's, with the norm's input
    /// gradient added to `dx`.
    fn backward<'s>(
        self,
        unit: StreamedLinear<'s>,
        dy: &Mat,
        dx: &mut Mat,
        works: &mut Vec<Work<'s>>,
    ) -> Result<Grads> {
        let ((weights, _), da) = unit.backward(&self.input, dy, true, works)?;
        let da = da.ok_or_else(missing_input_grad)?;
        let dgain = rmsnorm::backward_add(&self.xhat, &self.rstd, &self.gain, &da, dx);
        works.push(Work::Elementwise { ops: 8 * da.data.len() as u64 });
        Ok((weights, dgain))
    }

    fn bytes(&self) -> u64 {
        self.xhat.bytes() + self.input.bytes() + 4 * (self.rstd.len() + self.gain.len()) as u64
    }
}

/// What one block keeps from its forward pass for its backward pass.
#[derive(Default)]
struct BlockActs {
    attn_norm: Normed,
    /// Q, K (both rotated) and V.
    qkv: Mat,
    /// Attention probabilities, one `context × context` matrix per sequence and head.
    probs: Vec<f32>,
    /// Attention output (the output projection's input).
    o: Mat,
    mlp_norm: Normed,
    /// The gate and up projections, stacked, and the gated product (the down projection's input).
    u: Mat,
    h: Mat,
}

impl BlockActs {
    fn bytes(&self) -> u64 {
        self.attn_norm.bytes()
            + self.mlp_norm.bytes()
            + self.qkv.bytes()
            + self.o.bytes()
            + self.u.bytes()
            + self.h.bytes()
            + 4 * self.probs.len() as u64
    }
}

/// A Llama's resident state for one shard.
pub(super) struct LlamaNet {
    g: LlamaShape,
    rope: Rope,
    tokens: Vec<u32>,
    /// The residual stream during the forward pass.
    x: Mat,
    blocks: Vec<BlockActs>,
    final_norm: Option<Normed>,
    /// Gradient of the residual stream during the backward pass.
    dx: Mat,
    /// A gradient waiting for the next unit down: the logits' (head), the MLP's (gate and up) or QKV's.
    pending: Option<Mat>,
    spare: Spare,
}

/// Adds `y` into the residual stream `x`.
fn add_into(x: &mut Mat, y: &Mat, works: &mut Vec<Work<'_>>) {
    x.data.iter_mut().zip(&y.data).for_each(|(x, y)| *x += y);
    works.push(Work::Elementwise { ops: y.data.len() as u64 });
}

impl LlamaNet {
    /// The net for a Llama of shape `g`.
    pub(super) fn new(g: LlamaShape) -> Self {
        LlamaNet { rope: Rope::new(g.head_dim(), g.context, g.rope_theta), ..LlamaNet::new_empty(g) }
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            width: self.g.heads * self.g.head_dim(),
            heads: self.g.heads,
            kv_heads: self.g.kv_heads,
            context: self.g.context,
        }
    }

    fn eps(&self) -> f32 {
        self.g.norm_eps as f32
    }

    fn block(&mut self, b: usize) -> Result<&mut BlockActs> {
        self.blocks.get_mut(b).ok_or_else(|| Error::Protocol(format!("block {b} has no activations")))
    }

    fn pending(&mut self, what: &str) -> Result<Mat> {
        self.pending.take().ok_or_else(|| Error::Protocol(format!("no gradient for {what}")))
    }

    /// Each token's row of the embedding (`vocab × width`, row-major), as the feature-major stream.
    fn embed(&self, rows: &[f32]) -> Result<Mat> {
        let (d, n) = (self.g.width, self.tokens.len());
        let mut by_token = vec![0.0f32; n * d];
        for (out, &tok) in by_token.chunks_exact_mut(d.max(1)).zip(&self.tokens) {
            let start = tok as usize * d;
            let row = rows
                .get(start..start + d)
                .ok_or_else(|| Error::Protocol(format!("token {tok} has no embedding row")))?;
            out.copy_from_slice(row);
        }
        Ok(Mat::from_vec(d, n, small::transpose(&by_token, n, d)))
    }
}

impl Net for LlamaNet {
    fn begin(&mut self, inputs: Mat) -> Result<()> {
        self.clear();
        self.tokens = super::net::token_ids(&inputs, self.g.vocab)?;
        Ok(())
    }

    fn forward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Option<Mat>> {
        let eps = self.eps();
        let gain: &'s [f32] = unit.vector_parts()?.1;
        match self.g.unit(unit.layer) {
            DecoderUnit::Embed => {
                let WeightPayload::Dense(rows) = &unit.stream.weights else {
                    return Err(Error::Protocol("the embedding must stream dense".into()));
                };
                self.x = self.embed(rows)?;
                works.push(Work::Elementwise { ops: self.x.data.len() as u64 });
                let attn_norm = Normed::of(&self.x, eps, works);
                self.blocks.push(BlockActs { attn_norm, ..BlockActs::default() });
            }
            DecoderUnit::Qkv(b) => {
                let (geometry, heads, kv) = (self.geometry(), self.g.heads, self.g.kv_heads);
                let block =
                    self.blocks.get_mut(b).ok_or_else(|| Error::Protocol(format!("block {b} has no activations")))?;
                let input = block.attn_norm.gained(gain, works)?;
                let (mut qkv, _) = unit.forward_leaving_bias(input, works)?;
                self.rope.rotate(&mut qkv, heads + kv, false);
                let (o, probs) = attention::forward(geometry, &qkv, &mut self.spare);
                let (t, n, dh) = (geometry.context, qkv.cols, geometry.width / heads);
                let gemm = Work::Gemm { m: t, n: n * heads, k: dh };
                works.extend([
                    gemm,
                    gemm,
                    Work::Elementwise { ops: 5 * (probs.len() as u64) / 2 + 6 * ((heads + kv) * dh * n) as u64 },
                ]);
                (block.qkv, block.o, block.probs) = (qkv, o, probs);
            }
            DecoderUnit::Proj(b) => {
                let (y, _) = unit.forward_leaving_bias(&self.block(b)?.o, works)?;
                add_into(&mut self.x, &y, works);
                let mlp_norm = Normed::of(&self.x, eps, works);
                self.block(b)?.mlp_norm = mlp_norm;
            }
            DecoderUnit::Up(b) => {
                let block = self.block(b)?;
                let input = block.mlp_norm.gained(gain, works)?;
                let (u, _) = unit.forward_leaving_bias(input, works)?;
                block.h = swiglu::forward(&u);
                works.push(Work::Elementwise { ops: 6 * block.h.data.len() as u64 });
                block.u = u;
            }
            DecoderUnit::Down(b) => {
                let (y, _) = unit.forward_leaving_bias(&self.block(b)?.h, works)?;
                add_into(&mut self.x, &y, works);
                let normed = Normed::of(&self.x, eps, works);
                if b + 1 < self.g.blocks {
                    self.blocks.push(BlockActs { attn_norm: normed, ..BlockActs::default() });
                } else {
                    self.final_norm = Some(normed);
                    self.x = Mat::default();
                }
            }
            DecoderUnit::Head => {
                let norm = self
                    .final_norm
                    .as_mut()
                    .ok_or_else(|| Error::Protocol("the head came before the last block".into()))?;
                let input = norm.gained(gain, works)?;
                return Ok(Some(unit.forward_leaving_bias(input, works)?.0));
            }
        }
        Ok(None)
    }

    fn start_backward(&mut self, d_logits: Mat) {
        self.pending = Some(d_logits);
    }

    fn backward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Grads> {
        match self.g.unit(unit.layer) {
            DecoderUnit::Head => {
                let d_logits = self.pending("the logits")?;
                let norm = self.final_norm.take().ok_or_else(missing_input_grad)?;
                self.dx = Mat::zeros(norm.xhat.rows, norm.xhat.cols);
                norm.backward(unit, &d_logits, &mut self.dx, works)
            }
            DecoderUnit::Down(b) => {
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let (grads, dh) = unit.backward(&block.h, &self.dx, true, works)?;
                let du = swiglu::backward(&block.u, &dh.ok_or_else(missing_input_grad)?);
                works.push(Work::Elementwise { ops: 10 * du.data.len() as u64 });
                (block.u, block.h) = (Mat::default(), Mat::default());
                self.pending = Some(du);
                Ok(grads)
            }
            DecoderUnit::Up(b) => {
                let du = self.pending("the MLP")?;
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                std::mem::take(&mut block.mlp_norm).backward(unit, &du, &mut self.dx, works)
            }
            DecoderUnit::Proj(b) => {
                let (geometry, heads, kv) = (self.geometry(), self.g.heads, self.g.kv_heads);
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let (grads, d_o) = unit.backward(&block.o, &self.dx, true, works)?;
                let d_o = d_o.ok_or_else(missing_input_grad)?;
                let mut dqkv = attention::backward(geometry, &block.qkv, &block.probs, &d_o, &mut self.spare);
                self.rope.rotate(&mut dqkv, heads + kv, true);
                let (t, n, dh) = (geometry.context, d_o.cols, geometry.width / heads);
                let gemm = Work::Gemm { m: t, n: n * heads, k: dh };
                works.extend([gemm, gemm, gemm, gemm, Work::Elementwise { ops: 4 * block.probs.len() as u64 }]);
                self.spare.give(std::mem::take(&mut block.o).data);
                self.spare.give(std::mem::take(&mut block.probs));
                self.spare.give(std::mem::take(&mut block.qkv).data);
                self.pending = Some(dqkv);
                Ok(grads)
            }
            DecoderUnit::Qkv(b) => {
                let dqkv = self.pending("attention")?;
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let grads = std::mem::take(&mut block.attn_norm).backward(unit, &dqkv, &mut self.dx, works)?;
                self.blocks.truncate(b);
                self.spare.give(dqkv.data);
                Ok(grads)
            }
            DecoderUnit::Embed => {
                // Only the rows that were looked up get a gradient; the stream carries no weights at all.
                let (d, n) = (self.g.width, self.tokens.len());
                let by_token = small::transpose(&self.dx.data, d, n);
                let mut grad = vec![0.0f32; self.g.vocab * d];
                for (&tok, g) in self.tokens.iter().zip(by_token.chunks_exact(d.max(1))) {
                    let start = tok as usize * d;
                    grad[start..start + d].iter_mut().zip(g).for_each(|(a, g)| *a += g);
                }
                works.push(Work::Elementwise { ops: (d * n) as u64 });
                self.dx = Mat::default();
                Ok((grad, Vec::new()))
            }
        }
    }

    fn resident_bytes(&self) -> u64 {
        [&self.x, &self.dx].iter().map(|m| m.bytes()).sum::<u64>()
            + self.blocks.iter().map(BlockActs::bytes).sum::<u64>()
            + self.final_norm.as_ref().map_or(0, Normed::bytes)
            + self.pending.as_ref().map_or(0, Mat::bytes)
            + 4 * self.tokens.len() as u64
    }

    fn clear(&mut self) {
        // The activations go; the rotary table and the spare buffers stay for the next step.
        let (rope, spare) = (std::mem::take(&mut self.rope), std::mem::take(&mut self.spare));
        *self = LlamaNet { rope, spare, ..LlamaNet::new_empty(self.g) };
    }
}

impl LlamaNet {
    /// A net with no rotary table yet, for [`Net::clear`] to fill with the one it keeps.
    fn new_empty(g: LlamaShape) -> Self {
        LlamaNet {
            g,
            rope: Rope::default(),
            tokens: Vec::new(),
            x: Mat::default(),
            blocks: Vec::new(),
            final_norm: None,
            dx: Mat::default(),
            pending: None,
            spare: Spare::default(),
        }
    }
}
