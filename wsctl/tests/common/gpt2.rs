//! GPT-2 as Hugging Face `transformers` defines it, written out from its definition and independent of the
//! engine: the check an exported model is held to (by `wsctl/tests/export.rs` and the cluster e2e suite).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

/// GPT-2 as Hugging Face `transformers` defines it (`GPT2LMHeadModel`), written out from its definition:
/// only the exported files are read.
pub struct Gpt2 {
    pub tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
    pub embd: usize,
    pub inner: usize,
    pub heads: usize,
    pub layers: usize,
    pub positions: usize,
    pub vocab: usize,
    pub eps: f32,
    pub tied: bool,
}

impl Gpt2 {
    pub fn load(dir: &Path) -> Gpt2 {
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["model_type"], "gpt2");
        assert_eq!(config["architectures"][0], "GPT2LMHeadModel");
        assert_eq!(config["activation_function"], "gelu_new");
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(
            meta.metadata().as_ref().and_then(|m| m.get("format")).map(String::as_str),
            Some("pt"),
            "transformers needs format pt"
        );
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                assert_eq!(view.dtype(), safetensors::Dtype::F32);
                let values =
                    view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                (name, (view.shape().to_vec(), values))
            })
            .collect();
        let n = |k: &str| config[k].as_u64().unwrap_or_else(|| panic!("config.json {k}")) as usize;
        Gpt2 {
            tensors,
            embd: n("n_embd"),
            inner: n("n_inner"),
            heads: n("n_head"),
            layers: n("n_layer"),
            positions: n("n_positions"),
            vocab: n("vocab_size"),
            eps: config["layer_norm_epsilon"].as_f64().unwrap() as f32,
            tied: config["tie_word_embeddings"].as_bool().unwrap(),
        }
    }

    /// A tensor by its GPT-2 name, checked to have `shape`.
    fn t(&self, name: &str, shape: &[usize]) -> &[f32] {
        let (s, v) = self.tensors.get(name).unwrap_or_else(|| panic!("model.safetensors has no {name}"));
        assert_eq!(s, shape, "{name}");
        v
    }

    fn layer_norm(&self, x: &[f32], prefix: &str) -> Vec<f32> {
        let (g, b) =
            (self.t(&format!("{prefix}.weight"), &[self.embd]), self.t(&format!("{prefix}.bias"), &[self.embd]));
        let n = x.len() as f32;
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let r = 1.0 / (var + self.eps).sqrt();
        x.iter().zip(g).zip(b).map(|((v, g), b)| (v - mean) * r * g + b).collect()
    }

    /// GPT-2's `Conv1D`: `y = x · W + b` with `W` stored `[inputs, outputs]`.
    fn conv1d(&self, x: &[f32], prefix: &str, outputs: usize) -> Vec<f32> {
        let w = self.t(&format!("{prefix}.weight"), &[x.len(), outputs]);
        let mut y = self.t(&format!("{prefix}.bias"), &[outputs]).to_vec();
        for (i, xi) in x.iter().enumerate() {
            for (o, yo) in y.iter_mut().enumerate() {
                *yo += xi * w[i * outputs + o];
            }
        }
        y
    }

    /// The summed cross-entropy (nats) of predicting `labels[p]` after `tokens[..=p]`, for every position.
    pub fn loss(&self, tokens: &[usize], labels: &[usize]) -> f64 {
        let (e, nh) = (self.embd, self.heads);
        let dh = e / nh;
        let (wte, wpe) = (
            self.t("transformer.wte.weight", &[self.vocab, e]),
            self.t("transformer.wpe.weight", &[self.positions, e]),
        );
        let mut h: Vec<Vec<f32>> = tokens
            .iter()
            .enumerate()
            .map(|(p, &tok)| (0..e).map(|d| wte[tok * e + d] + wpe[p * e + d]).collect())
            .collect();
        for l in 0..self.layers {
            let pre = format!("transformer.h.{l}");
            let qkv: Vec<Vec<f32>> = h
                .iter()
                .map(|x| self.conv1d(&self.layer_norm(x, &format!("{pre}.ln_1")), &format!("{pre}.attn.c_attn"), 3 * e))
                .collect();
            for p in 0..h.len() {
                let mut merged = vec![0.0f32; e];
                for head in 0..nh {
                    let q = &qkv[p][head * dh..(head + 1) * dh];
                    // causal: position p attends to positions 0..=p
                    let scores: Vec<f64> = (0..=p)
                        .map(|j| {
                            let k = &qkv[j][e + head * dh..e + (head + 1) * dh];
                            q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>() / (dh as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for (j, wj) in weights.iter().enumerate() {
                        let v = &qkv[j][2 * e + head * dh..2 * e + (head + 1) * dh];
                        for d in 0..dh {
                            merged[head * dh + d] += (wj / total) as f32 * v[d];
                        }
                    }
                }
                let attn = self.conv1d(&merged, &format!("{pre}.attn.c_proj"), e);
                h[p].iter_mut().zip(&attn).for_each(|(x, a)| *x += a);
            }
            for x in &mut h {
                let up =
                    self.conv1d(&self.layer_norm(x, &format!("{pre}.ln_2")), &format!("{pre}.mlp.c_fc"), self.inner);
                let act: Vec<f32> = up
                    .iter()
                    .map(|&u| {
                        0.5 * u * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (u + 0.044715 * u.powi(3))).tanh())
                    })
                    .collect();
                let down = self.conv1d(&act, &format!("{pre}.mlp.c_proj"), e);
                x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
            }
        }
        let head = if self.tied { wte } else { self.t("lm_head.weight", &[self.vocab, e]) };
        let mut sum = 0.0;
        for (x, &label) in h.iter().zip(labels) {
            let f = self.layer_norm(x, "transformer.ln_f");
            let logits: Vec<f64> =
                (0..self.vocab).map(|v| (0..e).map(|d| (head[v * e + d] * f[d]) as f64).sum()).collect();
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + logits.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
            sum += lse - logits[label];
        }
        sum
    }
}
