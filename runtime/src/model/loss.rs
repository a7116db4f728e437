//! Softmax cross-entropy, where the forward pass turns into the backward pass.

use std::mem::MaybeUninit;

use multiversion::multiversion;

use crate::model::activation::exp;
use kernels::tensor::{Mat, TOKENS_PER_TASK, written_once};

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
    assert_eq!(logits.data.len(), classes * n, "loss: a {classes}x{n} matrix holds {} values", logits.data.len());
    let mut sum = LossSum { samples: n as u64, ..LossSum::default() };
    if n == 0 {
        return (sum, Mat::zeros(classes, n));
    }
    let (mut max, mut best, mut total) = (vec![f32::NEG_INFINITY; n], vec![0u32; n], vec![0.0f64; n]);
    max.par_chunks_mut(TOKENS_PER_TASK)
        .zip(best.par_chunks_mut(TOKENS_PER_TASK))
        .zip(total.par_chunks_mut(TOKENS_PER_TASK))
        .enumerate()
        .for_each(|(c, ((max, best), total))| sample_statistics(logits, c * TOKENS_PER_TASK, max, best, total));
    let inv: Vec<f32> = total.iter().map(|t| (1.0 / t) as f32).collect();
    // SAFETY: every piece is one whole row of `n` values and `gradient_row` writes each of them (it checks the
    // lengths against the row of logits it reads).
    let mut grad = unsafe {
        written_once(classes * n, n, |start, g| {
            gradient_row(&logits.data[start..start + n], (start / n) as u32, (&max, &inv, labels), scale, g)
        })
    };
    for (j, &label) in labels.iter().enumerate() {
        let at = label as usize * n + j;
        let (logit, e) = (logits.data[at], exp(logits.data[at] - max[j]) as f64);
        sum.loss += total[j].ln() + max[j] as f64 - logit as f64;
        sum.correct += u64::from(best[j] as usize == label as usize);
        // The label's own entry is p − 1, which cancels as p nears 1: in f64 it is minus the other classes'
        // share, exactly as summed.
        grad[at] = (-(total[j] - e) / total[j] * scale as f64) as f32;
    }
    (sum, Mat::from_vec(classes, n, grad))
}

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
fn gradient_row(
    row: &[f32],
    class: u32,
    (max, inv, labels): (&[f32], &[f32], &[u32]),
    scale: f32,
    g: &mut [MaybeUninit<f32>],
) {
    let n = g.len();
    assert!(row.len() == n && max.len() == n && inv.len() == n && labels.len() == n, "loss: row lengths");
    for j in 0..n {
        let target = if labels[j] == class { 1.0 } else { 0.0 };
        g[j].write((exp(row[j] - max[j]) * inv[j] - target) * scale);
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the references are written as the plain loops of their formulas
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

    /// More samples than one task takes, in a ragged last piece, against the textbook formula in `f64`; and the
    /// label's entry of a confident sample keeps its precision (p − 1 cancels in `f32`).
    #[test]
    fn many_samples_match_the_f64_formula() {
        let (classes, n) = (7, 600);
        let mut logits =
            Mat::from_vec(classes, n, (0..classes * n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.02).collect());
        let mut labels: Vec<u32> = (0..n).map(|j| (j * 5 % classes) as u32).collect();
        // Sample 0 is confident: its label's logit far above the rest.
        labels[0] = 3;
        for c in 0..classes {
            logits.data[c * n] = if c == 3 { 12.0 } else { 0.0 };
        }
        let (sum, grad) = softmax_cross_entropy(&logits, &labels, 0.25);
        let (mut loss, mut correct) = (0.0f64, 0);
        for j in 0..n {
            let col: Vec<f64> = (0..classes).map(|c| logits.data[c * n + j] as f64).collect();
            let max = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = col.iter().map(|v| (v - max).exp()).sum();
            let label = labels[j] as usize;
            loss += total.ln() + max - col[label];
            let best = (0..classes).fold(0, |b, c| if col[c] > col[b] { c } else { b });
            correct += u64::from(best == label);
            for c in 0..classes {
                let want = (((col[c] - max).exp() / total) - f64::from(c == label)) * 0.25;
                let got = grad.data[c * n + j] as f64;
                assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-3), "sample {j} class {c}: {got} vs {want}");
            }
        }
        assert!((sum.loss - loss).abs() < 1e-4 * loss, "{} vs {loss}", sum.loss);
        assert_eq!((sum.correct, sum.samples), (correct, n as u64));
        // 1 − p is about 3.7e-5 here; the label's entry holds it to a few parts in a million.
        let want = -6.0 / (12.0f64.exp() + 6.0) * 0.25;
        assert!(((grad.data[3 * n] as f64 - want) / want).abs() < 1e-5, "{} vs {want}", grad.data[3 * n]);
    }
}
