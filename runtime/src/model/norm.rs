//! Layer normalisation over the features of each token, without a learned gain or bias: every parameter of
//! the transformer then sits in a matrix that MemoryX streams, and a stream unit stays one matrix. (Models
//! such as OLMo train this way at scale.) Activations are feature-major, so the per-token statistics are
//! running sums over rows — contiguous loops the compiler vectorises.

use std::mem::MaybeUninit;

use multiversion::multiversion;

use crate::tensor::{written_once, Mat, TOKENS_PER_TASK};

/// Added to the variance so a constant token does not divide by zero.
pub const EPS: f32 = 1e-5;

/// Normalises every column of `x` (`features × tokens`) to zero mean and unit variance. Returns the
/// normalised matrix and each token's reciprocal standard deviation, which is all the backward pass needs.
/// The statistics split over the cores by tokens and the normalisation by rows; the output is written once.
pub fn forward(x: &Mat) -> (Mat, Vec<f32>) {
    use rayon::prelude::*;
    let (d, n) = (x.rows, x.cols);
    assert_eq!(x.data.len(), d * n, "norm: a {d}x{n} matrix holds {} values", x.data.len());
    let (mut mean, mut rstd) = (vec![0.0f32; n], vec![0.0f32; n]);
    mean.par_chunks_mut(TOKENS_PER_TASK)
        .zip(rstd.par_chunks_mut(TOKENS_PER_TASK))
        .enumerate()
        .for_each(|(c, (mean, rstd))| statistics(x, c * TOKENS_PER_TASK, mean, rstd));
    // SAFETY: every piece is one whole row of `n` values and `normalise_row` writes each of them (it checks the
    // lengths against the row of `x` it reads).
    let out = unsafe { written_once(d * n, n, |start, dst| normalise_row(&x.data[start..start + n], &mean, &rstd, dst)) };
    (Mat::from_vec(d, n, out), rstd)
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
pub fn backward_add(xhat: &Mat, rstd: &[f32], dxhat: &Mat, dx: &mut Mat) {
    use rayon::prelude::*;
    let (d, n) = (xhat.rows, xhat.cols);
    let shape = |m: &Mat| (m.rows, m.cols, m.data.len());
    assert!(
        shape(dxhat) == (d, n, d * n) && shape(dx) == (d, n, d * n) && xhat.data.len() == d * n && rstd.len() == n,
        "norm backward: x̂, its gradient and the input gradient must all be {d}x{n}, with {n} statistics"
    );
    let (mut mean_g, mut mean_gx) = (vec![0.0f32; n], vec![0.0f32; n]);
    mean_g
        .par_chunks_mut(TOKENS_PER_TASK)
        .zip(mean_gx.par_chunks_mut(TOKENS_PER_TASK))
        .enumerate()
        .for_each(|(c, (g, gx))| gradient_sums(xhat, dxhat, c * TOKENS_PER_TASK, g, gx));
    let inv_d = 1.0 / xhat.rows.max(1) as f32;
    if n == 0 {
        return;
    }
    dx.data
        .par_chunks_exact_mut(n)
        .zip(dxhat.data.par_chunks_exact(n).zip(xhat.data.par_chunks_exact(n)))
        .for_each(|(out, (g, xh))| backward_row(out, g, xh, (rstd, &mean_g, &mean_gx), inv_d));
}

/// Per token, the sums of `dx̂` and of `dx̂ ⊙ x̂` over the features, for tokens `j0..j0 + g.len()`.
/// Multiversioned like [`statistics`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn gradient_sums(xhat: &Mat, dxhat: &Mat, j0: usize, sum_g: &mut [f32], sum_gx: &mut [f32]) {
    let w = sum_g.len();
    for r in 0..xhat.rows {
        let (g, xh) = (&dxhat.row(r)[j0..j0 + w], &xhat.row(r)[j0..j0 + w]);
        for j in 0..w {
            sum_g[j] += g[j];
            sum_gx[j] += g[j] * xh[j];
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gradcheck::{assert_central_differences, weighted_sum};

    #[test]
    fn backward_matches_central_differences() {
        let (d, n) = (5, 3);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect());
        let g = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.2).collect());
        let (xhat, rstd) = forward(&x);
        let mut dx = Mat::zeros(d, n);
        backward_add(&xhat, &rstd, &g, &mut dx);
        assert_central_differences(&x, &dx, (1e-2, 2e-3), "x", |x| weighted_sum(&forward(x).0, &g));
        // Each column is normalised.
        for j in 0..n {
            let col: Vec<f32> = (0..d).map(|r| xhat.data[r * n + j]).collect();
            let mean: f32 = col.iter().sum::<f32>() / d as f32;
            let var: f32 = col.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3);
        }
    }

    /// More tokens than one task takes, in a ragged last piece: the split gives the sequential sums bit for bit.
    #[test]
    fn split_statistics_equal_the_sequential_ones() {
        let (d, n) = (5, 600);
        let x = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect());
        let g = Mat::from_vec(d, n, (0..d * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 0.01).collect());
        let (xhat, rstd) = forward(&x);
        let mut dx = Mat::zeros(d, n);
        backward_add(&xhat, &rstd, &g, &mut dx);
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
