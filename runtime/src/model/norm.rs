//! Layer normalisation over the features of each token, without a learned gain or bias: every parameter of
//! the transformer then sits in a matrix that MemoryX streams, and a stream unit stays one matrix. (Models
//! such as OLMo train this way at scale.) Activations are feature-major, so the per-token statistics are
//! running sums over rows — contiguous loops the compiler vectorises.

use multiversion::multiversion;

use crate::tensor::Mat;

/// Added to the variance so a constant token does not divide by zero.
pub const EPS: f32 = 1e-5;

/// Normalises every column of `x` (`features × tokens`) to zero mean and unit variance. Returns the
/// normalised matrix and each token's reciprocal standard deviation, which is all the backward pass needs.
pub fn forward(x: &Mat) -> (Mat, Vec<f32>) {
    let mut out = Mat::zeros(x.rows, x.cols);
    let rstd = forward_into(x, &mut out);
    (out, rstd)
}

/// [`forward`] into an existing matrix of `x`'s shape, compiled for AVX2+FMA as well as the baseline (the
/// release build targets plain x86-64).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn forward_into(x: &Mat, out: &mut Mat) -> Vec<f32> {
    let (d, n) = (x.rows, x.cols);
    let mut mean = vec![0.0f32; n];
    for r in 0..d {
        for (m, v) in mean.iter_mut().zip(x.row(r)) {
            *m += v;
        }
    }
    let inv_d = 1.0 / d.max(1) as f32;
    mean.iter_mut().for_each(|m| *m *= inv_d);
    let mut var = vec![0.0f32; n];
    for r in 0..d {
        for ((s, v), m) in var.iter_mut().zip(x.row(r)).zip(&mean) {
            let c = v - m;
            *s += c * c;
        }
    }
    let rstd: Vec<f32> = var.iter().map(|v| 1.0 / (v * inv_d + EPS).sqrt()).collect();
    for r in 0..d {
        let (src, dst) = (x.row(r), &mut out.data[r * n..(r + 1) * n]);
        for j in 0..n {
            dst[j] = (src[j] - mean[j]) * rstd[j];
        }
    }
    rstd
}

/// Adds to `dx` the gradient with respect to the input, given the normalised output `xhat`, the reciprocal
/// standard deviations and the gradient `dxhat` of the output: `rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂))`
/// per token. Multiversioned like [`forward`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
pub fn backward_add(xhat: &Mat, rstd: &[f32], dxhat: &Mat, dx: &mut Mat) {
    let (d, n) = (xhat.rows, xhat.cols);
    let (mut mean_g, mut mean_gx) = (vec![0.0f32; n], vec![0.0f32; n]);
    for r in 0..d {
        let (g, xh) = (dxhat.row(r), xhat.row(r));
        for j in 0..n {
            mean_g[j] += g[j];
            mean_gx[j] += g[j] * xh[j];
        }
    }
    let inv_d = 1.0 / d.max(1) as f32;
    for r in 0..d {
        let (g, xh) = (dxhat.row(r), xhat.row(r));
        let out = &mut dx.data[r * n..(r + 1) * n];
        for j in 0..n {
            out[j] += rstd[j] * (g[j] - mean_g[j] * inv_d - xh[j] * mean_gx[j] * inv_d);
        }
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
}
