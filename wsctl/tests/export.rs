//! `wsctl export` checked by code that shares nothing with our engine: a GPT trained by `wsctl run` is exported
//! to Hugging Face's GPT-2 format, and GPT-2's forward pass written out below (plain loops over the exported
//! tensors, by GPT-2's names and config.json) gives the held-out loss the job reported. Also: an MLP is refused
//! by `--format huggingface` with one clear error and exported plainly instead, and a corrupt checkpoint is
//! refused, in both cases with nothing half-written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
#[path = "common/gpt2.rs"]
mod gpt2;
use common::wsctl;
use gpt2::Gpt2;

use std::path::{Path, PathBuf};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("export", name)
}

/// A small GPT (sparse, so the masks must be drawn again by the export), checkpointed at its last step.
const GPT: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: export-gpt}
spec:
  cs2: 1
  model: {kind: gpt, contextLength: 32, width: 48, heads: 4, blocks: 2, sparsity: 0.5}
  data: {kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}
  training:
    batchSize: 16
    steps: 60
    seed: 11
    optimizer: {kind: adamw, learningRate: 0.003, weightDecay: 0.01, beta2: 0.99}
  checkpoint: {intervalSteps: 30, keep: 2}
"#;

const MLP: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: export-mlp}
spec:
  cs2: 1
  model: {kind: mlp, layers: [784, 32, 10], sparsity: 0.5}
  data: {kind: mnist, path: examples/data/mnist}
  training:
    batchSize: 64
    steps: 10
    seed: 3
    optimizer: {kind: adamw, learningRate: 0.002}
  checkpoint: {intervalSteps: 10, keep: 1}
"#;

/// Runs `manifest` in one process; returns the scratch folder (kept while the caller holds it), the job file,
/// the run's folder and its summary.
fn train(name: &str, manifest: &str) -> (common::Scratch, PathBuf, PathBuf, serde_json::Value) {
    let dir = scratch(name);
    let job = dir.join("job.yaml");
    std::fs::write(&job, manifest).unwrap();
    let out = dir.join("out");
    let o = wsctl(&["run", job.to_str().unwrap(), "--out", out.to_str().unwrap(), "--in-process"]);
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    let summary = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    (dir, job, out, summary)
}

/// The exported GPT, run by GPT-2's forward pass written out in `common/gpt2.rs` over the held-out windows the job evaluated, gives the loss
/// the job reported within 1%. (And by `transformers` too, where it is installed.)
#[test]
fn an_exported_gpt_computes_the_loss_the_job_reported() {
    exported_loss_matches("gpt", GPT, true);
}

/// The same with an LM head of its own (written as `lm_head.weight`) and dense layers.
#[test]
fn an_exported_gpt_with_its_own_head_computes_the_loss_the_job_reported() {
    let untied =
        GPT.replace("sparsity: 0.5}", "sparsity: 0.0, tiedEmbeddings: false}").replace("steps: 60", "steps: 30");
    exported_loss_matches("untied", &untied, false);
}

fn exported_loss_matches(name: &str, manifest: &str, tied: bool) {
    let (_dir, job, out, summary) = train(name, manifest);
    let reported = summary["eval"]["loss"].as_f64().unwrap();
    let steps = summary["steps"].as_u64().unwrap();
    let ckpt = out.join("checkpoints").join(format!("step-{steps:08}.safetensors"));
    assert!(
        ckpt.exists(),
        "the last step is checkpointed: {:?}",
        std::fs::read_dir(out.join("checkpoints")).unwrap().collect::<Vec<_>>()
    );
    let hf = job.parent().unwrap().join("hf");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "huggingface", "-o", hf.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = Gpt2::load(&hf);
    // A byte model cannot take a 1024-token tokenizer: one error, and nothing written.
    let bpe = common::repo().join("examples/data/moby-dick/tokenizer.json");
    let hf2 = job.parent().unwrap().join("hf-bpe");
    let o = wsctl(&[
        "export",
        ckpt.to_str().unwrap(),
        "--format",
        "huggingface",
        "-o",
        hf2.to_str().unwrap(),
        "--tokenizer",
        bpe.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("vocabulary of 1024"), "{stderr}");
    assert!(!hf2.exists(), "nothing written");
    assert_eq!(
        (model.embd, model.heads, model.layers, model.positions, model.vocab, model.tied),
        (48, 4, 2, 32, 256, tied)
    );
    assert_eq!(model.tensors.contains_key("lm_head.weight"), !tied, "a tied head is the token embedding");

    // The held-out windows the job evaluated: the same split, the same evenly spread windows.
    let mut spec = crds::parse_training_job(manifest).unwrap().spec;
    spec.data.path = common::repo().join(&spec.data.path).to_string_lossy().to_string();
    let (_, test) = data::load(&spec, None).unwrap();
    let (mut sum, mut tokens) = (0.0, 0usize);
    let windows = test.eval_samples();
    for &w in &windows {
        let shard = test.shard(&[w]);
        let input: Vec<usize> = shard.inputs.data.iter().map(|&t| t as usize).collect();
        let labels: Vec<usize> = shard.labels.iter().map(|&l| l as usize).collect();
        sum += model.loss(&input, &labels);
        tokens += labels.len();
    }
    let ours = sum / tokens as f64;
    assert_eq!(tokens as u64, summary["eval"]["samples"].as_u64().unwrap(), "the same held-out tokens");
    // The acceptance asks for 1%; the two agree to float rounding, and a tiny model leans on its embeddings
    // enough that a wrongly laid-out block moves the loss by only a few tenths of a percent: hold it to 0.1%.
    assert!((ours - reported).abs() <= 0.001 * reported, "GPT-2's forward gives {ours}, the job reported {reported}");
    assert!(reported < 5.0, "the job learned something ({reported} nats/token; ln 256 = 5.55)");
    eprintln!("{name}: independent GPT-2 forward: {ours:.5} nats/token; the job reported {reported:.5}");

    transformers_check(&hf, &test, &windows, reported);
}

/// With `transformers` and `torch` installed, `GPT2LMHeadModel.from_pretrained` gives the same loss too.
fn transformers_check(hf: &Path, test: &data::Dataset, windows: &[u32], reported: f64) {
    let probe = std::process::Command::new("python3").args(["-c", "import transformers, torch"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            eprintln!(
                "transformers check skipped: {}",
                why.lines().last().unwrap_or("python3 cannot import transformers, torch")
            );
            return;
        }
        Err(e) => {
            eprintln!("transformers check skipped: no python3 ({e})");
            return;
        }
    }
    let batches: Vec<(Vec<f32>, Vec<u32>)> = windows
        .iter()
        .map(|&w| {
            let s = test.shard(&[w]);
            (s.inputs.data, s.labels)
        })
        .collect();
    let data = hf.join("windows.json");
    std::fs::write(&data, serde_json::to_string(&batches).unwrap()).unwrap();
    let script = r#"
import json, sys, torch, transformers
m = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
total, n = 0.0, 0
with torch.no_grad():
    for x, y in json.load(open(sys.argv[2])):
        logits = m(torch.tensor([[int(t) for t in x]])).logits[0]
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(y), reduction="sum").item()
        n += len(y)
print(total / n)
"#;
    let o = std::process::Command::new("python3")
        .args(["-c", script, hf.to_str().unwrap(), data.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "transformers: {}", String::from_utf8_lossy(&o.stderr));
    let loss: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!((loss - reported).abs() <= 0.01 * reported, "transformers gives {loss}, the job reported {reported}");
}

/// An MLP's checkpoint: `--format huggingface` refuses it with one clear error and writes nothing; `--format
/// safetensors` writes its layers under plain names, dense. A corrupt checkpoint is refused, and nothing is
/// left in (or as) the output folder.
#[test]
fn an_mlp_exports_plainly_and_bad_exports_write_nothing() {
    let (_dir, job, out, _) = train("mlp", MLP);
    let ckpt = out.join("checkpoints").join("step-00000010.safetensors");
    let dir = job.parent().unwrap().to_path_buf();
    let hf = dir.join("hf");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "huggingface", "-o", hf.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!o.status.success() && lines.len() == 1, "{stderr}");
    assert!(lines[0].contains("not a language model") && lines[0].contains("--format safetensors"), "{stderr}");
    assert!(!hf.exists(), "nothing written");
    let leftovers = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.contains("export"))
            .collect::<Vec<_>>()
    };
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));

    let plain = dir.join("plain");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "safetensors", "-o", plain.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plain.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["layers"], serde_json::json!([784, 32, 10]));
    assert_eq!(config["activation"], "relu");
    let bytes = std::fs::read(plain.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w0 = st.tensor("layers.0.weight").unwrap();
    assert_eq!(w0.shape(), &[32, 784]);
    assert_eq!(st.tensor("layers.1.weight").unwrap().shape(), &[10, 32]);
    assert_eq!(st.tensor("layers.1.bias").unwrap().shape(), &[10]);
    // Sparsity 0.5: about half the dense weights are the mask's zeros, put back in place.
    let zeros = w0.data().chunks_exact(4).filter(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 0.0).count();
    assert!((0.4..0.6).contains(&(zeros as f64 / (32.0 * 784.0))), "{zeros} zeros");

    // A flipped byte in the weights: the checksum refuses it, and -o stays absent.
    let mut damaged = std::fs::read(&ckpt).unwrap();
    let n = damaged.len();
    damaged[n - 5] ^= 0x40;
    let bad = dir.join("step-00000010.safetensors");
    std::fs::write(&bad, damaged).unwrap();
    let target = dir.join("from-bad");
    let o = wsctl(&["export", bad.to_str().unwrap(), "--format", "safetensors", "-o", target.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("checksum"), "{stderr}");
    assert!(!target.exists() && leftovers(&dir).is_empty(), "nothing half-written");
    // Not a checkpoint at all.
    std::fs::write(&bad, b"hello").unwrap();
    let o = wsctl(&["export", bad.to_str().unwrap(), "--format", "huggingface", "-o", target.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not a usable checkpoint"));
    assert!(!target.exists());
}

/// An MLP exported with `--format safetensors` is a folder another job starts from (`spec.model.from`): with a
/// learning rate too small to move a weight, the new job evaluates what the first one did and exports the same
/// weights back; a job whose widths disagree with the folder's is refused, naming both.
#[test]
fn an_exported_mlp_is_a_folder_a_job_starts_from() {
    let dense = MLP.replace(", sparsity: 0.5", "");
    let (_dir, job, out, first) = train("mlp-from", &dense);
    let dir = job.parent().unwrap().to_path_buf();
    let plain = dir.join("plain");
    let ckpt = out.join("checkpoints").join("step-00000010.safetensors");
    let o = wsctl(&["export", ckpt.to_str().unwrap(), "--format", "safetensors", "-o", plain.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let again = dense
        .replace("metadata: {name: export-mlp}", "metadata: {name: export-mlp-again}")
        .replace("layers: [784, 32, 10]", &format!("layers: [784, 32, 10], from: {}", plain.display()))
        .replace("steps: 10", "steps: 1")
        .replace("learningRate: 0.002", "learningRate: 1.0e-12")
        .replace("intervalSteps: 10", "intervalSteps: 1");
    let (_dir2, _, out2, second) = train("mlp-from-again", &again);
    let (a, b) = (first["eval"]["loss"].as_f64().unwrap(), second["eval"]["loss"].as_f64().unwrap());
    assert!((a - b).abs() < 1e-6 * a, "held-out loss {a} then {b}: the second job did not start from the folder");
    let back = dir.join("back");
    let ckpt2 = out2.join("checkpoints").join("step-00000001.safetensors");
    let o = wsctl(&["export", ckpt2.to_str().unwrap(), "--format", "safetensors", "-o", back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (x, y) = (
        std::fs::read(plain.join("model.safetensors")).unwrap(),
        std::fs::read(back.join("model.safetensors")).unwrap(),
    );
    let (x, y) =
        (safetensors::SafeTensors::deserialize(&x).unwrap(), safetensors::SafeTensors::deserialize(&y).unwrap());
    for name in ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"] {
        let values = |st: &safetensors::SafeTensors, n: &str| -> Vec<f32> {
            st.tensor(n).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        };
        let (u, v) = (values(&x, name), values(&y, name));
        assert_eq!(u.len(), v.len(), "{name}");
        let worst = u.iter().zip(&v).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "{name} moved by {worst}");
    }

    let wrong = dir.join("wrong.yaml");
    std::fs::write(&wrong, again.replace("layers: [784, 32, 10]", "layers: [784, 16, 10]")).unwrap();
    let o = wsctl(&["plan", wrong.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("spec.model.layers") && stderr.contains("[784, 32, 10]"),
        "{stderr}"
    );
}
