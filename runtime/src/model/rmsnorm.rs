//! Root-mean-square normalisation with a learned gain, as every Llama-family block normalises its input:
//! `y = g ⊙ x / √(mean(x²) + ε)` per token. The gain streams with the matrix that reads the normalised stream
//! (see [`plan::layout::LinearShape::gain`]), so the statistics are taken as soon as the residual stream is
//! ready and the gain is applied when its unit arrives. Activations are feature-major: the per-token sums run
//! over rows, in row order, a contiguous loop per row.

use rayon::prelude::*;

use kernels::tensor::{Mat, TOKENS_PER_TASK};

/// Normalises every column of `x` (`features × tokens`) to unit root mean square, before the gain: `x̂` and
/// each token's `1 / √(mean(x²) + ε)`, all the backward pass needs with the gain.
pub fn forward(x: &Mat, eps: f32) -> (Mat, Vec<f32>) {
    let (d, n) = (x.rows, x.cols);
    assert_eq!(x.data.len(), d * n, "rmsnorm: a {d}x{n} matrix holds {} values", x.data.len());
    let mut rstd = vec![0.0f32; n];
    rstd.par_chunks_mut(TOKENS_PER_TASK).enumerate().for_each(|(c, rstd)| {
        let (j0, w) = (c * TOKENS_PER_TASK, rstd.len());
        for r in 0..d {
            for (s, v) in rstd.iter_mut().zip(&x.row(r)[j0..j0 + w]) {
                *s += v * v;
            }
        }
        let inv_d = 1.0 / d.max(1) as f32;
        rstd.iter_mut().for_each(|s| *s = 1.0 / (*s * inv_d + eps).sqrt());
    });
    let mut xhat = Mat::zeros(d, n);
    if n > 0 {
        xhat.data.par_chunks_exact_mut(n).zip(x.data.par_chunks_exact(n)).for_each(|(out, x)| {
            for ((o, v), r) in out.iter_mut().zip(x).zip(&rstd) {
                *o = v * r;
            }
        });
    }
    (xhat, rstd)
}

/// `x̂` with row `r` scaled by `gain[r]`: the normalised stream the next matrix reads.
pub fn apply_gain(xhat: &Mat, gain: &[f32]) -> Mat {
    assert_eq!(gain.len(), xhat.rows, "rmsnorm: one gain per feature");
    let n = xhat.cols;
    let mut out = Mat::zeros(xhat.rows, n);
    if n > 0 {
        out.data.par_chunks_exact_mut(n).zip(xhat.data.par_chunks_exact(n)).zip(gain.par_iter()).for_each(
            |((o, x), g)| {
                o.iter_mut().zip(x).for_each(|(o, x)| *o = g * x);
            },
        );
    }
    out
}

/// The backward pass given `da`, the gradient of the gained output: returns the gain's gradient
/// (`Σ_tokens da ⊙ x̂` per feature) and adds the input's, `rstd · (g ⊙ da − x̂ · mean(g ⊙ da ⊙ x̂))` per token, to
/// `dx`.
#[allow(clippy::needless_range_loop)] // `r` indexes the gain and picks the rows: one loop over features
pub fn backward_add(xhat: &Mat, rstd: &[f32], gain: &[f32], da: &Mat, dx: &mut Mat) -> Vec<f32> {
    let (d, n) = (xhat.rows, xhat.cols);
    let shape = |m: &Mat| (m.rows, m.cols, m.data.len());
    assert!(
        shape(da) == (d, n, d * n) && shape(dx) == (d, n, d * n) && rstd.len() == n && gain.len() == d,
        "rmsnorm backward: x̂, its gradient and the input gradient must all be {d}x{n}, with {n} statistics and {d} gains"
    );
    let dgain: Vec<f32> = if n == 0 {
        vec![0.0; d]
    } else {
        xhat.data
            .par_chunks_exact(n)
            .zip(da.data.par_chunks_exact(n))
            .map(|(x, g)| x.iter().zip(g).map(|(x, g)| x * g).sum())
            .collect()
    };
    let mut dot = vec![0.0f32; n];
    dot.par_chunks_mut(TOKENS_PER_TASK).enumerate().for_each(|(c, dot)| {
        let (j0, w) = (c * TOKENS_PER_TASK, dot.len());
        for r in 0..d {
            for ((s, x), g) in dot.iter_mut().zip(&xhat.row(r)[j0..j0 + w]).zip(&da.row(r)[j0..j0 + w]) {
                *s += gain[r] * g * x;
            }
        }
        let inv_d = 1.0 / d.max(1) as f32;
        dot.iter_mut().for_each(|s| *s *= inv_d);
    });
    if n > 0 {
        dx.data
            .par_chunks_exact_mut(n)
            .zip(xhat.data.par_chunks_exact(n))
            .zip(da.data.par_chunks_exact(n))
            .zip(gain.par_iter())
            .for_each(|(((out, x), g), gain)| {
                for j in 0..n {
                    out[j] += rstd[j] * (gain * g[j] - x[j] * dot[j]);
                }
            });
    }
    dgain
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the references are written as the plain loops of their formulas
mod tests {
    use super::*;
    use crate::model::gradcheck::{assert_central_differences, weighted_sum};

    fn sample(d: usize, n: usize, k: usize) -> Mat {
        Mat::from_vec(d, n, (0..d * n).map(|i| ((i * k % 11) as f32 - 5.0) * 0.3).collect())
    }

    #[test]
    fn backward_matches_central_differences_for_input_and_gain() {
        let (d, n, eps) = (5, 4, 1e-5);
        let (x, w) = (sample(d, n, 7), sample(d, n, 5));
        let gain: Vec<f32> = (0..d).map(|i| 0.5 + 0.25 * i as f32).collect();
        let objective = |x: &Mat, gain: &[f32]| weighted_sum(&apply_gain(&forward(x, eps).0, gain), &w);
        let (xhat, rstd) = forward(&x, eps);
        let mut dx = Mat::zeros(d, n);
        let dgain = backward_add(&xhat, &rstd, &gain, &w, &mut dx);
        assert_central_differences(&x, &dx, (1e-2, 2e-3), "x", |x| objective(x, &gain));
        let g = Mat::from_vec(d, 1, gain.clone());
        assert_central_differences(&g, &Mat::from_vec(d, 1, dgain), (1e-2, 2e-3), "gain", |g| objective(&x, &g.data));
        // Each column has unit root mean square before the gain.
        for j in 0..n {
            let ms: f32 = (0..d).map(|r| xhat.data[r * n + j].powi(2)).sum::<f32>() / d as f32;
            assert!((ms - 1.0).abs() < 1e-3, "token {j}: mean square {ms}");
        }
    }

    /// More tokens than one task takes, ragged: the split statistics are the sequential ones bit for bit.
    #[test]
    fn split_statistics_equal_the_sequential_ones() {
        let (d, n, eps) = (3, 2 * TOKENS_PER_TASK + 5, 1e-6);
        let x = sample(d, n, 13);
        let (_, rstd) = forward(&x, eps);
        for j in 0..n {
            let s = (0..d).fold(0.0f32, |a, r| a + x.data[r * n + j] * x.data[r * n + j]);
            assert_eq!(rstd[j], 1.0 / (s * (1.0 / d as f32) + eps).sqrt(), "token {j}");
        }
    }
}
