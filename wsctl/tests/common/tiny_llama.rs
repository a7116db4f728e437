//! A small synthetic Hugging Face `LlamaForCausalLM` folder, every tensor with distinct values so one read into
//! the wrong place shows: what the Llama import/export tests (`wsctl/tests/huggingface.rs`) and the cluster
//! e2e suite (a model on a data volume) start from.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

/// The synthetic model's shape: width 32, 4 query heads over 2 key/value heads, 2 blocks, SwiGLU of 48.
pub const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 32,
 "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": TIED}"#;

/// Every tensor of the synthetic model with its shape, in `LlamaForCausalLM`'s names.
pub fn tensors(tied: bool) -> Vec<(String, Vec<usize>)> {
    let (w, dh, i, v) = (32, 8, 48, 256);
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, w])];
    for b in 0..2 {
        let l = |n: &str| format!("model.layers.{b}.{n}.weight");
        t.extend([
            (l("input_layernorm"), vec![w]),
            (l("self_attn.q_proj"), vec![4 * dh, w]),
            (l("self_attn.k_proj"), vec![2 * dh, w]),
            (l("self_attn.v_proj"), vec![2 * dh, w]),
            (l("self_attn.o_proj"), vec![w, 4 * dh]),
            (l("post_attention_layernorm"), vec![w]),
            (l("mlp.gate_proj"), vec![i, w]),
            (l("mlp.up_proj"), vec![i, w]),
            (l("mlp.down_proj"), vec![w, i]),
        ]);
    }
    t.push(("model.norm.weight".into(), vec![w]));
    if !tied {
        t.push(("lm_head.weight".into(), vec![v, w]));
    }
    t
}

/// Distinct values for every tensor, so a tensor read into the wrong place shows.
pub fn values(k: usize, n: usize) -> Vec<f32> {
    (0..n).map(|j| (((j * 7919 + k * 104_729) % 2003) as f32 - 1001.0) / 4000.0).collect()
}

pub fn serialize(named: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = named.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, TensorView<'_>)> = named
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    safetensors::tensor::serialize(views, None).unwrap()
}

/// Writes the synthetic folder: `config.json` and the weights in one file, or in two shards with an index.
pub fn write_folder(dir: &Path, tied: bool, sharded: bool) -> HashMap<String, Vec<f32>> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG.replace("TIED", if tied { "true" } else { "false" })).unwrap();
    let named: Vec<(String, Vec<usize>, Vec<f32>)> = tensors(tied)
        .into_iter()
        .enumerate()
        .map(|(k, (n, s))| {
            let len = s.iter().product();
            (n, s, values(k, len))
        })
        .collect();
    if sharded {
        let (a, b) = named.split_at(named.len() / 2);
        let mut map = serde_json::Map::new();
        for (file, part) in [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)] {
            std::fs::write(dir.join(file), serialize(part)).unwrap();
            part.iter().for_each(|(n, _, _)| {
                map.insert(n.clone(), file.into());
            });
        }
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
        )
        .unwrap();
    } else {
        std::fs::write(dir.join("model.safetensors"), serialize(&named)).unwrap();
    }
    named.into_iter().map(|(n, _, v)| (n, v)).collect()
}
