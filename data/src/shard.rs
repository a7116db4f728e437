//! What a step takes from the data: which split it draws from, and an engine's shard of the batch.

use errors::{Error, Result};
use kernels::tensor::Mat;

/// One engine's shard of a step's batch: its samples, features first. (A weight server's part of a layer is
/// a *slice*, never a shard.)
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// `inputs × samples` activations of the input layer.
    pub inputs: Mat,
    /// The class of each sample (the next token of each position, for a language model).
    pub labels: Vec<u32>,
}

impl Shard {
    /// Cuts the shard into consecutive micro-batches of `tokens` columns each (the last one shorter when they do
    /// not divide it); `0`, or a size not smaller than the shard, keeps it whole. Each micro-batch is what one
    /// engine of the full job would have taken, so computing them one at a time reproduces its arithmetic.
    pub fn micro_batches(self, tokens: usize) -> Vec<Shard> {
        let cols = self.inputs.cols;
        if tokens == 0 || tokens >= cols {
            return vec![self];
        }
        let rows = self.inputs.rows;
        (0..cols)
            .step_by(tokens)
            .map(|start| {
                let end = (start + tokens).min(cols);
                let mut data = Vec::with_capacity(rows * (end - start));
                for r in 0..rows {
                    data.extend_from_slice(&self.inputs.row(r)[start..end]);
                }
                Shard { inputs: Mat::from_vec(rows, end - start, data), labels: self.labels[start..end].to_vec() }
            })
            .collect()
    }
}

/// Which data set a step draws its samples from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The training examples: a training step.
    Train,
    /// The held-out examples: an evaluation step (forward only).
    Test,
}

/// Refuses sample indices outside the data set, so a bad request cannot reach the engines' data.
pub fn check_samples(samples: &[u32], len: usize) -> Result<()> {
    match samples.iter().find(|&&i| i as usize >= len) {
        Some(bad) => Err(Error::Protocol(format!("sample {bad} requested but the data set has {len}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Micro-batches are the shard's columns in order, every feature row cut at the same places.
    #[test]
    fn micro_batches_are_consecutive_column_blocks() {
        let inputs = Mat::from_vec(2, 5, vec![0.0, 1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0, 13.0, 14.0]);
        let shard = Shard { inputs, labels: vec![0, 1, 2, 3, 4] };
        let parts = shard.clone().micro_batches(2);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1].inputs, Mat::from_vec(2, 2, vec![2.0, 3.0, 12.0, 13.0]));
        assert_eq!(parts[2].labels, vec![4]);
        assert_eq!(shard.clone().micro_batches(0), vec![shard.clone()]);
        assert_eq!(shard.clone().micro_batches(5), vec![shard]);
    }
}
