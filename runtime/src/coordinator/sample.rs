//! Decoding text from a trained language model, the quickest way for a person to see what it learned. MemoryX
//! streams every unit to a local engine once per generated token, exactly as in a forward pass of training,
//! so decoding needs no second copy of the model and works however large it is.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::hw::CountingHw;
use crate::engine::role::{EngineRole, ShardWork};
use crate::engine::wse::Wse;
use crate::memoryx::store::WeightStore;
use data::shard::Shard;
use errors::{Error, Result};
use kernels::tensor::Mat;
use plan::layout::{Arch, ModelLayout};

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
        engine.begin_step(shard, ShardWork::eval())?;
        for l in 0..layout.linears.len() {
            engine.forward(&store.forward_stream(l)?)?;
        }
        let logits = engine.logits().ok_or_else(|| Error::Protocol("the model produced no logits".into()))?;
        for i in 0..n {
            if done[i] {
                continue;
            }
            let col = i * t + last[i];
            let scores: Vec<f64> =
                (0..logits.rows).map(|v| logits.data[v * logits.cols + col] as f64 / TEMPERATURE).collect();
            let token = draw(&mut rng, &scores);
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

/// A token drawn from the softmax of `scores` (already divided by the temperature).
fn draw(rng: &mut ChaCha8Rng, scores: &[f64]) -> usize {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let mut pick = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (v, w) in weights.iter().enumerate() {
        if pick < *w {
            return v;
        }
        pick -= w;
    }
    weights.len().saturating_sub(1)
}

/// How [`continuation`] picks each next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decoding {
    /// The most likely token, every time.
    Greedy,
    /// A token drawn from the softmax at this temperature, with this seed.
    Sampled {
        /// Softmax temperature (above 0).
        temperature: f64,
        /// Seed of the draws.
        seed: u64,
    },
}

/// Up to `new_tokens` tokens continuing `prompt` (token ids), stopping early at `stop`. Each token is one
/// forward pass of the model's units streamed from `store`, over the last `context` tokens (the layout's
/// context; the window is left-aligned and padded after the text, which causal attention never reads). Works
/// for every language model family.
pub fn continuation(
    store: &dyn WeightStore,
    layout: &ModelLayout,
    prompt: &[u32],
    new_tokens: usize,
    decoding: Decoding,
    stop: Option<u32>,
) -> Result<Vec<u32>> {
    let t = layout.tokens_per_sample();
    if !layout.is_language_model() || t == 0 {
        return Err(Error::Protocol("only a language model continues text".into()));
    }
    let vocab = layout.outputs();
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::Data(format!("the prompt holds token {bad}, beyond the model's vocabulary of {vocab}")));
    }
    let mut engine = Wse::new("generator", layout.clone(), CountingHw::new(u64::MAX));
    let mut rng = match decoding {
        Decoding::Sampled { seed, .. } => Some(ChaCha8Rng::seed_from_u64(seed)),
        Decoding::Greedy => None,
    };
    let mut text: Vec<u32> = prompt.to_vec();
    let mut out = Vec::with_capacity(new_tokens);
    for _ in 0..new_tokens {
        let window = &text[text.len().saturating_sub(t)..];
        let mut tokens = vec![0.0f32; t];
        for (k, &id) in window.iter().enumerate() {
            tokens[k] = id as f32;
        }
        let last = window.len().saturating_sub(1);
        engine.begin_step(Shard { inputs: Mat::from_vec(1, t, tokens), labels: vec![0; t] }, ShardWork::eval())?;
        for l in 0..layout.linears.len() {
            engine.forward(&store.forward_stream(l)?)?;
        }
        let logits = engine.logits().ok_or_else(|| Error::Protocol("the model produced no logits".into()))?;
        let scores: Vec<f64> = (0..logits.rows).map(|v| logits.data[v * logits.cols + last] as f64).collect();
        let token = match (decoding, rng.as_mut()) {
            (Decoding::Sampled { temperature, .. }, Some(rng)) => {
                let scaled: Vec<f64> = scores.iter().map(|s| s / temperature.max(1e-6)).collect();
                draw(rng, &scaled)
            }
            _ => {
                scores
                    .iter()
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |best, (v, &s)| if s > best.1 { (v, s) } else { best })
                    .0
            }
        };
        engine.loss()?;
        if Some(token as u32) == stop {
            break;
        }
        text.push(token as u32);
        out.push(token as u32);
    }
    Ok(out)
}
