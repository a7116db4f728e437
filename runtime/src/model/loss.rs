//! Softmax cross-entropy, where the forward pass turns into the backward pass. Computed per token column
//! in `f64` for the log-sum-exp, so a confident model does not overflow.

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
pub fn softmax_cross_entropy(logits: &Mat, labels: &[u32], scale: f32) -> (LossSum, Mat) {
    let (classes, n) = (logits.rows, logits.cols);
    assert_eq!(labels.len(), n, "one label per sample");
    let mut grad = Mat::zeros(classes, n);
    let mut sum = LossSum { samples: n as u64, ..LossSum::default() };
    for j in 0..n {
        let col = |c: usize| logits.data[c * n + j] as f64;
        let (mut best, mut max) = (0, f64::NEG_INFINITY);
        for c in 0..classes {
            if col(c) > max {
                (best, max) = (c, col(c));
            }
        }
        let total: f64 = (0..classes).map(|c| (col(c) - max).exp()).sum();
        let label = labels[j] as usize;
        sum.loss += total.ln() + max - col(label);
        sum.correct += u64::from(best == label);
        for c in 0..classes {
            let p = (col(c) - max).exp() / total;
            let target = if c == label { 1.0 } else { 0.0 };
            grad.data[c * n + j] = ((p - target) * scale as f64) as f32;
        }
    }
    (sum, grad)
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
