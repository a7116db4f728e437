//! The example decoders captured from PyTorch (`tests/programs`, written by `make.py`) import as programs with
//! the units, vectors and stages their modules describe, and a module with an operation the engine lacks is
//! refused naming it and its line.

use plan::program::import::read;
use plan::program::{Op, UnitKind};
use std::path::PathBuf;

fn folder(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(name)
}

#[test]
fn a_qwen_style_decoder_is_units_vectors_and_stages() {
    let p = read(&folder("qwen")).expect("imports");
    assert_eq!((p.context, p.vocab, p.module.as_str()), (8, 32, "QwenStyle"));
    // The embedding, per block q, k, v, o, gate, up, down, then the head tied to the embedding.
    assert_eq!(p.units.len(), 1 + 2 * 7 + 1);
    assert_eq!(p.units[0].kind, UnitKind::Embedding);
    let head = p.units.last().expect("a head");
    assert_eq!((head.kind, head.tied_to, head.inputs, head.outputs), (UnitKind::Linear, Some(0), 16, 32));
    let q = &p.units[1];
    assert_eq!(q.bias.as_deref(), Some("layers.0.self_attn.q_proj.bias"));
    // The input norm's gain streams with q, the first unit after it; q's bias leads the vector.
    let gains: Vec<&str> = q.vectors.iter().map(|&v| p.params[v].name.as_str()).collect();
    assert_eq!(gains, ["layers.0.input_layernorm.weight"]);
    assert_eq!(p.vector_len(1), 16 + 16);
    // The final norm's gain streams with the head.
    let last = p.units.len() - 1;
    assert_eq!(p.units[last].vectors.iter().map(|&v| p.params[v].name.as_str()).collect::<Vec<_>>(), ["norm.weight"]);
    // Stages cover every node once, in order.
    let covered: usize = (0..p.units.len()).map(|u| p.stage(u).len()).sum();
    assert_eq!(covered, p.nodes.len());
    for (u, unit) in p.units.iter().enumerate() {
        assert!(p.stage(u).contains(&unit.node), "unit {u} runs in its own stage");
    }
    assert!(p.nodes.iter().any(|n| matches!(n.op, Op::Attention { causal: true, .. })));
    assert!(p.nodes.iter().any(|n| matches!(n.op, Op::RepeatInterleave { repeats: 2, .. })));
    assert_eq!(p.constants.len(), 4, "each block's cos and sin tables");
}

#[test]
fn gpt_j_and_gpt_2_style_decoders_import() {
    let j = read(&folder("gptj")).expect("imports");
    assert_eq!(j.units.len(), 1 + 2 * 6 + 1);
    assert!(j.units.iter().all(|u| u.tied_to.is_none()), "GPT-J's head is its own");
    assert_eq!(j.units.last().and_then(|u| u.bias.as_deref()), Some("lm_head.bias"));
    let g = read(&folder("gpt2")).expect("imports");
    // Token and position embeddings, per block c_attn, c_proj, mlp_fc, mlp_proj, then the tied head.
    assert_eq!(g.units.len(), 2 + 2 * 4 + 1);
    assert_eq!(g.units[1].kind, UnitKind::Embedding);
    assert!(g.nodes.iter().any(|n| matches!(n.op, Op::MaskedFill { value } if value == f32::NEG_INFINITY)));
    assert!(g.nodes.iter().any(|n| n.op == Op::Softmax));
}

#[test]
fn a_research_decoder_maps_its_einsums_onto_products() {
    let p = read(&folder("research")).expect("imports");
    // Per block qkv, out, the x @ W weight (transposed) and w_out; then two heads.
    assert_eq!(p.units.len(), 1 + 2 * 4 + 2);
    assert!(p.units[3].transposed, "x @ W stores W inputs × outputs");
    assert_eq!(p.nodes.iter().filter(|n| n.op == Op::MatMul).count(), 4, "two einsums a block");
    assert!(p.nodes.iter().any(|n| matches!(n.op, Op::Triangle { upper: false, diagonal: 0 })));
    assert!(p.nodes.iter().any(|n| matches!(n.op, Op::Clamp { .. })));
}

#[test]
fn an_fft_is_refused_naming_it_and_its_line() {
    let Err(e) = read(&folder("fft")) else { panic!("an FFT imported") };
    let text = e.to_string();
    match e {
        errors::Error::UnsupportedModel { op, at, .. } => {
            assert_eq!(op, "aten.fft_fft.default");
            assert!(at.starts_with("decoders.py:") && at.contains("torch.fft.fft"), "{at}");
        }
        other => panic!("{other:?}"),
    }
    assert!(text.contains("docs/programs.md"), "{text}");
}

#[test]
fn a_program_of_another_format_or_none_at_all_is_refused() {
    let dir = std::env::temp_dir().join(format!("ws-program-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    assert!(matches!(read(&dir), Err(errors::Error::Io { .. })));
    std::fs::write(dir.join("program.json"), r#"{"format":"other/9","inputs":[],"nodes":[]}"#).expect("written");
    let e = read(&dir).expect_err("refused");
    assert!(e.to_string().contains("capture the module again"), "{e}");
    std::fs::write(dir.join("program.json"), "[1,2").expect("written");
    assert!(read(&dir).expect_err("refused").to_string().contains("weightstream.from_torch"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_value_too_large_to_plan_is_refused_before_anything_is_sized() {
    let text = std::fs::read_to_string(folder("qwen").join("program.json")).expect("the fixture");
    let mut program: serde_json::Value = serde_json::from_str(&text).expect("json");
    let nodes = program["nodes"].as_array_mut().expect("nodes");
    let node = nodes.iter_mut().find(|n| n["target"] == "aten.silu.default").expect("a SiLU");
    node["shape"] = serde_json::json!([{"sym": "s1"}, 1 << 24, 1 << 24]);
    let dir = std::env::temp_dir().join(format!("ws-program-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    std::fs::write(dir.join("program.json"), program.to_string()).expect("written");
    let e = read(&dir).expect_err("refused");
    assert!(e.to_string().contains("values per sequence"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn hugging_face_decoders_import_through_the_same_path() {
    for (name, units) in [("hf-qwen2", 1 + 2 * 7 + 1), ("hf-llama", 1 + 2 * 7 + 1), ("hf-gpt2", 2 + 2 * 4 + 1)] {
        let p = read(&folder(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.units.len(), units, "{name}");
    }
    let qwen = read(&folder("hf-qwen2")).expect("imports");
    assert_eq!(qwen.units[1].bias.as_deref(), Some("model.layers.0.self_attn.q_proj.bias"));
    let gpt2 = read(&folder("hf-gpt2")).expect("imports");
    assert!(gpt2.units[2].transposed, "GPT-2's Conv1D stores its weight inputs × outputs");
    assert!(gpt2.nodes.iter().any(|n| matches!(n.op, Op::Attention { mask: Some(_), .. })));
}
