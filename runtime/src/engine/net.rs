//! What a model family is to the engine: the math of each stream unit over the activations it keeps.

use super::hw::Work;
use super::linear::{Grads, StreamedLinear};
use errors::{Error, Result};
use kernels::tensor::Mat;

/// The model-specific half of the engine program: the math of each stream unit over the activations the
/// engine keeps. [`super::wse::Wse`] does everything the model families share — step order, shape checks, the SRAM
/// budget, the loss and the counters — so a family is only its layers.
pub(super) trait Net: Send {
    /// Takes a new shard's input matrix, dropping whatever the previous step left.
    fn begin(&mut self, inputs: Mat) -> Result<()>;
    /// Runs `unit` forward and notes the work done; returns the logits when it is the model's last unit.
    fn forward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Option<Mat>>;
    /// Starts the backward pass from the gradient of the loss with respect to the logits.
    fn start_backward(&mut self, d_logits: Mat);
    /// Runs `unit` backward and returns its weight and bias gradients (in the stream's weight order).
    fn backward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Grads>;
    /// Bytes of activations held right now.
    fn resident_bytes(&self) -> u64;
    /// Drops everything held.
    fn clear(&mut self);
}

/// A language model's input row as token ids, each checked to be a whole number inside the vocabulary of
/// `vocab` tokens: the input workers send token ids as floats, and a bad one must fail the step, not index
/// past the embedding.
pub(super) fn token_ids(inputs: &Mat, vocab: usize) -> Result<Vec<u32>> {
    let limit = vocab as f32;
    if let Some(bad) = inputs.data.iter().find(|&&t| !(t >= 0.0 && t < limit && t.fract() == 0.0)) {
        return Err(Error::Protocol(format!("token {bad} is not in the vocabulary of {vocab} tokens")));
    }
    Ok(inputs.data.iter().map(|&t| t as u32).collect())
}

/// The error for a unit whose input gradient the linear backward did not return (it always does when asked).
pub(super) fn missing_input_grad() -> Error {
    Error::Protocol("the input gradient was not computed".into())
}
