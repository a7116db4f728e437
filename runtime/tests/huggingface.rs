//! A model read from a Hugging Face folder computes what `transformers` computes: the held-out loss right
//! after import within 1e-4 (relative), and ten AdamW steps on the same batches within 1e-3 per step. Three
//! models: a small random `LlamaForCausalLM` with grouped-query attention, an untied head and gains away from
//! 1, and a small random `GPT2LMHeadModel` with an untied head and norm gains and biases away from their
//! starting values, both saved by `transformers` itself; and SmolLM2-135M-Instruct (tied, 30 blocks, a
//! 49,152-token vocabulary).
//! The reference is `models/reference.py` in the venv `models/setup.sh` prepares (`.ci/run` runs it first).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crds::{Decay, ModelSpec, OptimizerKind, OptimizerSpec, ScheduleSpec};
use data::shard::Shard;
use data::text::{TextWindows, Tokens};
use data::{Dataset, Sampler};
use plan::layout::ModelLayout;
use runtime::coordinator::train;
use runtime::engine::hw::CountingHw;
use runtime::engine::role::{EngineRole, ShardWork};
use runtime::engine::wse::Wse;
use runtime::input::LocalFeed;
use runtime::memoryx::huggingface;
use runtime::memoryx::store::{MemoryX, WeightStore};
use runtime::memoryx::weight_server::Storage;
use runtime::optim::Recipe;
use runtime::swarmx::LocalSwarm;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The reference's Python, from `models/setup.sh`.
fn python() -> PathBuf {
    let p = repo().join("models/.venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `bash models/setup.sh` (PyTorch and transformers, the reference)",
        p.display()
    );
    p
}

fn optimizer() -> OptimizerSpec {
    OptimizerSpec {
        kind: OptimizerKind::Adamw,
        learning_rate: 1e-3,
        weight_decay: 0.1,
        momentum: 0.9,
        beta1: 0.9,
        beta2: 0.95,
        epsilon: 1e-8,
    }
}

/// The job's model for the folder `dir` at `context` tokens, its family and shape from the folder's config.
fn model(dir: &Path, context: u32) -> ModelLayout {
    let shape = huggingface::shape_of(dir).unwrap();
    let mut spec = ModelSpec {
        kind: shape.kind,
        context_length: Some(context),
        ..ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, 0.0)
    };
    spec.from = Some(dir.display().to_string());
    spec.adopt(&shape, "config.json").unwrap();
    ModelLayout::from_spec(&spec)
}

fn store(layout: &ModelLayout, dir: &Path, steps: u64) -> MemoryX {
    let schedule = ScheduleSpec { warmup_steps: 0, decay: Decay::Constant, min_learning_rate: 0.0 };
    let recipe =
        Recipe { optimizer: optimizer(), schedule, total_steps: steps, seed: 1, from: Some(dir.to_path_buf()) };
    MemoryX::sharded(layout.clone(), &recipe, 1, &|_| Storage::default()).unwrap()
}

fn window(shard: &Shard) -> serde_json::Value {
    serde_json::json!({ "inputs": shard.inputs.data.iter().map(|&t| t as u32).collect::<Vec<_>>(), "labels": shard.labels })
}

/// Runs `transformers` on the same windows: (held-out loss, per-step losses).
fn reference(dir: &Path, data: &Dataset, eval: &[u32], steps: &[Vec<u32>]) -> (f64, Vec<f64>) {
    let o = optimizer();
    let request = serde_json::json!({
        "model": dir,
        "eval": eval.iter().map(|&i| window(&data.shard(&[i]))).collect::<Vec<_>>(),
        "steps": steps.iter().map(|b| b.iter().map(|&i| window(&data.shard(&[i]))).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "optimizer": { "learning_rate": o.learning_rate, "weight_decay": o.weight_decay, "beta1": o.beta1, "beta2": o.beta2, "epsilon": o.epsilon },
    });
    let mut child = Command::new(python())
        .arg(repo().join("models/reference.py"))
        .arg("run")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "reference.py: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["eval_loss"].as_f64().unwrap(),
        v["step_losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect(),
    )
}

/// Weightstream's held-out loss and per-step losses on the same windows.
fn ours(layout: &ModelLayout, dir: &Path, data: &Arc<Dataset>, eval: &[u32], steps: &[Vec<u32>]) -> (f64, Vec<f64>) {
    let store = store(layout, dir, steps.len() as u64);
    let shard = data.shard(eval);
    let tokens = shard.labels.len() as f64;
    let mut e = Wse::new("eval", layout.clone(), CountingHw::new(1 << 34));
    e.begin_step(shard, ShardWork::eval()).unwrap();
    for l in 0..layout.linears.len() {
        e.forward(&store.forward_stream(l).unwrap()).unwrap();
    }
    let eval_loss = e.loss().unwrap().loss / tokens;
    let engines: Vec<Box<dyn EngineRole>> =
        vec![Box::new(Wse::new("engine-0", layout.clone(), CountingHw::new(1 << 34)))];
    let mut swarm = LocalSwarm::new(engines, Arc::new(LocalFeed::new(data.clone(), data.clone()))).unwrap();
    let losses = steps
        .iter()
        .enumerate()
        .map(|(step, batch)| {
            let (loss, _) =
                train::train_step(&store, &mut swarm, train::StepShape::whole(layout), batch.clone(), step as u64)
                    .unwrap();
            loss.loss / loss.samples as f64
        })
        .collect();
    (eval_loss, losses)
}

/// Compares the held-out loss and ten steps; `falls`: the last step's loss must be below the first's (a random
/// model learns the text quickly; a pretrained one, on batches this small, moves around its loss).
fn compare(name: &str, dir: &Path, data: Arc<Dataset>, (context, batch): (u32, usize), falls: bool) {
    let layout = model(dir, context);
    let eval: Vec<u32> = (0..4).map(|i| (i * 7 + 3) % data.len() as u32).collect();
    let sampler = Sampler::new(data.len(), batch, 5);
    let steps: Vec<Vec<u32>> = (0..10).map(|s| sampler.batch(s)).collect();
    let (want_eval, want_steps) = reference(dir, &data, &eval, &steps);
    let (eval_loss, losses) = ours(&layout, dir, &data, &eval, &steps);
    eprintln!(
        "{name}: held-out {eval_loss} (transformers {want_eval}); steps {losses:?} (transformers {want_steps:?})"
    );
    assert!(
        (eval_loss - want_eval).abs() <= 1e-4 * want_eval.abs(),
        "{name}: held-out loss {eval_loss} vs transformers {want_eval}"
    );
    for (s, (a, b)) in losses.iter().zip(&want_steps).enumerate() {
        assert!(
            (a - b).abs() <= 1e-3 * b.abs(),
            "{name}: step {s} loss {a} vs transformers {b} ({losses:?} vs {want_steps:?})"
        );
    }
    assert!(!falls || losses[9] < losses[0], "{name}: training lowers the loss: {losses:?}");
}

fn moby_dick() -> Vec<u8> {
    let gz = std::fs::read(repo().join("examples/data/moby-dick/moby-dick.txt.gz")).unwrap();
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text).unwrap();
    text[..40_000].to_vec()
}

#[test]
fn a_random_llama_computes_what_transformers_computes() {
    let dir = std::env::temp_dir().join(format!("ws-hf-llama-{}", std::process::id()));
    let out = Command::new(python())
        .arg(repo().join("models/reference.py"))
        .args(["create-llama"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "create-llama: {}", String::from_utf8_lossy(&out.stderr));
    let data = Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Bytes(moby_dick()), vocab: 256, context: 48 }));
    compare("random llama", &dir, data, (48, 4), true);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_random_gpt2_computes_what_transformers_computes() {
    let dir = std::env::temp_dir().join(format!("ws-hf-gpt2-{}", std::process::id()));
    let out = Command::new(python())
        .arg(repo().join("models/reference.py"))
        .args(["create-gpt2"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "create-gpt2: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        matches!(model(&dir, 48).arch, plan::layout::Arch::Gpt(g) if g.affine_norms),
        "GPT-2's norms learn a gain and a bias"
    );
    let data = Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Bytes(moby_dick()), vocab: 256, context: 48 }));
    compare("random gpt2", &dir, data, (48, 4), true);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn smollm2_computes_what_transformers_computes() {
    let dir = repo().join("models/smollm2-135m");
    assert!(dir.join("config.json").exists(), "{} is missing: run `bash models/setup.sh`", dir.display());
    let tokenizer = data::tokenizer::TextTokenizer::load(&dir.join("tokenizer.json"), 49_152).unwrap();
    let ids = tokenizer.encode(&moby_dick(), Path::new("moby-dick"), 49_152).unwrap();
    let data = Arc::new(Dataset::Text(TextWindows { tokens: Tokens::Ids(ids), vocab: 49_152, context: 64 }));
    compare("SmolLM2-135M", &dir, data, (64, 2), false);
}
