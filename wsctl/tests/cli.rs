//! `wsctl` as a user runs it: the shipped examples reach their accuracy bars, and bad input gets one clear
//! error line and a non-zero exit, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{repo, wsctl};

use std::path::Path;

fn scratch(name: &str) -> common::Scratch {
    common::scratch("test", name)
}

const SMALL: &str = crds::testing::MLP_YAML;

fn summary(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json written");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

#[test]
fn a_small_job_writes_metrics_and_summary() {
    let dir = scratch("small");
    let job = dir.join("job.yaml");
    std::fs::write(&job, SMALL).unwrap();
    let out = dir.join("out");
    let o = wsctl(&["run", job.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    for (i, m) in lines.iter().enumerate() {
        assert_eq!(m["step"], i as u64 + 1);
        for key in ["loss", "samples_per_s"] {
            assert!(m[key].as_f64().is_some_and(|v| v > 0.0), "step {i} lacks {key}: {m}");
        }
        // The model fits the engines, so `auto` runs it pipelined: MemoryX sends it once, before the first step,
        // and the engines keep it.
        let streamed = m["bytes_streamed"].as_u64().expect("bytes_streamed");
        assert_eq!(streamed > 0, i == 0, "step {i} streamed {streamed} bytes");
    }
    let s = summary(&out);
    assert_eq!(s["execution_mode"], "pipelined");
    assert_eq!(s["steps"], 30);
    assert_eq!(s["eval"]["samples"], 2000);
    for key in ["final_loss", "wall_s", "samples_per_s", "bytes_streamed", "dense_equivalent_bytes"] {
        assert!(s[key].as_f64().is_some_and(|v| v > 0.0), "summary lacks {key}: {s}");
    }
    assert_eq!(s["engines"].as_array().map(Vec::len), Some(2));
    assert!(s["eval"]["accuracy"].as_f64().unwrap() > 0.3, "30 steps already beat chance (0.1): {s}");
}

/// Trains a shipped example and returns its held-out accuracy.
fn example_accuracy(file: &str, extra: &[&str]) -> f64 {
    // One folder per file *and* arguments: two tests of the same example run side by side.
    let out = scratch(&format!("{file}{}", extra.join("")));
    let mut args = vec!["run", file, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = wsctl(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    let bytes = s["bytes_streamed"].as_f64().unwrap() / s["dense_equivalent_bytes"].as_f64().unwrap();
    if file.contains("sparse") {
        assert!(bytes <= 0.2, "a 90%-sparse job streams at most a fifth of the dense bytes, not {bytes}");
    }
    s["eval"]["accuracy"].as_f64().unwrap()
}

#[test]
fn dense_fc_mnist_reaches_95_percent() {
    let acc = example_accuracy("examples/jobs/fc-mnist.yaml", &[]);
    assert!(acc >= 0.95, "held-out accuracy {acc}");
}

#[test]
fn sparse_fc_mnist_reaches_93_percent() {
    let acc = example_accuracy("examples/jobs/fc-mnist-sparse.yaml", &[]);
    assert!(acc >= 0.93, "held-out accuracy {acc}");
}

#[test]
fn sparse_fc_mnist_on_four_cs2s_reaches_93_percent() {
    let acc = example_accuracy("examples/jobs/fc-mnist-sparse.yaml", &["--cs2", "4"]);
    assert!(acc >= 0.93, "held-out accuracy {acc}");
}

/// Runs `wsctl run` on a manifest and checks for exactly one `error:` line naming `needle`.
fn refused(name: &str, manifest: &str, needle: &str) {
    let dir = scratch(name);
    let job = dir.join("job.yaml");
    std::fs::write(&job, manifest).unwrap();
    let o = wsctl(&["run", job.to_str().unwrap(), "--out", dir.join("out").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{name}: accepted");
    assert!(!stderr.contains("panicked"), "{name}: panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{name}: one error line, got {stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(needle), "{name}: `{needle}` not in {stderr}");
}

/// Every example the API server refuses (`examples/jobs/invalid/`), `wsctl plan` and `wsctl run` refuse too,
/// each with one error line naming the field.
#[test]
fn the_invalid_examples_are_refused_locally_with_one_line() {
    let dir = repo().join("examples/jobs/invalid");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("yaml") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        refused(&name, &text, "");
        let o = wsctl(&["plan", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!o.status.success() && lines.len() == 1 && lines[0].starts_with("error: "), "plan {name}: {stderr}");
        seen += 1;
    }
    assert!(seen >= 6, "the invalid examples: {seen}");
}

#[test]
fn bad_input_gets_one_clear_error() {
    refused("yaml", "apiVersion: [weightstream", "invalid TrainingJob manifest");
    refused("kind", &SMALL.replace("kind: mlp", "kind: cnn"), "unknown variant `cnn`");
    refused("width", &SMALL.replace("[784, 32, 10]", "[784, 0, 10]"), "spec.model.layers[1]");
    refused("sparsity", &SMALL.replace("sparsity: 0.5", "sparsity: 1.5"), "outside [0, 0.99]");
    refused("batch", &SMALL.replace("batchSize: 64", "batchSize: 65"), "not divisible");
    refused("sram", &SMALL.replace("cs2: 2", "cs2: 2\n  engine: {sramBytes: 100000}"), "SRAM budget exceeded");
    refused("missing-data", &SMALL.replace("examples/data/mnist", "/nonexistent/mnist"), "not found");
    // Data that is not a regular file (a device that never ends, a folder) is refused before a byte is read,
    // by `wsctl plan` as by `wsctl run`.
    let gpt = std::fs::read_to_string(repo().join("examples/jobs/gpt-small.yaml")).unwrap();
    for (name, path) in [("dev-zero", "/dev/zero"), ("folder", "/tmp")] {
        let text = gpt.replace("examples/data/moby-dick/moby-dick.txt.gz", path);
        refused(name, &text, "not a regular file");
        let dir = scratch(name);
        let job = dir.join("plan.yaml");
        std::fs::write(&job, &text).unwrap();
        let o = wsctl(&["plan", job.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.trim().lines().count() == 1 && stderr.contains("not a regular file"),
            "plan {name}: {stderr}"
        );
    }

    // A truncated copy of the data.
    let data = scratch("truncated-data");
    for f in ["train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"] {
        std::fs::copy(repo().join("examples/data/mnist").join(f), data.join(f)).unwrap();
    }
    let images = std::fs::read(repo().join("examples/data/mnist/train-images-idx3-ubyte.gz")).unwrap();
    std::fs::write(data.join("train-images-idx3-ubyte.gz"), &images[..images.len() / 2]).unwrap();
    refused("truncated", &SMALL.replace("examples/data/mnist", data.to_str().unwrap()), "not a complete gzip");

    let o = wsctl(&["run", "/nonexistent/job.yaml"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.starts_with("error: cannot read /nonexistent/job.yaml"), "{stderr}");
}

#[test]
fn plan_prints_the_appliance_without_running() {
    let o = wsctl(&["plan", "examples/jobs/fc-mnist-sparse.yaml", "--cs2", "4", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["cs2"], 4);
    assert_eq!(plan["shard"], 32);
    assert_eq!(plan["layers"].as_array().map(Vec::len), Some(3));
    assert!(plan["simulated"]["step_s"].as_f64().is_some_and(|s| s > 0.0), "simulated step time: {plan}");
    assert!(plan["simulated"]["samples_per_s"].as_f64().is_some_and(|s| s > 0.0));
    let o = wsctl(&["plan", "examples/jobs/fc-mnist.yaml", "--cs2", "3"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not divisible"));
}
