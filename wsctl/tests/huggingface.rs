//! Hugging Face models in and out of the appliance through `wsctl`: a `LlamaForCausalLM` folder (one file or
//! sharded, tied or untied head) and a `GPT2LMHeadModel` folder read into MemoryX and exported again give back
//! every tensor bit for bit; a job starting from a folder trains; and each way a folder or a job can be wrong
//! is one clear error, with nothing written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
#[path = "common/tiny_llama.rs"]
mod tiny_llama;
use common::wsctl;
use tiny_llama::{CONFIG, serialize, values, write_folder};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use runtime::memoryx::checkpoint::{self, Owner};
use runtime::memoryx::store::MemoryX;
use runtime::memoryx::weight_server::Storage;
use runtime::optim::Recipe;

fn read_safetensors(path: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
        .collect()
}

/// The job `spec` imported into a MemoryX of `servers` weight servers, checkpointed untrained and exported with
/// `wsctl export --format huggingface` into `dir/export`: that folder and its tensors.
fn import_and_export(dir: &Path, spec: &crds::TrainingJobSpec, servers: u32) -> (PathBuf, HashMap<String, Vec<f32>>) {
    let layout = plan::layout::ModelLayout::from_spec(&spec.model);
    let store = MemoryX::sharded(layout, &Recipe::of(spec, 4), servers, &|_| Storage::default()).unwrap();
    let (step, state) = store.snapshot().unwrap();
    let owner = Owner { job: "import", uid: None, model: Some((&spec.model, spec.training.seed)) };
    let ckpt = checkpoint::write_owned(&dir.join("ckpt"), step, &state, &owner, 1).unwrap();
    let out = dir.join("export");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "huggingface", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = read_safetensors(&out.join("model.safetensors"));
    (out, got)
}

fn job(name: &str, from: &Path, model_extra: &str) -> String {
    format!(
        "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {name}}}\nspec:\n  cs2: 1\n  model: {{kind: llama, from: {}, contextLength: 16{model_extra}}}\n  data: {{kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}}\n  training:\n    batchSize: 4\n    steps: 4\n    seed: 3\n    optimizer: {{kind: adamw, learningRate: 0.001}}\n",
        from.display()
    )
}

#[test]
fn a_folder_read_into_memoryx_exports_bit_for_bit() {
    for (tied, sharded) in [(false, false), (true, true)] {
        let dir = common::scratch("llama", &format!("roundtrip-{tied}-{sharded}"));
        let folder = dir.join("hf");
        let want = write_folder(&folder, tied, sharded);
        let text = job("roundtrip", &folder, "");
        // The job as `wsctl run` reads it: the shape from the folder's config.json.
        let spec = crds::parse_training_job_with(&text, &runtime::memoryx::huggingface::resolve).unwrap().spec;
        assert_eq!((spec.model.width, spec.model.kv_heads, spec.model.tied_embeddings), (Some(32), Some(2), tied));
        // Three weight servers: each reads its slice of every unit from the folder.
        let (out, got) = import_and_export(&dir, &spec, 3);
        assert_eq!(got.len(), want.len(), "the same tensors: {:?}", got.keys().collect::<Vec<_>>());
        for (name, values) in &want {
            assert_eq!(got.get(name), Some(values), "{name} (tied {tied}, sharded {sharded})");
        }
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(
            (config["architectures"][0].as_str(), config["num_key_value_heads"].as_u64()),
            (Some("LlamaForCausalLM"), Some(2))
        );
        assert_eq!(config["tie_word_embeddings"].as_bool(), Some(tied));
    }
}

/// The synthetic GPT-2: width 32, 4 heads, 2 blocks, 16 positions, untied head.
const GPT2_CONFIG: &str = r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 256, "n_embd": 32,
 "n_head": 4, "n_layer": 2, "n_positions": 16, "n_inner": null, "activation_function": "gelu_new",
 "layer_norm_epsilon": 1e-05, "tie_word_embeddings": false}"#;

/// Every tensor of the synthetic GPT-2 with its shape, in `GPT2LMHeadModel`'s names (`Conv1D` weights
/// `inputs × outputs`).
fn gpt2_tensors() -> Vec<(String, Vec<usize>)> {
    let (w, v, t) = (32, 256, 16);
    let mut out =
        vec![("transformer.wte.weight".to_string(), vec![v, w]), ("transformer.wpe.weight".to_string(), vec![t, w])];
    for b in 0..2 {
        let h = |n: &str| format!("transformer.h.{b}.{n}");
        out.extend([
            (h("ln_1.weight"), vec![w]),
            (h("ln_1.bias"), vec![w]),
            (h("attn.c_attn.weight"), vec![w, 3 * w]),
            (h("attn.c_attn.bias"), vec![3 * w]),
            (h("attn.c_proj.weight"), vec![w, w]),
            (h("attn.c_proj.bias"), vec![w]),
            (h("ln_2.weight"), vec![w]),
            (h("ln_2.bias"), vec![w]),
            (h("mlp.c_fc.weight"), vec![w, 4 * w]),
            (h("mlp.c_fc.bias"), vec![4 * w]),
            (h("mlp.c_proj.weight"), vec![4 * w, w]),
            (h("mlp.c_proj.bias"), vec![w]),
        ]);
    }
    out.extend([
        ("transformer.ln_f.weight".into(), vec![w]),
        ("transformer.ln_f.bias".into(), vec![w]),
        ("lm_head.weight".into(), vec![v, w]),
    ]);
    out
}

#[test]
fn a_gpt2_folder_read_into_memoryx_exports_bit_for_bit() {
    let dir = common::scratch("huggingface", "gpt2-roundtrip");
    let folder = dir.join("hf");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.json"), GPT2_CONFIG).unwrap();
    let named: Vec<(String, Vec<usize>, Vec<f32>)> = gpt2_tensors()
        .into_iter()
        .enumerate()
        .map(|(k, (n, s))| {
            let len = s.iter().product();
            (n, s, values(k, len))
        })
        .collect();
    std::fs::write(folder.join("model.safetensors"), serialize(&named)).unwrap();
    let text = job("gpt2", &folder, "").replace("kind: llama", "kind: gpt").replace(", contextLength: 16", "");
    let spec = crds::parse_training_job_with(&text, &runtime::memoryx::huggingface::resolve).unwrap().spec;
    assert_eq!(
        (spec.model.width, spec.model.context_length, spec.model.layer_norm),
        (Some(32), Some(16), Some(crds::LayerNorm::Affine))
    );
    let (out, got) = import_and_export(&dir, &spec, 3);
    assert_eq!(got.len(), named.len(), "the same tensors: {:?}", got.keys().collect::<Vec<_>>());
    for (name, _, values) in &named {
        assert_eq!(got.get(name), Some(values), "{name}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["architectures"][0].as_str(), config["n_positions"].as_u64()),
        (Some("GPT2LMHeadModel"), Some(16))
    );
    // A plain job's own contradiction of the folder is one clear error.
    refused(
        &dir,
        &text.replace("kind: gpt,", "kind: gpt, layerNorm: plain,"),
        &["spec.model.layerNorm", "plain", "affine"],
    );
    refused(
        &dir,
        &text.replace("kind: gpt,", "kind: gpt, contextLength: 8,"),
        &["spec.model.contextLength", "n_positions"],
    );
}

/// Runs `wsctl run` on `text`, expecting a failure whose message holds every one of `says`.
fn refused(dir: &Path, text: &str, says: &[&str]) {
    let path = dir.join("job.yaml");
    std::fs::write(&path, text).unwrap();
    let out = dir.join("out");
    let o = wsctl(&["run", path.to_str().unwrap(), "--in-process", "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "accepted: {text}");
    for s in says {
        assert!(err.contains(s), "the error should say {s:?}: {err}");
    }
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "one error: {err}");
    assert!(!out.join("checkpoints").exists() && !out.join("summary.json").exists(), "nothing written: {err}");
}

#[test]
fn a_bad_folder_or_job_is_one_clear_error() {
    let dir = common::scratch("llama", "bad");
    let good = dir.join("good");
    write_folder(&good, false, false);
    // No config.json.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    refused(&dir, &job("bad", &empty, ""), &["spec.model.from", "config.json"]);
    // No weights.
    let no_weights = dir.join("no-weights");
    std::fs::create_dir_all(&no_weights).unwrap();
    std::fs::copy(good.join("config.json"), no_weights.join("config.json")).unwrap();
    refused(&dir, &job("bad", &no_weights, ""), &["model.safetensors", "save_pretrained"]);
    // An architecture the appliance cannot run, named.
    let gpt2 = dir.join("gpt2");
    std::fs::create_dir_all(&gpt2).unwrap();
    std::fs::write(gpt2.join("config.json"), r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}"#)
        .unwrap();
    refused(&dir, &job("bad", &gpt2, ""), &["Qwen2ForCausalLM", "LlamaForCausalLM"]);
    // Shapes that disagree with the config: the config says 3 blocks, the weights hold 2... and a wider MLP.
    let wrong = dir.join("wrong");
    write_folder(&wrong, false, false);
    std::fs::write(
        wrong.join("config.json"),
        CONFIG.replace("TIED", "false").replace("\"intermediate_size\": 48", "\"intermediate_size\": 40"),
    )
    .unwrap();
    refused(&dir, &job("bad", &wrong, ""), &["mlp.gate_proj", "[48, 32]", "[40, 32]"]);
    // A sharded index naming a missing shard.
    let shards = dir.join("shards");
    write_folder(&shards, false, true);
    std::fs::remove_file(shards.join("model-00002-of-00002.safetensors")).unwrap();
    refused(&dir, &job("bad", &shards, ""), &["model-00002-of-00002.safetensors", "missing"]);
    // A job field contradicting the config: both values named.
    refused(&dir, &job("bad", &good, ", width: 64"), &["spec.model.width", "64", "32", "config.json"]);
    // A context longer than the model allows.
    refused(&dir, &job("bad", &good, "").replace("contextLength: 16", "contextLength: 128"), &["contextLength", "64"]);
    // A truncated weights file.
    let cut = dir.join("cut");
    write_folder(&cut, false, false);
    let bytes = std::fs::read(cut.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    refused(&dir, &job("bad", &cut, ""), &["model.safetensors", "do not fit"]);
}

#[test]
fn a_job_from_a_folder_trains() {
    let dir = common::scratch("llama", "trains");
    let folder = dir.join("hf");
    write_folder(&folder, true, false);
    let path = dir.join("job.yaml");
    std::fs::write(&path, job("trains", &folder, "")).unwrap();
    let out: PathBuf = dir.join("out");
    let o = wsctl(&["run", path.to_str().unwrap(), "--in-process", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"].as_u64(), Some(4));
    assert!(summary["eval"]["loss"].as_f64().is_some_and(f64::is_finite));
}

/// A Llama with its shape in the job (random start), sparse or not, four engines.
fn shaped(sparsity: f64, mode: &str, lines: &str) -> String {
    format!(
        "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: llama-curve}}\nspec:\n  cs2: 4\n  executionMode: {mode}\n  model: {{kind: llama, contextLength: 32, width: 64, heads: 4, kvHeads: 2, blocks: 3, intermediateSize: 96, sparsity: {sparsity}, tiedEmbeddings: false}}\n  data: {{kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}}\n  training:\n    batchSize: 8\n    steps: 8\n    seed: 5\n    optimizer: {{kind: adamw, learningRate: 0.003, weightDecay: 0.01}}\n{lines}"
    )
}

/// One and three weight servers (processes) train the same Llama bit for bit, pipelined or streamed, dense or
/// sparse, and so do two servers with a third of their slices in a disk tier (dense: at 85% sparsity the dense
/// embedding is most of a slice, so a budget that leaves anything on disk is below one layer); the two
/// execution modes give the same curve.
#[test]
fn weight_servers_tiers_and_execution_modes_give_one_llama_curve() {
    let dir = common::scratch("llama", "curves");
    for sparsity in [0.0, 0.85] {
        let mut by_mode = Vec::new();
        for mode in ["pipelined", "weightStreaming"] {
            let write = |name: &str, lines: &str| {
                let path = dir.join(format!("{name}-{sparsity}-{mode}.yaml"));
                std::fs::write(&path, shaped(sparsity, mode, lines)).unwrap();
                (path, dir.join(format!("{name}-{sparsity}-{mode}")))
            };
            let (one, one_out) = write("one", "");
            common::run_ok(&one, &one_out, &[]);
            let reference = common::losses(&one_out);
            assert_eq!(reference.len(), 8);
            let (three, three_out) = write("three", "  memoryx: {servers: 3}\n");
            common::run_ok(&three, &three_out, &[]);
            assert_eq!(
                common::losses(&three_out),
                reference,
                "sparsity {sparsity}, {mode}: three weight servers against one"
            );
            if mode == "weightStreaming" && sparsity == 0.0 {
                let state = common::summary(&three_out)["memoryx"]["servers"][1]["memoryBytes"].as_u64().unwrap();
                // Two servers each with a slice half again as large as three servers' and the memory of one of those:
                // a third of each slice on disk.
                let (tiered, tiered_out) =
                    write("tiered", &format!("  memoryx: {{servers: 2, memoryBytes: {state}}}\n"));
                common::run_ok(&tiered, &tiered_out, &[]);
                assert_eq!(common::losses(&tiered_out), reference, "sparsity {sparsity}: a disk tier changes nothing");
                let s = common::summary(&tiered_out);
                assert!(
                    s["memoryx"]["servers"].as_array().unwrap().iter().all(|v| v["diskBytes"].as_u64() > Some(0)),
                    "{s}"
                );
            }
            by_mode.push(reference);
        }
        for (a, b) in by_mode[0].iter().zip(&by_mode[1]) {
            assert!(
                a.0 == b.0 && (a.1 - b.1).abs() <= 1e-6 * b.1.abs(),
                "sparsity {sparsity}: pipelined {:?} vs streaming {:?}",
                by_mode[0],
                by_mode[1]
            );
        }
    }
}

/// Fine-tuning sparse from a pretrained folder prunes each matrix by magnitude: the export of the imported model
/// keeps exactly the largest half of every attention and MLP matrix (values untouched) and zeroes the rest, and
/// the embedding, head and gains stay whole.
#[test]
fn sparse_fine_tuning_prunes_each_matrix_by_magnitude() {
    let dir = common::scratch("llama", "magnitude");
    let folder = dir.join("hf");
    let want = write_folder(&folder, false, false);
    let text = job("magnitude", &folder, ", sparsity: 0.5");
    let spec = crds::parse_training_job_with(&text, &runtime::memoryx::huggingface::resolve).unwrap().spec;
    let (_, got) = import_and_export(&dir, &spec, 2);
    let mut pruned = 0;
    for (name, source) in &want {
        let exported = &got[name];
        let matrix = name.contains("_proj");
        if !matrix {
            assert_eq!(exported, source, "{name} is not pruned");
            continue;
        }
        let kept: Vec<f32> = exported
            .iter()
            .zip(source)
            .filter(|(e, _)| **e != 0.0)
            .map(|(e, s)| {
                assert_eq!(e, s);
                s.abs()
            })
            .collect();
        let dropped = source.iter().zip(exported).filter(|(_, e)| **e == 0.0).map(|(s, _)| s.abs());
        assert_eq!(kept.len(), source.len() / 2, "{name}: half kept");
        let smallest_kept = kept.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(
            dropped.fold(0.0f32, f32::max) <= smallest_kept,
            "{name}: every dropped weight is no larger than every kept one"
        );
        pruned += 1;
    }
    assert_eq!(pruned, 14, "seven matrices in each of two blocks");
}

/// SmolLM2-135M fine-tuned sparse for two steps, exported: `transformers` loads the folder with its tokenizer,
/// keeps the pruned half of every matrix at zero, and continues a prompt greedily with exactly the tokens
/// `wsctl generate` gives from the checkpoint.
#[test]
fn a_fine_tuned_smollm2_exports_to_transformers_and_generates_the_same_text() {
    let model = common::repo().join("models/smollm2-135m");
    let python = common::repo().join("models/.venv/bin/python");
    assert!(
        model.join("config.json").exists() && python.exists(),
        "run `bash models/setup.sh` first (models/ is prepared by .ci/run)"
    );
    let dir = common::scratch("llama", "smollm2");
    let text = format!(
        "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: smol}}\nspec:\n  cs2: 1\n  model: {{kind: llama, from: {}, contextLength: 32, sparsity: 0.5}}\n  data: {{kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}}\n  training:\n    batchSize: 2\n    steps: 2\n    seed: 3\n    optimizer: {{kind: adamw, learningRate: 0.00002}}\n  checkpoint: {{intervalSteps: 2, keep: 1}}\n",
        model.display()
    );
    let job = dir.join("job.yaml");
    std::fs::write(&job, text).unwrap();
    let out = dir.join("out");
    common::run_ok(&job, &out, &["--in-process"]);
    let ckpt = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let hf = dir.join("hf");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "huggingface", "-o", hf.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(hf.join("tokenizer.json").exists(), "the tokenizer of the folder the job started from travels with it");
    let prompt = "Call me Ishmael. Some years ago";
    let o = wsctl(&["generate", ckpt.to_str().unwrap(), "--prompt", prompt, "--tokens", "8"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = String::from_utf8_lossy(&o.stdout).trim_end().to_string();
    let script = r#"
import json, sys, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
ids = t(sys.argv[2], return_tensors="pt", add_special_tokens=False).input_ids
out = m.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
q = m.model.layers[0].self_attn.q_proj.weight
print(json.dumps({"text": sys.argv[2] + t.decode(out[0, ids.shape[1]:], skip_special_tokens=True), "zeros": (q == 0).float().mean().item()}))
"#;
    let o = std::process::Command::new(&python).args(["-c", script]).arg(&hf).arg(prompt).output().unwrap();
    assert!(o.status.success(), "transformers: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let theirs = v["text"].as_str().unwrap().trim_end();
    assert!(theirs.len() > prompt.len() + 5, "transformers generated text: {theirs:?}");
    assert_eq!(ours, theirs, "wsctl generate and transformers continue the prompt alike");
    assert!((v["zeros"].as_f64().unwrap() - 0.5).abs() < 0.01, "half of q_proj is pruned: {v}");
}

/// A GPT with GPT-2's affine layer norms (random start, sparse): one and three weight servers give the same
/// curve bit for bit, and pipelined, streamed and one-engine runs the same curve within float reassociation.
#[test]
fn affine_norms_give_one_gpt_curve_over_servers_modes_and_engines() {
    let dir = common::scratch("huggingface", "affine-curves");
    let text = |cs2: u32, mode: &str, lines: &str| {
        format!(
            "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: gpt2-curve}}\nspec:\n  cs2: {cs2}\n  executionMode: {mode}\n  model: {{kind: gpt, layerNorm: affine, contextLength: 32, width: 64, heads: 4, blocks: 2, sparsity: 0.85, tiedEmbeddings: false}}\n  data: {{kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}}\n  training:\n    batchSize: 8\n    steps: 8\n    seed: 5\n    optimizer: {{kind: adamw, learningRate: 0.003, weightDecay: 0.01}}\n{lines}"
        )
    };
    let run = |name: &str, job: String| {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, job).unwrap();
        let out = dir.join(name);
        common::run_ok(&path, &out, &[]);
        common::losses(&out)
    };
    let reference = run("streaming", text(4, "weightStreaming", ""));
    assert_eq!(reference.len(), 8);
    assert!(reference[7].1 < reference[0].1, "it learns: {reference:?}");
    assert_eq!(
        run("three-servers", text(4, "weightStreaming", "  memoryx: {servers: 3}\n")),
        reference,
        "three weight servers against one"
    );
    for (name, other) in [
        ("pipelined", run("pipelined", text(4, "pipelined", ""))),
        ("one-engine", run("one-engine", text(1, "weightStreaming", ""))),
    ] {
        for (a, b) in other.iter().zip(&reference) {
            assert!(
                a.0 == b.0 && (a.1 - b.1).abs() <= 1e-5 * b.1.abs(),
                "{name} {other:?} vs four engines streaming {reference:?}"
            );
        }
    }
}

/// A pretrained folder inside the job's data volume, as a cluster job names it (`from` relative to the volume):
/// `wsctl run --volume` finds it there, as processes (the weight servers and the engines pruning a pipelined
/// replica by magnitude read it under their `--data-root`) and in one process, with the same curve; a path
/// leaving the volume is one clear error.
#[test]
fn a_folder_inside_the_data_volume_trains_as_processes_and_in_one_process() {
    let dir = common::scratch("huggingface", "volume");
    let volume = dir.join("volume");
    write_folder(&volume.join("models/tiny"), false, false);
    std::fs::copy(common::repo().join("examples/data/moby-dick/moby-dick.txt.gz"), volume.join("moby-dick.txt.gz"))
        .unwrap();
    let text = job("volume", Path::new("models/tiny"), ", sparsity: 0.5")
        .replace("path: examples/data/moby-dick/moby-dick.txt.gz", "path: moby-dick.txt.gz, volume: corpus")
        .replace("  cs2: 1\n", "  cs2: 2\n  executionMode: pipelined\n");
    let path = dir.join("job.yaml");
    std::fs::write(&path, &text).unwrap();
    let claim = format!("corpus={}", volume.display());
    let mut curves = Vec::new();
    for how in [&["--volume", claim.as_str()][..], &["--volume", claim.as_str(), "--in-process"][..]] {
        let out = dir.join(format!("out-{}", how.len()));
        common::run_ok(&path, &out, how);
        curves.push(common::losses(&out));
    }
    assert_eq!(curves[0].len(), 4);
    assert_eq!(curves[0], curves[1], "processes and one process");
    std::fs::write(&path, text.replace("from: models/tiny", "from: ../volume/models/tiny")).unwrap();
    let o = common::run(&path, &dir.join("escape"), &["--volume", &claim]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("spec.model.from") && err.contains(".."), "{err}");
}

/// The cluster example states the model's shape (the operator plans without the folder) and names the folder
/// inside its data volume: it plans here as the API server and the operator take it.
#[test]
fn the_cluster_example_plans_with_the_model_from_its_volume() {
    let path = common::repo().join("examples/jobs/llama-smollm2-cluster.yaml");
    let o = wsctl(&["plan", path.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("pretrained") && out.contains("smollm2-135m"), "{out}");
    let job = crds::parse_training_job(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        (job.spec.data.volume.as_deref(), job.spec.model.from.as_deref()),
        (Some("corpus"), Some("smollm2-135m"))
    );
}
