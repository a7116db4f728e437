//! The transformer on the engine. MemoryX streams it as matrices — the embedding, then per block QKV,
//! attention output, MLP up and MLP down, then the head — and everything between them runs here over
//! activations that stay resident: layer norms, causal attention, GELU and the residual stream. With affine
//! norms (GPT-2's), each norm's gain and bias arrive in the vector of the unit that reads it (QKV, MLP up,
//! head) and are applied there.

use crds::Activation;

use super::hw::Work;
use super::linear::{Grads, StreamedLinear};
use super::net::{Net, missing_input_grad};
use crate::model::attention::{self, Geometry};
use crate::model::{activation, norm};
use crate::protocol::WeightPayload;
use errors::{Error, Result};
use kernels::small;
use kernels::sparse;
use kernels::tensor::{Mat, Spare, TOKENS_PER_TASK, rows_per_piece};
use kernels::tiles::{Acts, ActsRef, Layout};
use plan::layout::{DecoderUnit, GptShape, ModelLayout};

/// An affine norm's output as the unit that read it needs it in the backward pass: the gained and shifted
/// stream (the unit's input) and the gain. (The normalised stream before them stays where a plain norm's is.)
struct Affine {
    input: Mat,
    gain: Vec<f32>,
}

impl Affine {
    fn bytes(&self) -> u64 {
        self.input.bytes() + 4 * self.gain.len() as u64
    }
}

/// The input a unit reads from the norm `xhat`: `xhat` itself when the norm is plain (`params` empty); else
/// `xhat` with the unit's gain and bias (`params`, `2 × features`) applied, kept in `slot` for the backward pass.
fn norm_input<'a>(
    xhat: &'a Acts,
    params: &[f32],
    affine: bool,
    slot: &'a mut Option<Affine>,
    works: &mut Vec<Work<'_>>,
) -> Result<ActsRef<'a>> {
    if !affine {
        return Ok(xhat.view());
    }
    let Acts::Rows(x) = xhat else {
        return Err(Error::Protocol("an affine norm's input is kept in rows".into()));
    };
    if params.len() != 2 * x.rows {
        return Err(Error::Protocol(format!(
            "{} norm parameters streamed for {} features (a gain and a bias each)",
            params.len(),
            x.rows
        )));
    }
    let (gain, bias) = params.split_at(x.rows);
    works.push(Work::Elementwise { ops: 2 * x.data.len() as u64 });
    let kept = slot.insert(Affine { input: norm::affine(x, gain, bias), gain: gain.to_vec() });
    Ok((&kept.input).into())
}

/// What one block keeps from its forward pass for its backward pass.
#[derive(Default)]
struct BlockActs {
    /// Normalised block input (the QKV projection's input) and its reciprocal standard deviations. In the
    /// sparse kernels' tiles when the block's matrices take them, like `a2`.
    a1: Acts,
    rstd1: Vec<f32>,
    /// With affine norms, what QKV read from `a1`.
    n1: Option<Affine>,
    qkv: Mat,
    /// Attention probabilities, one `context × context` matrix per sequence and head.
    probs: Vec<f32>,
    /// Attention output (the output projection's input).
    o: Mat,
    /// Normalised residual after attention (the MLP's input).
    a2: Acts,
    rstd2: Vec<f32>,
    /// With affine norms, what MLP-up read from `a2`.
    n2: Option<Affine>,
    /// GELU's slope at the MLP's pre-activation (all the backward pass needs of it), and the activation. Both
    /// stay in the sparse kernels' tiles when the MLP's matrices are sparse: the hidden layer then goes from
    /// MLP-up to MLP-down, forward and backward, without being copied out to rows or packed into tiles.
    u: Acts,
    g: Acts,
}

impl BlockActs {
    fn bytes(&self) -> u64 {
        let acts = [&self.a1, &self.a2, &self.u, &self.g];
        self.qkv.bytes()
            + self.o.bytes()
            + acts.iter().map(|a| a.bytes()).sum::<u64>()
            + [&self.n1, &self.n2].iter().filter_map(|n| n.as_ref()).map(Affine::bytes).sum::<u64>()
            + 4 * (self.rstd1.len() + self.probs.len() + self.rstd2.len()) as u64
    }
}

/// A GPT's resident state for one shard.
pub(super) struct GptNet {
    g: GptShape,
    /// The layout of the layer norms that QKV and MLP-up read: tiles when the blocks' matrices take the sparse
    /// kernels (see [`GptNet::new`]).
    norms: Layout,
    tokens: Vec<u32>,
    /// The residual stream during the forward pass.
    x: Mat,
    blocks: Vec<BlockActs>,
    /// Final normalised stream (the head's input, or with affine norms what `nf` is made from).
    af: Mat,
    rstdf: Vec<f32>,
    nf: Option<Affine>,
    /// Gradient of the residual stream during the backward pass.
    dx: Mat,
    /// A gradient waiting for the next unit down: the logits' (head), the MLP pre-activation's (up) or QKV's.
    pending: Option<Acts>,
    /// Attention's finished buffers, kept from step to step (see [`Spare`]).
    spare: Spare,
}

impl GptNet {
    /// The net for `layout` (a GPT of shape `g`). Its block matrices take the sparse kernels when they are
    /// sparse enough not to run dense ([`sparse::DENSE_ABOVE`]); plain layer norms they read are then kept in
    /// tiles. (A mask whose own density lands above the line runs dense all the same, reading the tiles back
    /// into rows: slower, never wrong.) Affine norms are kept in rows, where their gain and bias apply.
    pub(super) fn new(g: GptShape, layout: &ModelLayout) -> Self {
        let takes_sparse = !g.affine_norms
            && layout.linears.get(1).is_some_and(|qkv| qkv.sparse)
            && 1.0 - layout.sparsity <= sparse::DENSE_ABOVE;
        Self::empty(g, if takes_sparse { Layout::Tiles } else { Layout::Rows })
    }

    /// A net holding no activations yet.
    fn empty(g: GptShape, norms: Layout) -> Self {
        GptNet {
            g,
            norms,
            tokens: Vec::new(),
            x: Mat::default(),
            blocks: Vec::new(),
            af: Mat::default(),
            rstdf: Vec::new(),
            nf: None,
            dx: Mat::default(),
            pending: None,
            spare: Spare::default(),
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry { width: self.g.width, heads: self.g.heads, kv_heads: self.g.heads, context: self.g.context }
    }

    fn block(&mut self, b: usize) -> Result<&mut BlockActs> {
        block_in(&mut self.blocks, b)
    }

    fn pending(&mut self, what: &str) -> Result<Acts> {
        self.pending.take().ok_or_else(|| Error::Protocol(format!("no gradient for {what}")))
    }

    /// Adds `y` and its rows' `bias` (the unit's, left to this pass) to the residual stream and normalises the
    /// result: the input of the next sub-block.
    fn residual_norm(&mut self, y: &Mat, bias: &[f32], layout: Layout, works: &mut Vec<Work<'_>>) -> (Acts, Vec<f32>) {
        use rayon::prelude::*;
        debug_assert!(bias.is_empty() || bias.len() == y.rows, "one bias per row of the output");
        let cols = y.cols.max(1);
        let rows = rows_per_piece(cols);
        self.x.data.par_chunks_mut(rows * cols).zip(y.data.par_chunks(rows * cols)).enumerate().for_each(
            |(i, (x, y))| {
                for (r, (x, y)) in x.chunks_mut(cols).zip(y.chunks(cols)).enumerate() {
                    let b = bias.get(i * rows + r).copied().unwrap_or(0.0);
                    for (x, v) in x.iter_mut().zip(y) {
                        *x += v + b;
                    }
                }
            },
        );
        works.push(Work::Elementwise { ops: 9 * y.data.len() as u64 });
        norm::forward_as(&self.x, layout)
    }

    /// Looks up each token's and position's rows of the embedding (`(vocab + context) × width`, row-major).
    ///
    /// Each token's sum of two contiguous rows is written token-major first and then transposed into the
    /// feature-major stream, both on all cores: written in place, every value went to a different row of the
    /// stream, 8 KiB from the last, on one core at the start of every step.
    fn embed(&mut self, rows: &[f32]) -> Mat {
        use rayon::prelude::*;
        let (d, n) = (self.g.width, self.tokens.len());
        if d == 0 || n == 0 {
            return Mat::zeros(d, n);
        }
        let mut by_token = vec![0.0f32; n * d];
        by_token.par_chunks_mut(d * TOKENS_PER_TASK).zip(self.tokens.par_chunks(TOKENS_PER_TASK)).enumerate().for_each(
            |(c, (out, tokens))| {
                for (i, (row, &tok)) in out.chunks_exact_mut(d).zip(tokens).enumerate() {
                    let (te, pe) = self.g.embedding_rows(c * TOKENS_PER_TASK + i, tok);
                    for ((x, a), b) in row.iter_mut().zip(&rows[te..te + d]).zip(&rows[pe..pe + d]) {
                        *x = a + b;
                    }
                }
            },
        );
        Mat::from_vec(d, n, small::transpose(&by_token, n, d))
    }
}

/// Block `b`'s activations, borrowed apart from the rest of the net.
fn block_in(blocks: &mut [BlockActs], b: usize) -> Result<&mut BlockActs> {
    blocks.get_mut(b).ok_or_else(|| Error::Protocol(format!("block {b} has no activations")))
}

/// Backward through a unit whose input is a layer norm `a` of the residual stream (with reciprocal standard
/// deviations `rstd`; with its gain and bias applied when `affine`), given its output gradient `dy`: the
/// unit's gradients (an affine norm's gain and bias gradients after its bias's), with the norm's input
/// gradient added into the residual stream's gradient `dx`. The QKV projection, the MLP's up projection and
/// the head all read a normalised stream, so they share this step.
fn backward_through_norm<'s>(
    unit: StreamedLinear<'s>,
    (a, rstd, affine): (ActsRef<'_>, &[f32], Option<Affine>),
    dy: ActsRef<'_>,
    dx: &mut Mat,
    works: &mut Vec<Work<'s>>,
) -> Result<Grads> {
    let input = affine.as_ref().map_or(a, |f| (&f.input).into());
    let ((weights, mut vector), da) = unit.backward_as(input, dy, Some(Layout::Rows), works)?;
    let mut da = da.ok_or_else(missing_input_grad)?.into_rows();
    if let Some(f) = &affine {
        let (dgain, dbias) = norm::affine_backward(&a.to_rows(), &f.gain, &mut da);
        vector.extend(dgain);
        vector.extend(dbias);
        works.push(Work::Elementwise { ops: 3 * da.data.len() as u64 });
    }
    norm::backward_add(a, rstd, &da, dx);
    works.push(Work::Elementwise { ops: 8 * da.data.len() as u64 });
    Ok((weights, vector))
}

impl Net for GptNet {
    fn begin(&mut self, inputs: Mat) -> Result<()> {
        self.clear();
        self.tokens = super::net::token_ids(&inputs, self.g.vocab)?;
        Ok(())
    }

    fn forward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Option<Mat>> {
        match self.g.unit(unit.layer) {
            DecoderUnit::Embed => {
                let WeightPayload::Dense(rows) = &unit.stream.weights else {
                    return Err(Error::Protocol("the embedding must stream dense".into()));
                };
                self.x = self.embed(rows);
                let (a1, rstd1) = norm::forward_as(&self.x, self.norms);
                works.push(Work::Elementwise { ops: 9 * self.x.data.len() as u64 });
                self.blocks.push(BlockActs { a1, rstd1, ..BlockActs::default() });
            }
            DecoderUnit::Qkv(b) => {
                let (geometry, affine) = (self.geometry(), self.g.affine_norms);
                let block = block_in(&mut self.blocks, b)?;
                let input = norm_input(&block.a1, unit.vector_parts()?.1, affine, &mut block.n1, works)?;
                let qkv = unit.forward_as(input, works)?;
                let (o, probs) = attention::forward(geometry, &qkv, &mut self.spare);
                let (t, n, heads) = (geometry.context, qkv.cols, geometry.heads);
                let gemm = Work::Gemm { m: t, n: n * heads, k: geometry.width / heads };
                works.extend([gemm, gemm, Work::Elementwise { ops: 5 * (probs.len() as u64) / 2 }]);
                (block.qkv, block.o, block.probs) = (qkv, o, probs);
            }
            DecoderUnit::Proj(b) => {
                let (y, bias) = unit.forward_leaving_bias(&self.block(b)?.o, works)?;
                let (a2, rstd2) = self.residual_norm(&y, bias, self.norms, works);
                let block = self.block(b)?;
                (block.a2, block.rstd2) = (a2, rstd2);
            }
            DecoderUnit::Up(b) => {
                let affine = self.g.affine_norms;
                let block = self.block(b)?;
                let input = norm_input(&block.a2, unit.vector_parts()?.1, affine, &mut block.n2, works)?;
                let (mut u, bias) = unit.forward_leaving_bias_as(input, Layout::Tiles, works)?;
                let g = activation::forward_keeping_slope_acts(Activation::Gelu, &mut u, bias);
                works.push(Work::Elementwise { ops: 8 * (u.rows() * u.tokens()) as u64 });
                (block.u, block.g) = (u, g);
            }
            DecoderUnit::Down(b) => {
                let (y, bias) = unit.forward_leaving_bias_as(self.block(b)?.g.view(), Layout::Rows, works)?;
                // The last norm feeds the head, a dense matrix: rows.
                let last = b + 1 == self.g.blocks;
                let (a, rstd) =
                    self.residual_norm(&y.into_rows(), bias, if last { Layout::Rows } else { self.norms }, works);
                if !last {
                    self.blocks.push(BlockActs { a1: a, rstd1: rstd, ..BlockActs::default() });
                } else {
                    (self.af, self.rstdf) = (a.into_rows(), rstd);
                    self.x = Mat::default();
                }
            }
            DecoderUnit::Head => {
                let af = Acts::Rows(std::mem::take(&mut self.af));
                let logits = unit.forward_as(
                    norm_input(&af, unit.vector_parts()?.1, self.g.affine_norms, &mut self.nf, works)?,
                    works,
                );
                self.af = af.into_rows();
                return Ok(Some(logits?));
            }
        }
        Ok(None)
    }

    fn start_backward(&mut self, d_logits: Mat) {
        self.pending = Some(Acts::Rows(d_logits));
    }

    fn backward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Grads> {
        match self.g.unit(unit.layer) {
            DecoderUnit::Head => {
                let d_logits = self.pending("the logits")?;
                // The residual stream's gradient starts here: the head reads the final norm of the stream.
                self.dx = Mat::zeros(self.af.rows, self.af.cols);
                let grads = backward_through_norm(
                    unit,
                    ((&self.af).into(), &self.rstdf, self.nf.take()),
                    d_logits.view(),
                    &mut self.dx,
                    works,
                )?;
                (self.af, self.rstdf) = (Mat::default(), Vec::new());
                Ok(grads)
            }
            DecoderUnit::Down(b) => {
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                // The input gradient in the slope's layout, so the two multiply element by element.
                let layout = block.u.layout();
                let (grads, dg) = unit.backward_as(block.g.view(), (&self.dx).into(), Some(layout), works)?;
                let mut du = dg.ok_or_else(missing_input_grad)?.into_layout(layout);
                // Same layout, so value `i` of one is value `i` of the other (their lengths agree in both layouts
                // whenever the tokens fill whole tiles, so a length check alone would not see a mix-up).
                assert_eq!(du.layout(), block.u.layout(), "the MLP's gradient and slope in one layout");
                activation::scale_by_slope(block.u.values(), du.values_mut());
                works.push(Work::Elementwise { ops: 10 * (du.rows() * du.tokens()) as u64 });
                (block.u, block.g) = (Acts::default(), Acts::default());
                self.pending = Some(du);
                Ok(grads)
            }
            DecoderUnit::Up(b) => {
                let du = self.pending("the MLP")?;
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let grads = backward_through_norm(
                    unit,
                    (block.a2.view(), &block.rstd2, block.n2.take()),
                    du.view(),
                    &mut self.dx,
                    works,
                )?;
                (block.a2, block.rstd2) = (Acts::default(), Vec::new());
                Ok(grads)
            }
            DecoderUnit::Proj(b) => {
                let geometry = self.geometry();
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let (grads, d_o) = unit.backward(&block.o, &self.dx, true, works)?;
                let d_o = d_o.ok_or_else(missing_input_grad)?;
                let dqkv = attention::backward(geometry, &block.qkv, &block.probs, &d_o, &mut self.spare);
                let (t, n, heads) = (geometry.context, d_o.cols, geometry.heads);
                let gemm = Work::Gemm { m: t, n: n * heads, k: geometry.width / heads };
                works.extend([gemm, gemm, gemm, gemm, Work::Elementwise { ops: 4 * block.probs.len() as u64 }]);
                self.spare.give(std::mem::take(&mut block.o).data);
                self.spare.give(std::mem::take(&mut block.probs));
                self.pending = Some(Acts::Rows(dqkv));
                Ok(grads)
            }
            DecoderUnit::Qkv(b) => {
                let dqkv = self.pending("attention")?.into_rows();
                let block = self.blocks.get_mut(b).ok_or_else(missing_input_grad)?;
                let grads = backward_through_norm(
                    unit,
                    (block.a1.view(), &block.rstd1, block.n1.take()),
                    (&dqkv).into(),
                    &mut self.dx,
                    works,
                )?;
                self.blocks.truncate(b);
                self.spare.give(dqkv.data);
                Ok(grads)
            }
            DecoderUnit::Embed => {
                // Only the rows that were looked up get a gradient; the stream carries no weights at all.
                // The stream's gradient token-major first (on all cores), so each token adds two contiguous rows.
                let (d, n, v, t) = (self.g.width, self.tokens.len(), self.g.vocab, self.g.context);
                let by_token = small::transpose(&self.dx.data, d, n);
                let mut grad = vec![0.0f32; (v + t) * d];
                for (j, (&tok, g)) in self.tokens.iter().zip(by_token.chunks_exact(d.max(1))).enumerate() {
                    let (te, pe) = self.g.embedding_rows(j, tok);
                    grad[te..te + d].iter_mut().zip(g).for_each(|(a, g)| *a += g);
                    grad[pe..pe + d].iter_mut().zip(g).for_each(|(a, g)| *a += g);
                }
                works.push(Work::Elementwise { ops: 2 * (d * n) as u64 });
                self.dx = Mat::default();
                Ok((grad, Vec::new()))
            }
        }
    }

    fn resident_bytes(&self) -> u64 {
        let mats = [&self.x, &self.af, &self.dx];
        mats.iter().map(|m| m.bytes()).sum::<u64>()
            + self.nf.as_ref().map_or(0, Affine::bytes)
            + self.blocks.iter().map(BlockActs::bytes).sum::<u64>()
            + self.pending.iter().map(Acts::bytes).sum::<u64>()
            + 4 * (self.tokens.len() + self.rstdf.len()) as u64
    }

    fn clear(&mut self) {
        // The activations go; the spare buffers stay for the next step.
        *self = GptNet { spare: std::mem::take(&mut self.spare), ..GptNet::empty(self.g, self.norms) };
    }
}
