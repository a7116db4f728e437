//! The data formats of #15 through `wsctl run`: the arrays example reaches its bar, and each bad input the
//! issue lists (a corrupt tokenizer.json, a ragged token file, ids beyond the vocabulary, arrays that disagree
//! with the model, a path leaving the volume, a missing claim) is one clear error line and a non-zero exit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{repo, wsctl};

use std::path::Path;

fn scratch(name: &str) -> common::Scratch {
    common::scratch("formats", name)
}

/// Runs `manifest` (with `extra` arguments) and asserts it fails with one `error:` line containing `needle`.
fn refused(name: &str, manifest: &str, extra: &[&str], needle: &str) {
    let dir = scratch(name);
    let job = dir.join("job.yaml");
    std::fs::write(&job, manifest).unwrap();
    let out = dir.join("out");
    let mut args = vec!["run", job.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = wsctl(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{name}: accepted");
    assert!(!stderr.contains("panicked"), "{name}: panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{name}: one error line, got {stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(needle), "{name}: `{needle}` not in {stderr}");
}

fn example(name: &str) -> String {
    std::fs::read_to_string(repo().join("examples/jobs").join(name)).unwrap()
}

#[test]
fn the_mlp_arrays_example_reaches_95_percent() {
    let dir = scratch("mlp-arrays");
    let out = dir.join("out");
    let o = wsctl(&["run", "examples/jobs/mlp-arrays.yaml", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let acc = s["eval"]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "held-out accuracy {acc}: {s}");
    assert_eq!(s["eval"]["samples"], 600, "the held-out file, every sample");
}

#[test]
fn bad_data_gets_one_clear_error() {
    let gpt = example("gpt-bpe.yaml");
    let files = scratch("files");
    let at = |name: &str| files.join(name).to_string_lossy().into_owned();

    // A corrupt tokenizer.json.
    let tok = std::fs::read_to_string(repo().join("examples/data/moby-dick/tokenizer.json")).unwrap();
    std::fs::write(at("tokenizer.json"), &tok[..tok.len() / 2]).unwrap();
    let corrupt = gpt.replace("examples/data/moby-dick/tokenizer.json", &at("tokenizer.json"));
    refused("corrupt-tokenizer", &corrupt, &[], "is not a Hugging Face tokenizer.json");
    // A model too small for its tokenizer.
    refused(
        "small-vocab",
        &gpt.replace("vocabSize: 1024", "vocabSize: 512"),
        &[],
        "set spec.model.vocabSize to at least 1024",
    );

    // Token files: a size that is not a multiple of the width, then an id beyond the vocabulary.
    let tokens = |path: &str| {
        gpt.replace("kind: text", "kind: tokens")
            .replace("examples/data/moby-dick/moby-dick.txt.gz", path)
            .replace("    tokenizer: examples/data/moby-dick/tokenizer.json\n", "")
    };
    std::fs::write(at("ragged.bin"), vec![1u8; 20_001]).unwrap();
    refused("ragged-tokens", &tokens(&at("ragged.bin")), &[], "20001 bytes is not a whole number of uint16");
    let mut ids: Vec<u8> = (0..20_000u32).flat_map(|i| ((i % 1000) as u16).to_le_bytes()).collect();
    ids[2 * 777..2 * 778].copy_from_slice(&5000u16.to_le_bytes());
    std::fs::write(at("beyond.bin"), ids).unwrap();
    refused(
        "tokens-beyond",
        &tokens(&at("beyond.bin")),
        &[],
        "token id 5000 at position 777 is beyond the vocabulary of 1024",
    );

    // Arrays whose width or classes disagree with the model.
    let arrays = example("mlp-arrays.yaml");
    refused(
        "arrays-width",
        &arrays.replace("[2, 128, 128, 3]", "[4, 128, 128, 3]"),
        &[],
        "set spec.model.layers[0] to 2",
    );
    refused(
        "arrays-classes",
        &arrays.replace("[2, 128, 128, 3]", "[2, 128, 128, 2]"),
        &[],
        "is not a class of the model's last layer",
    );
    refused(
        "arrays-name",
        &arrays.replace("inputs: inputs", "inputs: x"),
        &[],
        "has no tensor 'x' (it holds inputs, labels)",
    );

    // Volumes: a missing claim, and a symbolic link out of the volume.
    let pvc = example("gpt-bpe-pvc.yaml");
    refused("no-claim", &pvc, &[], "--volume weightstream-data=DIR");
    let volume = scratch("volume");
    std::fs::create_dir_all(volume.join("moby-dick")).unwrap();
    std::os::unix::fs::symlink(
        repo().join("examples/data/moby-dick/moby-dick.txt.gz"),
        volume.join("moby-dick/moby-dick.txt.gz"),
    )
    .unwrap();
    let claim = format!("weightstream-data={}", volume.display());
    refused("symlink-out", &pvc, &["--volume", &claim], "through a symbolic link");
}

#[test]
fn plan_checks_the_new_kinds_paths() {
    for job in ["examples/jobs/gpt-bpe.yaml", "examples/jobs/gpt-bpe-pvc.yaml", "examples/jobs/mlp-arrays.yaml"] {
        let o = wsctl(&["plan", job]);
        assert!(o.status.success(), "{job}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let folder = Path::new("/tmp").to_string_lossy().into_owned();
    let text = example("gpt-bpe.yaml").replace("examples/data/moby-dick/tokenizer.json", &folder);
    let dir = scratch("plan");
    let job = dir.join("job.yaml");
    std::fs::write(&job, text).unwrap();
    let o = wsctl(&["plan", job.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("spec.data.tokenizer /tmp is not a regular file"), "{stderr}");
}
