//! Layer normalisation over the features of each token. A plain norm has no learned gain or bias: every
//! parameter of the transformer then sits in a matrix that MemoryX streams, and a stream unit stays one matrix
//! (models such as OLMo train this way at scale). An affine norm (GPT-2's) adds a gain and a bias per feature,
//! applied by [`affine`] once they arrive with the unit that reads the norm. Activations are feature-major, so
//! the per-token statistics are running sums over rows — contiguous loops the compiler vectorises.

use std::mem::MaybeUninit;

use multiversion::multiversion;

use kernels::tensor::{Mat, TOKENS_PER_TASK, written_once};
use kernels::tiles::{self, Acts, ActsRef, Layout, TILE, Tiles};

// `backward_add` splits a task's tokens at tile boundaries, which needs a task to be whole tiles.
const _: () = assert!(TOKENS_PER_TASK.is_multiple_of(TILE));

/// Added to the variance so a constant token does not divide by zero.
pub const EPS: f32 = 1e-5;

/// Normalises every column of `x` (`features × tokens`) to zero mean and unit variance. Returns the
/// normalised matrix and each token's reciprocal standard deviation, which is all the backward pass needs.
/// The statistics split over the cores by tokens and the normalisation by rows; the output is written once.
pub fn forward(x: &Mat) -> (Mat, Vec<f32>) {
    let (out, rstd) = forward_as(x, Layout::Rows);
    (out.into_rows(), rstd)
}

/// [`forward`] with the normalised matrix in `layout`: in the sparse kernels' tiles when a sparse layer reads
/// it next (QKV and MLP-up, forward and backward), which then need not pack it. The values are the same.
pub fn forward_as(x: &Mat, layout: Layout) -> (Acts, Vec<f32>) {
    use rayon::prelude::*;
    let (d, n) = (x.rows, x.cols);
    assert_eq!(x.data.len(), d * n, "norm: a {d}x{n} matrix holds {} values", x.data.len());
    let (mut mean, mut rstd) = (vec![0.0f32; n], vec![0.0f32; n]);
    mean.par_chunks_mut(TOKENS_PER_TASK)
        .zip(rstd.par_chunks_mut(TOKENS_PER_TASK))
        .enumerate()
        .for_each(|(c, (mean, rstd))| statistics(x, c * TOKENS_PER_TASK, mean, rstd));
    let out = match layout {
        // SAFETY: every piece is one whole row of `n` values and `normalise_row` writes each of them (it checks
        // the lengths against the row of `x` it reads).
        Layout::Rows => Acts::Rows(Mat::from_vec(d, n, unsafe {
            written_once(d * n, n, |start, dst| normalise_row(&x.data[start..start + n], &mean, &rstd, dst))
        })),
        Layout::Tiles => {
            let write = |r: usize, t0: usize, lane: &mut [MaybeUninit<f32>]| {
                let t1 = t0 + lane.len();
                normalise_row(&x.row(r)[t0..t1], &mean[t0..t1], &rstd[t0..t1], lane);
            };
            // SAFETY: `deal_rows` writes every slot, padding included.
            Acts::Tiles(unsafe { Tiles::written_once(d, n, |out| tiles::deal_rows(d, n, out, write)) })
        }
    };
    (out, rstd)
}

/// Mean and reciprocal standard deviation of the tokens `j0..j0 + mean.len()`, summing over rows in order.
/// Compiled for AVX2+FMA as well as the baseline (the release build targets plain x86-64).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn statistics(x: &Mat, j0: usize, mean: &mut [f32], rstd: &mut [f32]) {
    let (d, w) = (x.rows, mean.len());
    for r in 0..d {
        for (m, v) in mean.iter_mut().zip(&x.row(r)[j0..j0 + w]) {
            *m += v;
        }
    }
    let inv_d = 1.0 / d.max(1) as f32;
    mean.iter_mut().for_each(|m| *m *= inv_d);
    let var = rstd;
    for r in 0..d {
        for ((s, v), m) in var.iter_mut().zip(&x.row(r)[j0..j0 + w]).zip(&*mean) {
            let c = v - m;
            *s += c * c;
        }
    }
    var.iter_mut().for_each(|v| *v = 1.0 / (*v * inv_d + EPS).sqrt());
}

/// One feature's row normalised with each token's statistics. Multiversioned like [`statistics`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn normalise_row(src: &[f32], mean: &[f32], rstd: &[f32], dst: &mut [MaybeUninit<f32>]) {
    assert!(src.len() == dst.len() && mean.len() == dst.len() && rstd.len() == dst.len(), "norm: row lengths");
    for (((o, &v), &m), &r) in dst.iter_mut().zip(src).zip(mean).zip(rstd) {
        o.write((v - m) * r);
    }
}

/// Adds to `dx` the gradient with respect to the input, given the normalised output `xhat`, the reciprocal
/// standard deviations and the gradient `dxhat` of the output: `rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂))`
/// per token. Split over the cores like [`forward`], with the same sums in the same order.
pub fn backward_add(xhat: ActsRef<'_>, rstd: &[f32], dxhat: &Mat, dx: &mut Mat) {
    use rayon::prelude::*;
    let (d, n) = (xhat.rows(), xhat.tokens());
    let shape = |m: &Mat| (m.rows, m.cols, m.data.len());
    assert!(
        shape(dxhat) == (d, n, d * n) && shape(dx) == (d, n, d * n) && rstd.len() == n,
        "norm backward: x̂, its gradient and the input gradient must all be {d}x{n}, with {n} statistics"
    );
    // Each token's sums over the features, in row order, a tile's worth of tokens at a time (x̂ may be in
    // tiles): a task's tokens split at tile boundaries (a multiple of which a task is) sum exactly as whole.
    // Rows are read a task's (or a row's) worth at a time, as before tiles existed.
    let segment = match xhat {
        ActsRef::Tiles(_) => TILE,
        ActsRef::Rows(_) => n.max(1),
    };
    let (mut mean_g, mut mean_gx) = (vec![0.0f32; n], vec![0.0f32; n]);
    mean_g.par_chunks_mut(TOKENS_PER_TASK).zip(mean_gx.par_chunks_mut(TOKENS_PER_TASK)).enumerate().for_each(
        |(c, (g, gx))| {
            let part = segment.min(TOKENS_PER_TASK);
            for (s, (g, gx)) in g.chunks_mut(part).zip(gx.chunks_mut(part)).enumerate() {
                let (j0, w) = (c * TOKENS_PER_TASK + s * part, g.len());
                for r in 0..d {
                    gradient_sums(xhat.row_segment(r, j0, w), &dxhat.row(r)[j0..j0 + w], g, gx);
                }
            }
        },
    );
    let inv_d = 1.0 / d.max(1) as f32;
    if n == 0 {
        return;
    }
    dx.data.par_chunks_exact_mut(n).zip(dxhat.data.par_chunks_exact(n)).enumerate().for_each(|(r, (out, g))| {
        for (t, (out, g)) in out.chunks_mut(segment).zip(g.chunks(segment)).enumerate() {
            let (j0, w) = (t * segment, out.len());
            let stats = (&rstd[j0..j0 + w], &mean_g[j0..j0 + w], &mean_gx[j0..j0 + w]);
            backward_row(out, g, xhat.row_segment(r, j0, w), stats, inv_d);
        }
    });
}

/// Adds one feature's `dx̂` and `dx̂ ⊙ x̂` to each token's sums over the features (the caller goes through the
/// features in order). Multiversioned like [`statistics`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn gradient_sums(xh: &[f32], g: &[f32], sum_g: &mut [f32], sum_gx: &mut [f32]) {
    let w = sum_g.len();
    let (g, xh, sum_gx) = (&g[..w], &xh[..w], &mut sum_gx[..w]);
    for j in 0..w {
        sum_g[j] += g[j];
        sum_gx[j] += g[j] * xh[j];
    }
}

/// One feature's row of the input gradient, added into `out`. Multiversioned like [`statistics`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn backward_row(out: &mut [f32], g: &[f32], xh: &[f32], (rstd, sum_g, sum_gx): (&[f32], &[f32], &[f32]), inv_d: f32) {
    let n = out.len();
    let (g, xh, rstd, sum_g, sum_gx) = (&g[..n], &xh[..n], &rstd[..n], &sum_g[..n], &sum_gx[..n]);
    for j in 0..n {
        out[j] += rstd[j] * (g[j] - sum_g[j] * inv_d - xh[j] * sum_gx[j] * inv_d);
    }
}

/// `x̂` with row `r` scaled by `gain[r]` and shifted by `bias[r]`: an affine norm's output, which the next
/// matrix reads.
pub fn affine(xhat: &Mat, gain: &[f32], bias: &[f32]) -> Mat {
    use rayon::prelude::*;
    assert!(gain.len() == xhat.rows && bias.len() == xhat.rows, "norm: one gain and one bias per feature");
    let n = xhat.cols;
    let mut out = Mat::zeros(xhat.rows, n);
    if n > 0 {
        out.data.par_chunks_exact_mut(n).zip(xhat.data.par_chunks_exact(n)).zip(gain.par_iter().zip(bias)).for_each(
            |((o, x), (g, b))| {
                o.iter_mut().zip(x).for_each(|(o, x)| *o = g * x + b);
            },
        );
    }
    out
}

/// Backward through [`affine`] given `da`, the gradient of its output: returns the gain's gradient
/// (`Σ_tokens da ⊙ x̂` per feature) and the bias's (`Σ_tokens da`), and turns `da` into the gradient of `x̂`
/// (`g ⊙ da`), which [`backward_add`] then takes.
pub fn affine_backward(xhat: &Mat, gain: &[f32], da: &mut Mat) -> (Vec<f32>, Vec<f32>) {
    use rayon::prelude::*;
    let (d, n) = (xhat.rows, xhat.cols);
    assert!(
        da.rows == d && da.cols == n && gain.len() == d,
        "norm: x̂ and its gradient must both be {d}x{n}, with {d} gains"
    );
    if n == 0 {
        return (vec![0.0; d], vec![0.0; d]);
    }
    da.data
        .par_chunks_exact_mut(n)
        .zip(xhat.data.par_chunks_exact(n))
        .zip(gain.par_iter())
        .map(|((g, x), gain)| {
            let (mut dgain, mut dbias) = (0.0f32, 0.0f32);
            for (g, x) in g.iter_mut().zip(x) {
                dgain += *g * x;
                dbias += *g;
                *g *= gain;
            }
            (dgain, dbias)
        })
        .unzip()
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the references are written as the plain loops of their formulas
mod tests {
    use super::*;
    use crate::model::gradcheck::{assert_central_differences, weighted_sum};

    #[test]
    fn affine_backward_matches_central_differences_for_input_gain_and_bias() {
        let (d, n) = (5, 4);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect());
        let w = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.2).collect());
        let gain: Vec<f32> = (0..d).map(|i| 0.5 + 0.25 * i as f32).collect();
        let bias: Vec<f32> = (0..d).map(|i| 0.1 * i as f32 - 0.2).collect();
        let objective = |x: &Mat, gain: &[f32], bias: &[f32]| weighted_sum(&affine(&forward(x).0, gain, bias), &w);
        let (xhat, rstd) = forward(&x);
        let mut da = w.clone();
        let (dgain, dbias) = affine_backward(&xhat, &gain, &mut da);
        let mut dx = Mat::zeros(d, n);
        backward_add((&xhat).into(), &rstd, &da, &mut dx);
        assert_central_differences(&x, &dx, (1e-2, 2e-3), "x", |x| objective(x, &gain, &bias));
        let g = Mat::from_vec(d, 1, gain.clone());
        assert_central_differences(&g, &Mat::from_vec(d, 1, dgain), (1e-2, 2e-3), "gain", |g| {
            objective(&x, &g.data, &bias)
        });
        let b = Mat::from_vec(d, 1, bias.clone());
        assert_central_differences(&b, &Mat::from_vec(d, 1, dbias), (1e-2, 2e-3), "bias", |b| {
            objective(&x, &gain, &b.data)
        });
    }

    #[test]
    fn backward_matches_central_differences() {
        let (d, n) = (5, 3);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect());
        let g = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.2).collect());
        let (xhat, rstd) = forward(&x);
        let mut dx = Mat::zeros(d, n);
        backward_add((&xhat).into(), &rstd, &g, &mut dx);
        assert_central_differences(&x, &dx, (1e-2, 2e-3), "x", |x| weighted_sum(&forward(x).0, &g));
        // Each column is normalised.
        for j in 0..n {
            let col: Vec<f32> = (0..d).map(|r| xhat.data[r * n + j]).collect();
            let mean: f32 = col.iter().sum::<f32>() / d as f32;
            let var: f32 = col.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3);
        }
    }

    /// The normalised matrix in tiles, and the input gradient from it, are the rows' bit for bit, over a ragged
    /// last tile and a ragged last task.
    #[test]
    fn tiles_give_the_rows_values() {
        let (d, n) = (7, 2 * TOKENS_PER_TASK + TILE + 9);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect());
        let g = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 0.01).collect());
        let (rows, rstd) = forward_as(&x, Layout::Rows);
        let (tiles, rstd_t) = forward_as(&x, Layout::Tiles);
        assert_eq!(rstd_t, rstd);
        let Acts::Rows(xhat) = &rows else { panic!("rows asked for") };
        assert_eq!(tiles, Acts::Tiles(Tiles::from_rows(xhat)), "values and zero padding");
        let (mut dx, mut dx_t) = (Mat::zeros(d, n), Mat::zeros(d, n));
        backward_add(rows.view(), &rstd, &g, &mut dx);
        backward_add(tiles.view(), &rstd, &g, &mut dx_t);
        assert_eq!(dx_t, dx);
    }

    /// More tokens than one task takes, in a ragged last piece: the split gives the sequential sums bit for bit.
    #[test]
    fn split_statistics_equal_the_sequential_ones() {
        let (d, n) = (5, 600);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect());
        let g = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 0.01).collect());
        let (xhat, rstd) = forward(&x);
        let mut dx = Mat::zeros(d, n);
        backward_add((&xhat).into(), &rstd, &g, &mut dx);
        for j in 0..n {
            let col: Vec<f32> = (0..d).map(|r| x.data[r * n + j]).collect();
            let inv_d = 1.0 / d as f32;
            let mean = col.iter().fold(0.0f32, |a, v| a + v) * inv_d;
            let var = col.iter().fold(0.0f32, |a, v| a + (v - mean) * (v - mean));
            let r = 1.0 / (var * inv_d + EPS).sqrt();
            assert_eq!(rstd[j], r, "token {j}");
            let (mut sg, mut sgx) = (0.0f32, 0.0f32);
            for row in 0..d {
                assert_eq!(xhat.data[row * n + j], (col[row] - mean) * r, "token {j} feature {row}");
                sg += g.data[row * n + j];
                sgx += g.data[row * n + j] * xhat.data[row * n + j];
            }
            for row in 0..d {
                let (gv, xh) = (g.data[row * n + j], xhat.data[row * n + j]);
                assert_eq!(dx.data[row * n + j], 0.0 + r * (gv - sg * inv_d - xh * sgx * inv_d), "gradient {j}, {row}");
            }
        }
    }
}
