//! The GPT examples as a user runs them: a small transformer learns English bytes well below the unigram
//! baseline, the same job on 1 and 4 engine processes follows one loss curve, a model larger than the engine's
//! SRAM trains by streaming, and bad GPT manifests get one clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{repo, wsctl};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("gpt", name)
}

/// gpt-small's recipe at a quarter of its width, so the test trains in seconds.
const TINY: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: tiny-gpt}
spec:
  cs2: 1
  model: {kind: gpt, contextLength: 64, width: 64, heads: 4, blocks: 2, sparsity: 0.5}
  data: {kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}
  training:
    batchSize: 16
    steps: 200
    seed: 7
    optimizer: {kind: adamw, learningRate: 0.002, weightDecay: 0.01, beta2: 0.99}
    schedule: {warmupSteps: 10, decay: cosine, minLearningRate: 0.0002}
"#;

/// Runs `manifest` with `extra` flags and returns summary.json and the loss curve.
fn run(name: &str, manifest: &str, extra: &[&str]) -> (serde_json::Value, Vec<f64>, String) {
    let dir = scratch(name);
    let job = dir.join("job.yaml");
    std::fs::write(&job, manifest).unwrap();
    let out = dir.join("out");
    let mut args = vec!["run", job.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = wsctl(&args);
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let losses = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64().unwrap())
        .collect();
    (summary, losses, String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn a_small_gpt_learns_english_bytes_and_writes_text() {
    let (s, losses, stdout) = run("learns", TINY, &["--in-process", "--sample", "2"]);
    let (loss, unigram) = (s["eval"]["loss"].as_f64().unwrap(), s["eval"]["unigram_loss"].as_f64().unwrap());
    assert!(loss < unigram - 0.4, "held-out loss {loss} is not clearly below the unigram baseline {unigram}");
    assert!((s["eval"]["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-6);
    assert!(losses[199] < losses[0] - 2.0, "{losses:?}");
    assert!(s["tokens_per_s"].as_f64().unwrap() > 64.0 * s["samples_per_s"].as_f64().unwrap() - 1e-6);
    assert_eq!(s["samples"].as_array().map(Vec::len), Some(2), "{s}");
    assert!(stdout.contains("unigram baseline") && stdout.contains("  > "), "{stdout}");
}

#[test]
fn one_and_four_engine_processes_follow_one_gpt_curve() {
    let short = TINY.replace("steps: 200", "steps: 8");
    let (_, one, _) = run("one", &short, &["--cs2", "1"]);
    let (four_summary, four, _) = run("four", &short, &["--cs2", "4", "--swarmx-fan-out", "2"]);
    assert_eq!(four_summary["engines"].as_array().map(Vec::len), Some(4));
    assert_eq!(one.len(), 8);
    for (a, b) in one.iter().zip(&four) {
        assert!((a - b).abs() < 1e-3, "1 engine {one:?} vs 4 engines {four:?}");
    }
}

#[test]
fn a_gpt_larger_than_the_engine_trains_by_streaming() {
    let text = std::fs::read_to_string(repo().join("examples/jobs/gpt-sparse-streaming.yaml")).unwrap();
    let (s, losses, _) = run("streaming", &text.replace("steps: 150", "steps: 12"), &[]);
    let weights = s["model_weight_bytes"].as_u64().unwrap();
    for e in s["engines"].as_array().unwrap() {
        let (peak, sram) = (e["peak_sram_bytes"].as_u64().unwrap(), e["sram_bytes"].as_u64().unwrap());
        assert!(peak <= sram && sram < weights, "peak {peak}, SRAM {sram}, model {weights}");
    }
    assert!(losses[11] < losses[0] - 1.0, "{losses:?}");
    // Only streaming can run it: asking for every weight resident is refused before anything starts.
    let o = wsctl(&["plan", "examples/jobs/gpt-sparse-streaming.yaml"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("only streaming can run it"));
    let dir = scratch("pipelined");
    let job = dir.join("job.yaml");
    std::fs::write(&job, text.replace("executionMode: weightStreaming", "executionMode: pipelined")).unwrap();
    let o = wsctl(&["plan", job.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("SRAM budget exceeded") && err.contains("pipelined"), "{err}");
}

#[test]
fn bad_gpt_manifests_get_one_clear_error() {
    for (name, manifest, needle) in [
        ("heads", TINY.replace("heads: 4", "heads: 3"), "spec.model.heads"),
        ("width", TINY.replace("width: 64, ", ""), "spec.model.width"),
        ("data", TINY.replace("kind: text", "kind: mnist"), "spec.data.kind"),
        ("file", TINY.replace("examples/data/moby-dick/moby-dick.txt.gz", "/nonexistent.txt"), "cannot open"),
        ("context", TINY.replace("contextLength: 64", "contextLength: 1000000"), "contextLength"),
    ] {
        let dir = scratch(name);
        let job = dir.join("job.yaml");
        std::fs::write(&job, manifest).unwrap();
        let o = wsctl(&["run", job.to_str().unwrap(), "--out", dir.join("out").to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!o.status.success() && !stderr.contains("panicked"), "{name}: {stderr}");
        assert!(lines.len() == 1 && lines[0].starts_with("error: ") && lines[0].contains(needle), "{name}: {stderr}");
    }
}
