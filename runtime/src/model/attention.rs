//! Causal multi-head self-attention, the part of a transformer block that has no weights of its own: it
//! runs on the engine between the QKV projection and the output projection, over activations that never
//! leave it. Each (sequence, head) pair is an independent pair of small GEMMs, so the pairs run in parallel
//! and read Q, K and V in place from the feature-major QKV matrix.

use rayon::prelude::*;

use crate::kernels::dense::{matmul, MatView};
use crate::model::activation::exp;
use crate::tensor::Mat;

/// The attention geometry of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Model width: Q, K and V each take `width` rows of the QKV matrix.
    pub width: usize,
    /// Heads; each attends over `width / heads` features.
    pub heads: usize,
    /// Tokens per sequence: sequences are consecutive runs of this many columns.
    pub context: usize,
}

impl Geometry {
    fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// (Q, K, V) of head `h` of sequence `s` as `head_dim × context` views into `qkv`.
    fn qkv<'a>(&self, qkv: &'a Mat, s: usize, h: usize) -> [MatView<'a>; 3] {
        let (dh, t, n) = (self.head_dim(), self.context, qkv.cols);
        let at = |part: usize| {
            let start = (part * self.width + h * dh) * n + s * t;
            MatView::strided(&qkv.data[start..], dh, t, n)
        };
        [at(0), at(1), at(2)]
    }

    /// Writes a `head_dim × context` block back into the rows of head `h` and the columns of sequence `s`.
    fn scatter(&self, dst: &mut Mat, part: usize, s: usize, h: usize, block: &[f32]) {
        let (dh, t, n) = (self.head_dim(), self.context, dst.cols);
        for r in 0..dh {
            let start = (part * self.width + h * dh + r) * n + s * t;
            dst.data[start..start + t].copy_from_slice(&block[r * t..(r + 1) * t]);
        }
    }
}

/// Attention output (`width × tokens`) from the QKV projection (`3·width × tokens`), and the attention
/// probabilities (one `context × context` matrix per sequence and head, row = query), kept for the backward
/// pass.
pub fn forward(g: Geometry, qkv: &Mat) -> (Mat, Vec<f32>) {
    let (t, dh) = (g.context, g.head_dim());
    let seqs = qkv.cols / t;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut probs = vec![0.0f32; seqs * g.heads * t * t];
    let blocks: Vec<Vec<f32>> = probs
        .par_chunks_mut(t * t)
        .enumerate()
        .map(|(pair, p)| {
            let (s, h) = (pair / g.heads, pair % g.heads);
            let [q, k, v] = g.qkv(qkv, s, h);
            matmul(p, q.t(), k, false);
            for i in 0..t {
                let row = &mut p[i * t..(i + 1) * t];
                let mut max = f32::NEG_INFINITY;
                for x in &mut row[..=i] {
                    *x *= scale;
                    max = max.max(*x);
                }
                let mut sum = 0.0;
                for x in &mut row[..=i] {
                    *x = exp(*x - max);
                    sum += *x;
                }
                let inv = 1.0 / sum;
                row[..=i].iter_mut().for_each(|x| *x *= inv);
                row[i + 1..].fill(0.0);
            }
            let mut o = vec![0.0f32; dh * t];
            matmul(&mut o, v, MatView::new(p, t, t).t(), false);
            o
        })
        .collect();
    let mut out = Mat::zeros(g.width, qkv.cols);
    for (pair, block) in blocks.iter().enumerate() {
        g.scatter(&mut out, 0, pair / g.heads, pair % g.heads, block);
    }
    (out, probs)
}

/// Gradient with respect to the QKV projection (`3·width × tokens`) from the gradient of the attention
/// output, given the forward pass's QKV and probabilities.
pub fn backward(g: Geometry, qkv: &Mat, probs: &[f32], d_out: &Mat) -> Mat {
    let (t, dh, n) = (g.context, g.head_dim(), qkv.cols);
    let scale = 1.0 / (dh as f32).sqrt();
    let blocks: Vec<[Vec<f32>; 3]> = probs
        .par_chunks(t * t)
        .enumerate()
        .map(|(pair, p)| {
            let (s, h) = (pair / g.heads, pair % g.heads);
            let [q, k, v] = g.qkv(qkv, s, h);
            let d_o = MatView::strided(&d_out.data[h * dh * n + s * t..], dh, t, n);
            let pv = MatView::new(p, t, t);
            let mut dv = vec![0.0f32; dh * t];
            matmul(&mut dv, d_o, pv, false);
            let mut ds = vec![0.0f32; t * t];
            matmul(&mut ds, d_o.t(), v, false);
            for i in 0..t {
                let (prow, drow) = (&p[i * t..(i + 1) * t], &mut ds[i * t..(i + 1) * t]);
                let dot: f32 = prow[..=i].iter().zip(&drow[..=i]).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    drow[j] = prow[j] * (drow[j] - dot) * scale;
                }
                drow[i + 1..].fill(0.0);
            }
            let dsv = MatView::new(&ds, t, t);
            let mut dq = vec![0.0f32; dh * t];
            matmul(&mut dq, k, dsv.t(), false);
            let mut dk = vec![0.0f32; dh * t];
            matmul(&mut dk, q, dsv, false);
            [dq, dk, dv]
        })
        .collect();
    let mut dqkv = Mat::zeros(3 * g.width, n);
    for (pair, parts) in blocks.iter().enumerate() {
        for (part, block) in parts.iter().enumerate() {
            g.scatter(&mut dqkv, part, pair / g.heads, pair % g.heads, block);
        }
    }
    dqkv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gradcheck::{assert_central_differences, weighted_sum};

    #[test]
    fn backward_matches_central_differences_and_attention_is_causal() {
        let g = Geometry { width: 4, heads: 2, context: 3 };
        let n = 2 * g.context;
        let qkv = Mat::from_vec(3 * g.width, n, (0..3 * g.width * n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.15).collect());
        let w = Mat::from_vec(g.width, n, (0..g.width * n).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.25).collect());
        let (_, probs) = forward(g, &qkv);
        let dqkv = backward(g, &qkv, &probs, &w);
        assert_central_differences(&qkv, &dqkv, (1e-2, 2e-3), "qkv", |qkv| weighted_sum(&forward(g, qkv).0, &w));
        // A token's output does not depend on later tokens: change the last token's K and V of sequence 0.
        let (base, _) = forward(g, &qkv);
        let mut later = qkv.clone();
        for r in g.width..3 * g.width {
            later.data[r * n + g.context - 1] += 1.0;
        }
        let (moved, _) = forward(g, &later);
        for r in 0..g.width {
            for j in 0..g.context - 1 {
                assert_eq!(base.data[r * n + j], moved.data[r * n + j], "token {j} saw the future");
            }
        }
    }
}
