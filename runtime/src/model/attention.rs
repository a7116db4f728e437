//! Causal multi-head self-attention, the part of a transformer block that has no weights of its own: it
//! runs on the engine between the QKV projection and the output projection, over activations that never
//! leave it. Each (sequence, head) pair is an independent pair of small GEMMs, so the pairs run in parallel
//! and read Q, K and V in place from the feature-major QKV matrix.

use rayon::prelude::*;

use multiversion::multiversion;

use crate::model::activation::exp;
#[cfg(test)]
use kernels::dense::{MatView, matmul};
use kernels::small::{self, Band, Dims};
use kernels::tensor::{Mat, Spare};

/// The attention geometry of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Model width: the queries take `width` rows of the QKV matrix, the keys and the values `kv_heads` heads'
    /// rows each.
    pub width: usize,
    /// Query heads; each attends over `width / heads` features.
    pub heads: usize,
    /// Key/value heads (grouped-query attention): query head `h` reads key/value head `h / (heads / kv_heads)`.
    /// As many as `heads` for plain multi-head attention, where the QKV matrix is `3·width` rows.
    pub kv_heads: usize,
    /// Tokens per sequence: sequences are consecutive runs of this many columns.
    pub context: usize,
}

impl Geometry {
    fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Query heads per key/value head.
    fn group(&self) -> usize {
        (self.heads / self.kv_heads.max(1)).max(1)
    }

    /// Rows of the QKV matrix: the queries, then the keys and values of every key/value head.
    pub fn qkv_rows(&self) -> usize {
        self.width + 2 * self.kv_heads * self.head_dim()
    }

    /// Where (Q, K, V) of query head `h` of sequence `s` start in a feature-major QKV matrix of `n` tokens:
    /// each is `head_dim` rows of `context` values, `n` apart. K and V are those of the head's key/value head.
    fn offsets(&self, n: usize, s: usize, h: usize) -> [usize; 3] {
        let (dh, t) = (self.head_dim(), self.context);
        let kv = h / self.group();
        let keys = self.width;
        let values = keys + self.kv_heads * dh;
        [h * dh, keys + kv * dh, values + kv * dh].map(|row| row * n + s * t)
    }

    /// Copies `head_dim` rows of `context` values, `n` apart from `src` on, into `dst` as one contiguous
    /// feature-major block.
    fn pack_rows(&self, dst: &mut [f32], src: &[f32], n: usize) {
        let t = self.context;
        for (r, row) in dst.chunks_exact_mut(t).enumerate() {
            row.copy_from_slice(&src[r * n..r * n + t]);
        }
    }

    /// (Q, K, V) of head `h` of sequence `s` as `head_dim × context` views into `qkv`.
    #[cfg(test)]
    fn qkv<'a>(&self, qkv: &'a Mat, s: usize, h: usize) -> [MatView<'a>; 3] {
        let (dh, t, n) = (self.head_dim(), self.context, qkv.cols);
        self.offsets(n, s, h).map(|start| MatView::strided(&qkv.data[start..], dh, t, n))
    }

    /// Writes a `head_dim × context` block back into the rows of head `h` and the columns of sequence `s`.
    #[cfg(test)]
    fn scatter(&self, dst: &mut Mat, part: usize, s: usize, h: usize, block: &[f32]) {
        let (dh, t, n) = (self.head_dim(), self.context, dst.cols);
        for r in 0..dh {
            let start = (part * self.width + h * dh + r) * n + s * t;
            dst.data[start..start + t].copy_from_slice(&block[r * t..(r + 1) * t]);
        }
    }
}

/// Attention output (`width × tokens`) from the QKV projection (`3·width × tokens`), and the attention
/// probabilities kept for the backward pass: one `context × context` matrix per head and sequence (head-major:
/// all of head 0's sequences first), row = query, zero right of the diagonal.
///
/// Heads run in parallel, each writing its own rows of the output. Every product goes through
/// [`small::matmul_banded`]: the scores are computed only left of the diagonal (in blocks of eight queries)
/// and `V·Pᵀ` sums only over the keys a query can see, so causal attention does about half the square's
/// work. K (read a row per inner index) and the probabilities' transpose are packed per pair; the kernel
/// packs its own panels of Q and V.
/// [`forward_reference`] is the same function through full GEMMs.
///
/// The output and the probabilities come from `spare` (every value is written), so a step reuses the last
/// step's buffers instead of zeroing new ones.
pub fn forward(g: Geometry, qkv: &Mat, spare: &mut Spare) -> (Mat, Vec<f32>) {
    let (t, dh, n) = (g.context, g.head_dim(), qkv.cols);
    let seqs = n / t.max(1);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut probs = spare.take(seqs * g.heads * t * t);
    let mut out = output(spare, g, 1, n, seqs * t);
    if t == 0 || dh == 0 || seqs == 0 {
        probs.fill(0.0);
        return (out, probs);
    }
    let scores = Dims { m: t, n: t, k: dh, a_row: 1, a_col: n, ldb: t, ldc: t };
    let mix = Dims { m: dh, n: t, k: t, a_row: n, a_col: 1, ldb: t, ldc: n };
    out.data.par_chunks_mut(dh * n).zip(probs.par_chunks_mut(seqs * t * t)).enumerate().for_each(
        |(h, (out_h, probs_h))| {
            let (mut pt, mut kp) = (vec![0.0f32; t * t], vec![0.0f32; dh * t]);
            for (s, p) in probs_h.chunks_exact_mut(t * t).enumerate() {
                let [q, k, v] = g.offsets(n, s, h);
                // K is the product's B, read a row per inner index: packed, so its rows are not 8 KiB apart (which
                // would put them all in the same few sets of L1).
                g.pack_rows(&mut kp, &qkv.data[k..], n);
                small::matmul_banded(p, &qkv.data[q..], &kp, scores, Band::LowerC);
                softmax_causal(p, t, scale);
                small::transpose_into(&mut pt, t, p, t, t, t);
                // O = V·Pᵀ: Pᵀ is lower triangular (a key after the query never contributes).
                small::matmul_banded(&mut out_h[s * t..], &qkv.data[v..], &pt, mix, Band::LowerB);
            }
        },
    );
    (out, probs)
}

/// Scales each row `i` of the scores by `scale` and replaces its first `i + 1` entries by their softmax,
/// zeroing the rest: causal masking and the softmax in one pass over a row. Multiversioned for AVX2+FMA (the
/// release build targets plain x86-64), so the polynomial `exp` runs eight lanes wide.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn softmax_causal(p: &mut [f32], t: usize, scale: f32) {
    for (i, row) in p.chunks_exact_mut(t).enumerate() {
        let seen = i + 1;
        let max = lanes(&row[..seen], f32::NEG_INFINITY, f32::max) * scale;
        // Whole groups of sixteen up to the first boundary past the diagonal, with the keys a query cannot see
        // set to zero: no scalar remainder on rows a few dozen keys long. (The scores there are computed, see
        // `Band::LowerC`, so they are finite.) Exponentials first, then their sum: a sum inside the same loop
        // would keep it from vectorising.
        let (head, future) = row.split_at_mut(padded(seen, t));
        for (c, group) in head.chunks_mut(GROUP).enumerate() {
            for (k, x) in group.iter_mut().enumerate() {
                let e = exp(*x * scale - max);
                *x = if c * GROUP + k < seen { e } else { 0.0 };
            }
        }
        let inv = 1.0 / lanes(head, 0.0, |a, b| a + b);
        head.iter_mut().for_each(|x| *x *= inv);
        future.fill(0.0);
    }
}

/// Keys per group of the softmax's passes (one AVX-512 register).
const GROUP: usize = 16;

/// Where a row that sees `seen` keys ends its groups: the next multiple of [`GROUP`], at most the row.
fn padded(seen: usize, t: usize) -> usize {
    seen.next_multiple_of(GROUP).min(t)
}

/// Folds `x` with `f` in eight independent lanes, then the lanes together: a reduction the compiler can keep
/// in one vector register (a single running fold is a dependency chain it must not reorder).
#[inline(always)]
fn lanes(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] = f(acc[j], c[j]);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |a, &b| f(a, b));
    acc.iter().fold(tail, |a, &b| f(a, b))
}

/// An output of `parts` stacked `width × n` blocks (attention's output, or Q's, K's and V's gradients) from
/// `spare`, with every value no (sequence, head) pair writes set to zero: the columns from `covered` on
/// (tokens past the last whole sequence; a shard holds whole sequences, so normally none) and the rows no head
/// owns (when the heads do not divide the width, which validation prevents). With nothing covered, all of it.
fn output(spare: &mut Spare, g: Geometry, parts: usize, n: usize, covered: usize) -> Mat {
    let mut m = Mat::from_vec(parts * g.width, n, spare.take(parts * g.width * n));
    if n == 0 || g.width == 0 {
        return m;
    }
    let owned = if covered == 0 { 0 } else { g.heads * g.head_dim() };
    for part in m.data.chunks_exact_mut(g.width * n) {
        let (rows, rest) = part.split_at_mut(owned * n);
        rest.fill(0.0);
        rows.chunks_exact_mut(n).for_each(|row| row[covered..].fill(0.0));
    }
    m
}

/// The softmax's backward pass on one pair, in place over `dp` (the gradient of the probabilities): row `i`
/// becomes `p ⊙ (dp − p·dp) · scale` left of the diagonal and zero right of it. Multiversioned like
/// [`softmax_causal`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn softmax_causal_backward(p: &[f32], dp: &mut [f32], t: usize, scale: f32) {
    let mut prod = vec![0.0f32; t];
    for (i, (prow, drow)) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)).enumerate() {
        // Whole groups as in the forward pass: past the diagonal the probabilities are zero and `dp` is
        // computed (finite), so those terms add nothing and come out zero.
        let end = padded(i + 1, t);
        for ((o, a), b) in prod.iter_mut().zip(&prow[..end]).zip(&drow[..end]) {
            *o = a * b;
        }
        let dot = lanes(&prod[..end], 0.0, |a, b| a + b);
        for (d, &pv) in drow[..end].iter_mut().zip(&prow[..end]) {
            *d = pv * (*d - dot) * scale;
        }
        drow[end..].fill(0.0);
    }
}

/// Gradient with respect to the QKV projection (`3·width × tokens`) from the gradient of the attention
/// output, given the forward pass's QKV and probabilities (laid out as [`forward`] returns them). Banded like
/// [`forward`]: every product skips the triangle the causal mask zeroes, reads its operands in place and
/// writes its head's rows of the result directly. [`backward_reference`] is the same function through full
/// GEMMs.
///
/// The result comes from `spare` like [`forward`]'s outputs. With grouped-query attention each query head's
/// key and value gradients are computed apart, then summed over its group into the shared key/value head's rows
/// (in head order).
pub fn backward(g: Geometry, qkv: &Mat, probs: &[f32], d_out: &Mat, spare: &mut Spare) -> Mat {
    let per_head = backward_per_head(g, qkv, probs, d_out, spare);
    if g.group() == 1 {
        return per_head;
    }
    let (n, dh, width) = (qkv.cols, g.head_dim(), g.width);
    let mut folded = Mat::from_vec(g.qkv_rows(), n, spare.take(g.qkv_rows() * n));
    folded.data[..width * n].copy_from_slice(&per_head.data[..width * n]);
    for part in 1..3 {
        let src = &per_head.data[part * width * n..(part + 1) * width * n];
        let dst_start = (width + (part - 1) * g.kv_heads * dh) * n;
        let dst = &mut folded.data[dst_start..dst_start + g.kv_heads * dh * n];
        dst.par_chunks_mut(dh * n).enumerate().for_each(|(kv, out)| {
            let heads = &src[kv * g.group() * dh * n..(kv + 1) * g.group() * dh * n];
            out.copy_from_slice(&heads[..dh * n]);
            for h in heads.chunks_exact(dh * n).skip(1) {
                out.iter_mut().zip(h).for_each(|(o, v)| *o += v);
            }
        });
    }
    spare.give(per_head.data);
    folded
}

/// [`backward`] with every query head's key and value gradients in rows of their own (`3·width` rows).
fn backward_per_head(g: Geometry, qkv: &Mat, probs: &[f32], d_out: &Mat, spare: &mut Spare) -> Mat {
    let (t, dh, n) = (g.context, g.head_dim(), qkv.cols);
    let seqs = n / t.max(1);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut dqkv = output(spare, g, 3, n, seqs * t);
    if t == 0 || dh == 0 || seqs == 0 {
        return dqkv;
    }
    // dV = dO·P and dK = Q·dS (P and dS upper triangular read as B); dQ = K·dSᵀ (lower triangular as B).
    let by_probs = Dims { m: dh, n: t, k: t, a_row: n, a_col: 1, ldb: t, ldc: n };
    // dP = dOᵀ·V, left of the diagonal only.
    let d_probs = Dims { m: t, n: t, k: dh, a_row: 1, a_col: n, ldb: t, ldc: t };
    let (dq_all, rest) = dqkv.data.split_at_mut(g.width * n);
    let (dk_all, dv_all) = rest.split_at_mut(g.width * n);
    dq_all
        .par_chunks_mut(dh * n)
        .zip(dk_all.par_chunks_mut(dh * n))
        .zip(dv_all.par_chunks_mut(dh * n))
        .zip(probs.par_chunks(seqs * t * t))
        .enumerate()
        .for_each(|(h, (((dq_h, dk_h), dv_h), probs_h))| {
            let (mut ds, mut dst, mut vp) = (vec![0.0f32; t * t], vec![0.0f32; t * t], vec![0.0f32; dh * t]);
            for (s, p) in probs_h.chunks_exact(t * t).enumerate() {
                let [q, k, v] = g.offsets(n, s, h);
                let d_o = &d_out.data[h * dh * n + s * t..];
                small::matmul_banded(&mut dv_h[s * t..], d_o, p, by_probs, Band::UpperB);
                g.pack_rows(&mut vp, &qkv.data[v..], n);
                small::matmul_banded(&mut ds, d_o, &vp, d_probs, Band::LowerC);
                softmax_causal_backward(p, &mut ds, t, scale);
                small::matmul_banded(&mut dk_h[s * t..], &qkv.data[q..], &ds, by_probs, Band::UpperB);
                small::transpose_into(&mut dst, t, &ds, t, t, t);
                small::matmul_banded(&mut dq_h[s * t..], &qkv.data[k..], &dst, by_probs, Band::LowerB);
            }
        });
    dqkv
}

/// [`forward`] through full GEMMs on strided views, the way it was written first: the tests hold the banded
/// kernels to it.
#[cfg(test)]
pub fn forward_reference(g: Geometry, qkv: &Mat) -> (Mat, Vec<f32>) {
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

/// [`backward`] through full GEMMs on strided views, for the tests.
#[cfg(test)]
pub fn backward_reference(g: Geometry, qkv: &Mat, probs: &[f32], d_out: &Mat) -> Mat {
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
    fn banded_kernels_match_the_gemm_reference() {
        // Shapes with whole tiles (8 or 4 rows × 16 columns) and with ragged edges.
        // The last shape has tokens past its last whole sequence, which attention leaves at zero.
        for (width, heads, context, seqs, past) in [(64, 2, 32, 2, 0), (128, 2, 64, 1, 0), (24, 3, 21, 3, 5)] {
            let g = Geometry { width, heads, kv_heads: heads, context };
            let n = seqs * context + past;
            // Buffers full of NaN stand in for a finished step's: every value the banded kernels leave
            // unwritten would show.
            let mut spare = Spare::default();
            for len in [width * n, seqs * heads * context * context, 3 * width * n] {
                spare.give(vec![f32::NAN; len]);
            }
            let qkv = Mat::from_vec(
                3 * width,
                n,
                (0..3 * width * n).map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 4e-3).collect(),
            );
            let d_out =
                Mat::from_vec(width, n, (0..width * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 2e-3).collect());
            let (o, probs) = forward(g, &qkv, &mut spare);
            let (o_ref, probs_ref) = forward_reference(g, &qkv);
            // The reference keeps the probabilities sequence-major, the banded kernels head-major.
            let tt = context * context;
            let probs_seq_major: Vec<f32> = (0..seqs * heads)
                .flat_map(|pair| probs[((pair % heads) * seqs + pair / heads) * tt..][..tt].to_vec())
                .collect();
            let close = |a: &[f32], b: &[f32], what: &str| {
                assert_eq!(a.len(), b.len());
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
                        "{what}[{i}]: {x} vs {y} ({width}/{heads}/{context})"
                    );
                }
            };
            close(&o.data, &o_ref.data, "output");
            close(&probs_seq_major, &probs_ref, "probabilities");
            let d = backward(g, &qkv, &probs, &d_out, &mut spare);
            let d_ref = backward_reference(g, &qkv, &probs_ref, &d_out);
            close(&d.data, &d_ref.data, "dqkv");
        }
    }

    #[test]
    fn backward_matches_central_differences_and_attention_is_causal() {
        let g = Geometry { width: 4, heads: 2, kv_heads: 2, context: 3 };
        let n = 2 * g.context;
        let qkv =
            Mat::from_vec(3 * g.width, n, (0..3 * g.width * n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.15).collect());
        let w = Mat::from_vec(g.width, n, (0..g.width * n).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.25).collect());
        let spare = &mut Spare::default();
        let (_, probs) = forward(g, &qkv, spare);
        let dqkv = backward(g, &qkv, &probs, &w, spare);
        assert_central_differences(&qkv, &dqkv, (1e-2, 2e-3), "qkv", |qkv| {
            weighted_sum(&forward(g, qkv, &mut Spare::default()).0, &w)
        });
        // A token's output does not depend on later tokens: change the last token's K and V of sequence 0.
        let (base, _) = forward(g, &qkv, spare);
        let mut later = qkv.clone();
        for r in g.width..3 * g.width {
            later.data[r * n + g.context - 1] += 1.0;
        }
        let (moved, _) = forward(g, &later, spare);
        for r in 0..g.width {
            for j in 0..g.context - 1 {
                assert_eq!(base.data[r * n + j], moved.data[r * n + j], "token {j} saw the future");
            }
        }
    }

    /// Grouped-query attention is multi-head attention over keys and values repeated for every query head of a
    /// group: the same output, and key/value gradients that are the group's sums.
    #[test]
    fn grouped_query_attention_is_repeated_keys_and_values() {
        let (width, heads, kv_heads, context, seqs) = (24, 6, 2, 7, 2);
        let (dh, n) = (width / heads, context * seqs);
        let gqa = Geometry { width, heads, kv_heads, context };
        let mha = Geometry { kv_heads: heads, ..gqa };
        let qkv = Mat::from_vec(
            gqa.qkv_rows(),
            n,
            (0..gqa.qkv_rows() * n).map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 4e-3).collect(),
        );
        // The same keys and values, each repeated for the query heads of its group.
        let mut repeated = Mat::zeros(3 * width, n);
        repeated.data[..width * n].copy_from_slice(&qkv.data[..width * n]);
        for part in 1..3 {
            for h in 0..heads {
                let src = (width + (part - 1) * kv_heads * dh + (h / (heads / kv_heads)) * dh) * n;
                let dst = (part * width + h * dh) * n;
                repeated.data[dst..dst + dh * n].copy_from_slice(&qkv.data[src..src + dh * n]);
            }
        }
        let d_out =
            Mat::from_vec(width, n, (0..width * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 2e-3).collect());
        let spare = &mut Spare::default();
        let (o, probs) = forward(gqa, &qkv, spare);
        let (o_mha, probs_mha) = forward(mha, &repeated, spare);
        assert_eq!(o.data, o_mha.data);
        assert_eq!(probs, probs_mha);
        let d = backward(gqa, &qkv, &probs, &d_out, spare);
        let d_mha = backward(mha, &repeated, &probs_mha, &d_out, spare);
        assert_eq!(d.rows, gqa.qkv_rows());
        assert_eq!(d.data[..width * n], d_mha.data[..width * n], "query gradients");
        for part in 1..3 {
            for kv in 0..kv_heads {
                for i in 0..dh * n {
                    let sum: f32 = (0..heads / kv_heads)
                        .map(|k| d_mha.data[(part * width + (kv * heads / kv_heads + k) * dh) * n + i])
                        .fold(0.0, |a, b| a + b);
                    assert_eq!(d.data[(width + (part - 1) * kv_heads * dh + kv * dh) * n + i], sum);
                }
            }
        }
        assert_central_differences(&qkv, &d, (1e-2, 2e-3), "gqa", |qkv| {
            weighted_sum(&forward(gqa, qkv, &mut Spare::default()).0, &d_out)
        });
    }
}
