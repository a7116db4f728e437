//! What a step takes from the data: which split it draws from, and an engine's shard of the batch.

use kernels::tensor::Mat;
use wire::error::{Error, Result};

/// One engine's shard of a step's batch: its samples, features first. (A weight server's part of a layer is
/// a *slice*, never a shard.)
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// `inputs × samples` activations of the input layer.
    pub inputs: Mat,
    /// The class of each sample (the next token of each position, for a language model).
    pub labels: Vec<u32>,
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
