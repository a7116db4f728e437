//! Softmax cross-entropy, where the forward pass turns into the backward pass.

use std::mem::MaybeUninit;

use multiversion::multiversion;

use crate::model::activation::exp;
use crate::tensor::Mat;

/// What one shard contributes to a step's loss report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSum {
    /// Sum of per-sample losses (not the mean: sums from engines add up exactly).
    pub loss: f64,
    /// Samples whose arg-max class equals the label.
    pub correct: u64,
    /// Samples in the sum.
    pub samples: u64,
}

impl LossSum {
    /// Adds another shard's sums, as SwarmX does on the way back.
    pub fn add(&mut self, other: &LossSum) {
        self.loss += other.loss;
        self.correct += other.correct;
        self.samples += other.samples;
    }
}

/// Loss sums for `logits` (`classes × samples`) against `labels`, and the gradient of `scale · Σ loss` with
/// respect to the logits. `scale` is 1 / global batch, so gradients summed over engines give the batch mean.
///
/// Each sample's maximum is subtracted before the exponentials (so a confident model does not overflow) and
/// their sum is kept in `f64`. The work runs along the rows of the feature-major logits, which are contiguous,
/// on all cores: per-sample statistics split by samples, the gradient by classes.
pub fn softmax_cross_entropy(logits: &Mat, labels: &[u32], scale: f32) -> (LossSum, Mat) {
    use rayon::prelude::*;
    let (classes, n) = (logits.rows, logits.cols);
    assert_eq!(labels.len(), n, "one label per sample");
    assert!(labels.iter().all(|&l| (l as usize) < classes), "every label names one of the {classes} classes");
    let mut sum = LossSum { samples: n as u64, ..LossSum::default() };
    if n == 0 || classes == 0 {
        return (sum, Mat::zeros(classes, n));
    }
    let (mut max, mut best, mut total) = (vec![f32::NEG_INFINITY; n], vec![0u32; n], vec![0.0f64; n]);
    max.par_chunks_mut(SAMPLES)
        .zip(best.par_chunks_mut(SAMPLES))
        .zip(total.par_chunks_mut(SAMPLES))
        .enumerate()
        .for_each(|(c, ((max, best), total))| sample_statistics(logits, c * SAMPLES, max, best, total));
    for (j, &label) in labels.iter().enumerate() {
        let label = label as usize;
        sum.loss += total[j].ln() + max[j] as f64 - logits.data[label * n + j] as f64;
        sum.correct += u64::from(best[j] as usize == label);
    }
    let inv: Vec<f32> = total.iter().map(|t| (1.0 / t) as f32).collect();
    let mut grad = Vec::with_capacity(classes * n);
    grad.spare_capacity_mut()[..classes * n]
        .par_chunks_exact_mut(n)
        .zip(logits.data.par_chunks_exact(n))
        .enumerate()
        .for_each(|(c, (g, row))| gradient_row(row, c as u32, (&max, &inv, labels), scale, g));
    // SAFETY: n > 0, so the first classes·n slots are `classes` rows of n, each written whole by
    // `gradient_row` (which checks its lengths).
    unsafe { grad.set_len(classes * n) };
    (sum, Mat::from_vec(classes, n, grad))
}

/// Samples per parallel piece of the per-sample statistics.
const SAMPLES: usize = 256;

/// For samples `j0..j0 + max.len()`: the largest logit, its class (the first on ties) and the sum of the
/// exponentials after subtracting it. Compiled for AVX2+FMA as well as the baseline, so the polynomial `exp`
/// vectorises.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn sample_statistics(logits: &Mat, j0: usize, max: &mut [f32], best: &mut [u32], total: &mut [f64]) {
    let w = max.len();
    for c in 0..logits.rows {
        let row = &logits.row(c)[j0..j0 + w];
        for ((m, b), &v) in max.iter_mut().zip(best.iter_mut()).zip(row) {
            if v > *m {
                (*m, *b) = (v, c as u32);
            }
        }
    }
    for c in 0..logits.rows {
        let row = &logits.row(c)[j0..j0 + w];
        for ((t, &m), &v) in total.iter_mut().zip(&*max).zip(row) {
            *t += exp(v - m) as f64;
        }
    }
}

/// Row `class` of the gradient: `(softmax − one-hot) · scale` for every sample. Multiversioned like
/// [`sample_statistics`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn gradient_row(row: &[f32], class: u32, (max, inv, labels): (&[f32], &[f32], &[u32]), scale: f32, g: &mut [MaybeUninit<f32>]) {
    let n = g.len();
    assert!(row.len() == n && max.len() == n && inv.len() == n && labels.len() == n, "loss: row lengths");
    for j in 0..n {
        let target = if labels[j] == class { 1.0 } else { 0.0 };
        g[j].write((exp(row[j] - max[j]) * inv[j] - target) * scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gradcheck::assert_central_differences;

    #[test]
    fn gradient_matches_central_differences() {
        let logits = Mat::from_vec(3, 2, vec![0.5, -1.0, 2.0, 0.3, -0.7, 1.1]);
        let labels = [2u32, 0];
        let (_, grad) = softmax_cross_entropy(&logits, &labels, 0.5);
        // The gradient was scaled by 0.5: so is the objective.
        let objective = |l: &Mat| 0.5 * softmax_cross_entropy(l, &labels, 1.0).0.loss;
        assert_central_differences(&logits, &grad, (1e-3, 1e-4), "logit", objective);
    }

    #[test]
    fn huge_logits_do_not_overflow() {
        let logits = Mat::from_vec(2, 1, vec![1e30, -1e30]);
        let (sum, grad) = softmax_cross_entropy(&logits, &[0], 1.0);
        assert!(sum.loss.is_finite() && grad.data.iter().all(|g| g.is_finite()));
        assert_eq!(sum.correct, 1);
    }
}
