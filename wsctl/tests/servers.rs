//! MemoryX as weight servers: any number of servers trains the same model bit for bit (the update is
//! elementwise), a disk tier under a memory budget changes nothing but where the state lives, and a budget,
//! server count or checkpoint that cannot work is one clear error that loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{losses, repo, run, run_ok, summary};

use std::path::{Path, PathBuf};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("servers", name)
}

const MLP: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: servers}
spec:
  cs2: 2
  model: {kind: mlp, layers: [784, 64, 32, 10], sparsity: 0.7}
  data: {kind: mnist, path: examples/data/mnist}
  training:
    batchSize: 64
    steps: 16
    seed: 5
    optimizer: {kind: adamw, learningRate: 0.002, weightDecay: 0.0001}
"#;

const GPT: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: servers-gpt}
spec:
  cs2: 2
  model: {kind: gpt, contextLength: 32, width: 128, heads: 4, blocks: 8, mlpRatio: 4}
  data: {kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}
  training:
    batchSize: 8
    steps: 10
    seed: 7
    optimizer: {kind: adamw, learningRate: 0.002, weightDecay: 0.01}
"#;

/// `base` with `lines` added to its spec.
fn job(dir: &Path, name: &str, base: &str, lines: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, format!("{base}{lines}")).unwrap();
    path
}

#[test]
fn one_two_and_three_weight_servers_give_the_same_curve_bit_for_bit() {
    let dir = scratch("equal");
    for (model, base) in [("mlp", MLP), ("gpt", GPT)] {
        for mode in ["pipelined", "weightStreaming"] {
            let one = job(&dir, &format!("{model}-{mode}-1"), base, &format!("  executionMode: {mode}\n"));
            let reference_out = dir.join(format!("{model}-{mode}-1"));
            run_ok(&one, &reference_out, &[]);
            let reference = losses(&reference_out);
            assert!(!reference.is_empty());
            for servers in [2, 3] {
                let many = job(
                    &dir,
                    &format!("{model}-{mode}-{servers}"),
                    base,
                    &format!("  executionMode: {mode}\n  memoryx: {{servers: {servers}}}\n"),
                );
                let out = dir.join(format!("{model}-{mode}-{servers}"));
                run_ok(&many, &out, &[]);
                assert_eq!(losses(&out), reference, "{model}, {mode}: {servers} weight server processes against one");
                let s = summary(&out);
                assert_eq!(s["memoryx"]["servers"].as_array().map(Vec::len), Some(servers), "{s}");
                assert_eq!(
                    s["eval"]["loss"],
                    summary(&reference_out)["eval"]["loss"],
                    "{model}, {mode}: the same model at the end"
                );
                assert!(out.join(format!("logs/memoryx-{}.log", servers - 1)).exists(), "the servers ran as processes");
                // The SwarmX root takes every streamed layer straight from the servers (MemoryX without a
                // funnel; pipelined, the held-out evaluation) and counts the same bytes the coordinator would have.
                let root = std::fs::read_to_string(out.join("logs/swarmx-0-0.log")).unwrap();
                assert!(root.contains("streaming straight from the weight servers"), "{model}, {mode}: {root}");
                let reference = summary(&reference_out);
                assert_eq!(
                    s["bytes_streamed"], reference["bytes_streamed"],
                    "{model}, {mode}: the same bytes streamed"
                );
            }
            // In one process the servers are objects: the same curve again.
            let many = dir.join(format!("{model}-{mode}-3.yaml"));
            let out = dir.join(format!("{model}-{mode}-3-in-process"));
            run_ok(&many, &out, &["--in-process"]);
            assert_eq!(losses(&out), reference, "{model}, {mode}: three weight servers in one process");
        }
    }
}

/// Two weight servers, each with a quarter of its share of the state in memory: the rest lives in its disk
/// tier, the curve is the in-memory one bit for bit, and each server's peak resident memory stays within its
/// budget plus the stated overhead (the process before its slice, 48 MiB of transport and allocator slack, and
/// four of its largest layer slices in transit).
#[test]
fn a_tiered_run_gives_the_in_memory_curve_within_its_budget() {
    let dir = scratch("tier");
    let base = format!("{GPT}  executionMode: weightStreaming\n");
    let in_memory = job(&dir, "in-memory", &base, "  memoryx: {servers: 2}\n");
    run_ok(&in_memory, &dir.join("in-memory"), &[]);
    let state = summary(&dir.join("in-memory"))["memoryx"]["servers"][1]["memoryBytes"].as_u64().unwrap();
    let budget = state / 4;
    let tiered = job(&dir, "tiered", &base, &format!("  memoryx: {{servers: 2, memoryBytes: {budget}}}\n"));
    let plan = common::wsctl(&["plan", tiered.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(text.contains("2 weight server(s)") && text.contains("on disk"), "{text}");
    let out = dir.join("tiered");
    run_ok(&tiered, &out, &["--checkpoint-dir", dir.join("ck").to_str().unwrap()]);
    assert_eq!(losses(&out), losses(&dir.join("in-memory")), "the tier changes where the state lives, nothing else");
    let s = summary(&out);
    for server in s["memoryx"]["servers"].as_array().unwrap() {
        let get = |k: &str| server[k].as_u64().unwrap_or_else(|| panic!("{k} in {server}"));
        assert!(get("memoryBytes") <= budget, "{server}");
        assert!(get("diskBytes") >= state - budget, "most of the slice is on disk: {server}");
        assert!(get("tierReadBytes") > 0 && get("tierWrittenBytes") > 0, "{server}");
        let overhead = get("baselineRssBytes") + (48 << 20) + 4 * get("largestLayerBytes");
        eprintln!(
            "weight server {}: peak RSS {} of {} allowed",
            server["index"],
            get("peakRssBytes"),
            budget + overhead
        );
        assert!(
            get("peakRssBytes") <= budget + overhead,
            "peak RSS {} over budget {budget} + overhead {overhead}: {server}",
            get("peakRssBytes")
        );
    }
    // The tier's files are scratch: gone with the run, and never among the checkpoints.
    assert!(!out.join("tier").exists(), "the disk tier is removed at the end of the run");
    let leftovers: Vec<_> =
        walk(&dir.join("ck")).into_iter().filter(|p| p.extension().is_some_and(|e| e == "f32")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// One error line on standard error (after any progress lines), naming what is wrong and what to do.
fn one_error(o: &std::process::Output, wants: &[&str]) {
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    for w in wants {
        assert!(err.contains(w), "{w:?} in {err}");
    }
}

#[test]
fn a_budget_below_one_layer_and_more_servers_than_parameters_are_refused_by_the_plan() {
    let dir = scratch("refused");
    let small = job(
        &dir,
        "small",
        &format!("{GPT}  executionMode: weightStreaming\n"),
        "  memoryx: {servers: 1, memoryBytes: 1048576}\n",
    );
    one_error(
        &common::wsctl(&["plan", small.to_str().unwrap()]),
        &["memoryBytes", "largest layer", "add weight servers"],
    );
    one_error(&run(&small, &dir.join("small"), &[]), &["memoryBytes", "largest layer"]);
    let spirals = format!(
        "apiVersion: weightstream.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: tiny}}\nspec:\n  model: {{kind: mlp, layers: [2, 3]}}\n  \
         data: {{kind: arrays, path: {}}}\n  training: {{batchSize: 8, steps: 2, optimizer: {{kind: adamw, learningRate: 0.01}}}}\n  memoryx: {{servers: 10}}\n",
        repo().join("examples/data/spirals/train.safetensors").display()
    );
    let tiny = dir.join("tiny.yaml");
    std::fs::write(&tiny, spirals).unwrap();
    one_error(&common::wsctl(&["plan", tiny.to_str().unwrap()]), &["servers is 10", "only 9 parameters"]);
}

/// A checkpoint whose manifest names a slice that is missing, or damaged, is an error naming the slice and what
/// to do; the run touches nothing, so the checkpoint can be repaired and resumed.
#[test]
fn a_missing_or_partial_checkpoint_slice_is_a_clear_error_and_nothing_is_lost() {
    let dir = scratch("slices");
    let first = job(&dir, "first", MLP, "  memoryx: {servers: 2}\n  checkpoint: {intervalSteps: 4, keep: 2}\n");
    let ck = dir.join("ck");
    run_ok(&first, &dir.join("first"), &["--checkpoint-dir", ck.to_str().unwrap()]);
    let longer = job(
        &dir,
        "longer",
        &MLP.replace("steps: 16", "steps: 24"),
        "  memoryx: {servers: 2}\n  checkpoint: {intervalSteps: 4, keep: 2}\n",
    );
    let slice = ck.join("server-1/step-00000016.slice-1-of-2.safetensors");
    let kept = std::fs::read(&slice).unwrap();
    let before = walk(&ck);

    std::fs::remove_file(&slice).unwrap();
    let o = run(&longer, &dir.join("missing"), &["--checkpoint-dir", ck.to_str().unwrap()]);
    one_error(&o, &["step 16 is incomplete", "slice-1-of-2", "is missing", "restore the file"]);
    std::fs::write(&slice, &kept[..kept.len() / 2]).unwrap();
    let o = run(&longer, &dir.join("partial"), &["--checkpoint-dir", ck.to_str().unwrap()]);
    one_error(&o, &["step 16 is incomplete", "slice-1-of-2", "unusable"]);
    let mut after = walk(&ck);
    let mut expected = before.clone();
    after.sort();
    expected.sort();
    assert_eq!(after, expected, "no checkpoint file was removed or added");

    // Repaired, the run resumes from step 16 and finishes.
    std::fs::write(&slice, &kept).unwrap();
    let out = dir.join("repaired");
    run_ok(&longer, &out, &["--checkpoint-dir", ck.to_str().unwrap()]);
    let steps: Vec<u64> = losses(&out).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, (17..=24).collect::<Vec<_>>(), "resumed after step 16");
}

/// Copies the folder `from` (with its `server-i` folders) to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The tensors of a safetensors file, by name.
fn tensors_of(path: &Path) -> std::collections::HashMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().into_iter().map(|(n, v)| (n, v.data().to_vec())).collect()
}

/// A checkpoint three weight servers wrote resumes on two servers and on one (its slices cut again) and the run
/// continues the three-server curve bit for bit; exported, the sliced checkpoint gives the tensors a one-server
/// run's checkpoint of the same step gives.
#[test]
fn a_sliced_checkpoint_resumes_on_other_server_counts_and_exports() {
    let dir = scratch("recut");
    let with = |name: &str, servers: u32| {
        job(
            &dir,
            name,
            MLP,
            &format!("  memoryx: {{servers: {servers}}}\n  checkpoint: {{intervalSteps: 4, keep: 3}}\n"),
        )
    };
    let reference_out = dir.join("reference");
    let three = dir.join("three-ck");
    run_ok(&with("reference", 3), &reference_out, &["--checkpoint-dir", three.to_str().unwrap()]);
    let reference = losses(&reference_out);
    assert_eq!(reference.len(), 16);
    assert!(three.join("server-2/step-00000008.slice-2-of-3.safetensors").is_file());
    for servers in [2, 1] {
        // The run as if stopped after step 8: the later manifests gone.
        let ck = dir.join(format!("ck-{servers}"));
        copy_tree(&three, &ck);
        for step in [12, 16] {
            std::fs::remove_file(ck.join(format!("step-{step:08}.manifest.json"))).unwrap();
        }
        let out = dir.join(format!("resumed-{servers}"));
        run_ok(&with(&format!("resumed-{servers}"), servers), &out, &["--checkpoint-dir", ck.to_str().unwrap()]);
        assert_eq!(losses(&out), reference[8..].to_vec(), "three servers' checkpoint resumed on {servers}");
    }

    // The sliced checkpoint exports as the one-server checkpoint of the same step does.
    let one = dir.join("one-ck");
    run_ok(&with("one", 1), &dir.join("one"), &["--checkpoint-dir", one.to_str().unwrap()]);
    let export = |from: PathBuf, to: &str| {
        let out = dir.join(to);
        let o =
            common::wsctl(&["export", from.to_str().unwrap(), "--format", "safetensors", "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        tensors_of(&out.join("model.safetensors"))
    };
    let sliced = export(three.join("step-00000008.manifest.json"), "sliced-export");
    assert!(!sliced.is_empty());
    assert_eq!(sliced, export(one.join("step-00000008.safetensors"), "one-export"), "the same weights, bit for bit");
}
