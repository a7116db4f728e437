//! The models the figures are drawn for: GPT-3's shapes and batches (Brown et al., 2020, table 2.1) at a
//! 2,048-token context, and a 1T model of Megatron-LM's shape whose batch is GPT-3 175B's extrapolated along
//! Kaplan et al.'s (2020) critical-batch law, `B ∝ N^(α_N/α_B)` with α_N = 0.076 and α_B = 0.21.

use serde::Serialize;

use crate::cost::{LayerWork, Workload};

/// Tokens per sample in every reported model.
pub const SEQ_LEN: usize = 2048;

/// Seed of every sampled mask in the reports, so they are reproducible.
const SEED: u64 = 2021;

/// Kaplan et al.'s exponent of loss in parameters.
const ALPHA_N: f64 = 0.076;
/// Kaplan et al.'s exponent of critical batch in loss.
const ALPHA_B: f64 = 0.21;

/// A decoder-only transformer: the shape the scaling laws relate to a parameter count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transformer {
    /// How the model is known.
    pub name: String,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Blocks.
    pub layers: usize,
    /// Global batch in tokens.
    pub batch_tokens: usize,
    /// Where the batch comes from.
    pub batch_source: String,
}

impl Transformer {
    fn gpt3(name: &str, d_model: usize, layers: usize, batch_tokens: usize) -> Self {
        Transformer { name: name.into(), d_model, layers, batch_tokens, batch_source: "GPT-3 paper".into() }
    }

    /// Weights of the blocks (`12 · layers · d²`: attention's four `d × d` and the MLP's two `d × 4d`), the
    /// count the scaling laws use.
    pub fn params(&self) -> u64 {
        12 * (self.layers * self.d_model * self.d_model) as u64
    }

    /// One block's weight layers, masked at `sparsity`: QKV (`d → 3d`), attention output (`d → d`), MLP up
    /// (`d → 4d`) and down (`4d → d`).
    pub fn workload(&self, sparsity: f64) -> Workload {
        let d = self.d_model;
        let density = 1.0 - sparsity;
        let shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)];
        let layers = shapes
            .iter()
            .enumerate()
            .map(|(i, &(inp, out))| LayerWork::sampled(inp, out, density, SEED + i as u64, true))
            .collect();
        Workload {
            layers,
            repeat: self.layers,
            global_tokens: self.batch_tokens,
            tokens_per_sample: SEQ_LEN,
            loss_classes: 0,
        }
    }
}

/// The widths of the acceleration figure: GPT-3 Small, 6.7B and 175B.
pub fn sparsity_models() -> Vec<Transformer> {
    vec![
        Transformer::gpt3("GPT-3 125M", 768, 12, 500_000),
        Transformer::gpt3("GPT-3 6.7B", 4096, 32, 2_000_000),
        Transformer::gpt3("GPT-3 175B", 12288, 96, 3_200_000),
    ]
}

/// The model of the funnel figure: the seeds' 175 B class.
pub fn funnel_model() -> Transformer {
    Transformer::gpt3("GPT-3 175B", 12288, 96, 3_200_000)
}

/// The models of the scaling figure: GPT-3 1.3B, 13B and 175B, and a 1T model.
pub fn scaling_models() -> Vec<Transformer> {
    let gpt3_175b = Transformer::gpt3("GPT-3 175B", 12288, 96, 3_200_000);
    let mut one_t = Transformer {
        name: "1T".into(),
        d_model: 25_600,
        layers: 128,
        batch_tokens: 0,
        batch_source: "GPT-3 175B's batch scaled by Kaplan's critical-batch law".into(),
    };
    let ratio = one_t.params() as f64 / gpt3_175b.params() as f64;
    one_t.batch_tokens = (gpt3_175b.batch_tokens as f64 * ratio.powf(ALPHA_N / ALPHA_B)).round() as usize;
    vec![
        Transformer::gpt3("GPT-3 1.3B", 2048, 24, 1_000_000),
        Transformer::gpt3("GPT-3 13B", 5140, 40, 2_000_000),
        gpt3_175b,
        one_t,
    ]
}
