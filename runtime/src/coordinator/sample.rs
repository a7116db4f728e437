//! Decoding text from a trained language model, the quickest way for a person to see what it learned. MemoryX
//! streams every unit to a local engine once per generated token, exactly as in a forward pass of training,
//! so decoding needs no second copy of the model and works however large it is.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use data::shard::Shard;
use crate::engine::hw::CountingHw;
use crate::engine::role::EngineRole;
use crate::engine::wse::Wse;
use wire::error::{Error, Result};
use crate::memoryx::store::WeightStore;
use plan::layout::{Arch, ModelLayout};
use kernels::tensor::Mat;

/// Longest line decoded.
pub const MAX_LINE: usize = 160;

/// Softmax temperature: a little below 1, so lines stay readable without repeating one guess.
pub const TEMPERATURE: f64 = 0.8;

/// Decodes `n` lines (each started from a newline and ended by the next one, or after [`MAX_LINE`] bytes)
/// in one batch, sampling with a seeded generator. Returns nothing for a model that is not a language model.
pub fn lines(store: &dyn WeightStore, layout: &ModelLayout, n: usize, seed: u64) -> Result<Vec<String>> {
    let Arch::Gpt(g) = layout.arch else { return Ok(Vec::new()) };
    if n == 0 {
        return Ok(Vec::new());
    }
    let t = g.context;
    let mut engine = Wse::new("sampler", layout.clone(), CountingHw::new(u64::MAX));
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5a4d_91e5);
    let mut texts: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut done = vec![false; n];
    for _ in 0..MAX_LINE {
        if done.iter().all(|&d| d) {
            break;
        }
        // Each line's context (a newline, then what it has so far; the last `t` tokens), left-aligned in its
        // window and padded with spaces: attention is causal, so the padding after it changes nothing.
        let mut tokens = vec![f32::from(b' '); n * t];
        let mut last = vec![0usize; n];
        for (i, text) in texts.iter().enumerate() {
            let context: Vec<u8> = std::iter::once(b'\n').chain(text.iter().copied()).collect();
            let window = &context[context.len().saturating_sub(t)..];
            for (k, &b) in window.iter().enumerate() {
                tokens[i * t + k] = f32::from(b);
            }
            last[i] = window.len() - 1;
        }
        let shard = Shard { inputs: Mat::from_vec(1, n * t, tokens), labels: vec![0; n * t] };
        engine.begin_step(shard, 0.0, false)?;
        for l in 0..layout.linears.len() {
            engine.forward(&store.forward_stream(l)?)?;
        }
        let logits = engine.logits().ok_or_else(|| Error::Protocol("the model produced no logits".into()))?;
        for i in 0..n {
            if done[i] {
                continue;
            }
            let col = i * t + last[i];
            let scores: Vec<f64> = (0..logits.rows).map(|v| logits.data[v * logits.cols + col] as f64 / TEMPERATURE).collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let mut pick = rng.random::<f64>() * weights.iter().sum::<f64>();
            let mut token = weights.len() - 1;
            for (v, w) in weights.iter().enumerate() {
                if pick < *w {
                    token = v;
                    break;
                }
                pick -= w;
            }
            if token == usize::from(b'\n') {
                done[i] = true;
            } else {
                texts[i].push(token as u8);
            }
        }
        engine.loss()?;
    }
    Ok(texts.into_iter().map(|t| String::from_utf8_lossy(&t).into_owned()).collect())
}
