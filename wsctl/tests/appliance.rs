//! The appliance as separate processes on loopback: the same loss curve for any engine count, an engine
//! killed mid-run and replaced, and MemoryX restarted from its checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{losses, repo, run_ok};
use crds::contract::Handshake;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("appliance", name)
}

const JOB: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: plane}
spec:
  cs2: 1
  model: {kind: mlp, layers: [784, 64, 32, 10], sparsity: 0.7}
  data: {kind: mnist, path: examples/data/mnist}
  training:
    batchSize: 64
    steps: 24
    seed: 5
    optimizer: {kind: adamw, learningRate: 0.002, weightDecay: 0.0001}
  checkpoint: {intervalSteps: 5, keep: 2}
"#;

fn same_curve(a: &[(u64, f64)], b: &[(u64, f64)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: step counts differ");
    for ((sa, la), (sb, lb)) in a.iter().zip(b) {
        assert_eq!(sa, sb, "{what}: steps differ");
        assert!((la - lb).abs() <= 1e-3 * (1.0 + la.abs()), "{what}: step {sa}: {la} vs {lb}");
    }
}

#[test]
fn one_two_and_four_engines_give_the_same_curve() {
    let dir = scratch("equivalence");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB.replace("intervalSteps: 5", "intervalSteps: 0")).unwrap();
    run_ok(&job, &dir.join("in-process"), &["--in-process"]);
    let reference = losses(&dir.join("in-process"));
    let in_process: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("in-process/summary.json")).unwrap()).unwrap();
    assert_eq!(reference.len(), 24);
    let streaming = dir.join("streaming.yaml");
    std::fs::write(
        &streaming,
        JOB.replace("intervalSteps: 5", "intervalSteps: 0") + "  executionMode: weightStreaming\n",
    )
    .unwrap();
    // The model fits an engine, so `auto` keeps it resident (pipelined); weight streaming must give the same
    // curve. With a fan-out of 2, four engines sit under two SwarmX nodes under the root.
    for (job, mode) in [(&job, "pipelined"), (&streaming, "weightStreaming")] {
        for n in ["1", "2", "4"] {
            let out = dir.join(format!("{mode}-cs2-{n}"));
            run_ok(job, &out, &["--cs2", n, "--swarmx-fan-out", "2"]);
            same_curve(&reference, &losses(&out), &format!("{n} engine processes ({mode}) vs in-process"));
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
            assert_eq!(summary["engines"].as_array().map(Vec::len), Some(n.parse().unwrap()));
            assert_eq!(summary["execution_mode"], mode);
            assert!(summary["wse_utilization"].as_f64().is_some_and(|u| u > 0.0 && u <= 1.0), "{summary}");
            let (got, want) = (&summary["eval"], &in_process["eval"]);
            assert_eq!(got["samples"], want["samples"]);
            let close = |k: &str, tol: f64| (got[k].as_f64().unwrap() - want[k].as_f64().unwrap()).abs() <= tol;
            assert!(close("loss", 1e-6) && close("accuracy", 1e-3), "evaluation of {mode} on {n}: {got} vs {want}");
        }
    }
    // Two input workers per CS-2 split each engine's shard between them: the engines see the same samples.
    let two = dir.join("two-workers.yaml");
    std::fs::write(
        &two,
        JOB.replace("intervalSteps: 5", "intervalSteps: 0")
            .replace("path: examples/data/mnist}", "path: examples/data/mnist, workers: 2}"),
    )
    .unwrap();
    let out = dir.join("two-workers");
    run_ok(&two, &out, &["--cs2", "2"]);
    same_curve(&reference, &losses(&out), "two input workers per CS-2 vs one");
    for i in 0..4 {
        assert!(out.join(format!("logs/input-{i}.log")).exists(), "input worker {i} of 2 x 2 ran");
    }
    assert!(common::processes_under(&dir).is_empty(), "no process is left behind");
}

/// This process's CPUs as the kernel lists them (`/proc/self/status`), each one.
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    list.split(',')
        .flat_map(|part| {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
        })
        .collect()
}

/// `--engine-cpus`: the engines run on those CPUs and every other role on the rest (as each role's log says the
/// kernel reported once pinned), the curve unchanged; with `--in-process` the whole run is pinned. A list that
/// leaves the other roles nothing is refused before anything starts.
#[test]
fn engines_run_on_their_own_cpus_and_every_other_role_on_the_rest() {
    let dir = scratch("cpus");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB.replace("intervalSteps: 5", "intervalSteps: 0") + "  executionMode: weightStreaming\n")
        .unwrap();
    let cpus = allowed_cpus();
    let all = format!("{}-{}", cpus[0], cpus[cpus.len() - 1]);
    let refused = common::wsctl(&[
        "run",
        job.to_str().unwrap(),
        "--out",
        dir.join("all").to_str().unwrap(),
        "--engine-cpus",
        &all,
    ]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("leaves no CPU for MemoryX"), "{said}");
    assert!(!dir.join("all").exists(), "nothing started");
    // This machine has 2 cores or more (the README's requirement); the last one is the engines'.
    let engine = cpus[cpus.len() - 1].to_string();
    // The others' CPUs as the kernel lists them: these are consecutive.
    let rest = match &cpus[..cpus.len() - 1] {
        [one] => one.to_string(),
        more => format!("{}-{}", more[0], more[more.len() - 1]),
    };
    run_ok(&job, &dir.join("free"), &["--cs2", "2"]);
    run_ok(&job, &dir.join("pinned"), &["--cs2", "2", "--engine-cpus", &engine]);
    assert_eq!(losses(&dir.join("free")), losses(&dir.join("pinned")), "pinning changes no loss");
    let mut roles = BTreeSet::new();
    for entry in std::fs::read_dir(dir.join("pinned/logs")).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        let first = std::fs::read_to_string(&path).unwrap().lines().next().unwrap_or_default().to_string();
        let on = first.rsplit_once("on CPUs ").map(|(_, c)| c.to_string()).unwrap_or_default();
        let want = if name.starts_with("engine-") { &engine } else { &rest };
        assert_eq!(&on, want, "{name}: {first}");
        roles.insert(name.split('-').next().unwrap().to_string());
    }
    assert_eq!(roles.into_iter().collect::<Vec<_>>(), ["engine", "input", "memoryx", "swarmx"]);
    let o = common::wsctl(&[
        "run",
        job.to_str().unwrap(),
        "--out",
        dir.join("one").to_str().unwrap(),
        "--in-process",
        "--engine-cpus",
        &engine,
    ]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && said.contains(&format!("on CPUs {engine} (--engine-cpus)")), "{said}");
    assert!(common::processes_under(&dir).is_empty(), "no process is left behind");
}

/// An input worker killed mid-epoch and started again on its address: the step it broke is rerun, and the run
/// gives the undisturbed curve with every step exactly once.
#[test]
fn a_killed_input_worker_is_replaced_and_the_step_reruns() {
    let dir = scratch("input-fault");
    let job = dir.join("job.yaml");
    let long = JOB
        .replace("cs2: 1", "cs2: 2")
        .replace("intervalSteps: 5", "intervalSteps: 0")
        .replace("steps: 24", "steps: 100")
        + "  executionMode: weightStreaming\n";
    std::fs::write(&job, long).unwrap();
    run_ok(&job, &dir.join("undisturbed"), &[]);
    let mut inputs: Vec<Node> = (0..2).map(|_| node("input", &job, &[])).collect();
    let engines: Vec<Node> = (0..2).map(|i| engine(&job, i, &inputs[i], &[])).collect();
    let children: Vec<String> = engines.iter().map(Node::url).collect();
    let sx = node("swarmx", &job, &["--children", &children.join(",")]);
    let (out, log) = (dir.join("disturbed"), dir.join("memoryx.log"));
    let (mut mx, mut progress) = memoryx(&job, &sx, &inputs[0], &["--out", out.to_str().unwrap()], &log);
    // Mid-epoch (an epoch is 125 steps of 64): freeze MemoryX between steps, kill engine 1's worker, go on
    // without it, and only then start a replacement on its address.
    wait_for_step(&mut progress, 6);
    let signal = |sig: &str| Command::new("kill").args([sig, &mx.id().to_string()]).status().unwrap();
    assert!(signal("-STOP").success());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut victim = inputs.pop().unwrap();
    let addr = victim.addr.clone();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    assert!(signal("-CONT").success());
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let _replacement = node("input", &job, &["--listen", &addr]);
    std::thread::spawn(move || for _ in progress.lines() {});
    let status = mx.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "memoryx finished after the input worker was replaced: {stderr}");
    assert!(stderr.contains("step aborted, rerunning"), "a step really was aborted and rerun: {stderr}");
    let curve = losses(&out);
    assert_eq!(curve.iter().map(|c| c.0).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>(), "every step exactly once");
    same_curve(&losses(&dir.join("undisturbed")), &curve, "with an input worker killed mid-epoch");
    drop((engines, sx, inputs));
}

/// `--in-process` runs through the same driver as MemoryX's program: it runs pipelined when the model fits,
/// writes its checkpoints, and its per-step loss equals the process run's (within 1e-6 relative) in both
/// execution modes.
#[test]
fn in_process_runs_checkpoint_and_match_the_processes_in_both_modes() {
    let dir = scratch("in-process-driver");
    for mode in ["auto", "weightStreaming"] {
        let job = dir.join(format!("{mode}.yaml"));
        std::fs::write(&job, JOB.to_string() + &format!("  executionMode: {mode}\n")).unwrap();
        let (inp, procs) = (dir.join(format!("{mode}-in-process")), dir.join(format!("{mode}-processes")));
        let ck = |d: &Path| d.join("checkpoints");
        run_ok(&job, &inp, &["--in-process", "--checkpoint-dir", ck(&inp).to_str().unwrap()]);
        run_ok(&job, &procs, &["--checkpoint-dir", ck(&procs).to_str().unwrap()]);
        let (a, b) = (losses(&inp), losses(&procs));
        assert_eq!(a.len(), 24);
        for ((sa, la), (sb, lb)) in a.iter().zip(&b) {
            assert_eq!(sa, sb);
            assert!((la - lb).abs() <= 1e-6 * lb.abs(), "{mode}: step {sa}: in-process {la} vs processes {lb}");
        }
        let want = if mode == "auto" { "pipelined" } else { "weightStreaming" };
        for out in [&inp, &procs] {
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
            assert_eq!(summary["execution_mode"], want, "{}", out.display());
            // intervalSteps 5 and keep 2 over 24 steps: 20 and the final 24 remain.
            let mut files: Vec<String> =
                std::fs::read_dir(ck(out)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            files.sort();
            assert_eq!(files, ["step-00000020.safetensors", "step-00000024.safetensors"], "{}", out.display());
        }
        // A rerun of the in-process job resumes from its last checkpoint, as the processes do: nothing is left.
        run_ok(&job, &inp, &["--in-process", "--checkpoint-dir", ck(&inp).to_str().unwrap()]);
        assert_eq!(losses(&inp), a, "the resumed in-process run keeps its metrics");
    }
}

/// A role started by hand, as a pod would be.
struct Node {
    child: Child,
    addr: String,
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(role: &str, job: &Path, args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wsctl"))
        .args(["node", role, "--job"])
        .arg(job)
        .arg("--identity")
        .arg(common::identity(job))
        .args(args)
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("role starts");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    (child, out)
}

/// Reads a role's standard output up to its ready handshake: its gRPC and HTTP addresses.
fn ready(role: &str, out: &mut BufReader<ChildStdout>) -> (Option<String>, String) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).expect("read") > 0, "{role} exited before listening");
        if let Some(Handshake::Ready { grpc, http, .. }) = Handshake::from_line(line.trim()) {
            return (grpc.map(|a| a.to_string()), http.to_string());
        }
    }
}

fn node(role: &str, job: &Path, args: &[&str]) -> Node {
    let (child, mut out) = start(role, job, args);
    let (grpc, _) = ready(role, &mut out);
    Node { child, addr: grpc.expect("a gRPC address"), _stdout: out }
}

impl Node {
    /// Its gRPC URL.
    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

/// Engine `index` fed by the input worker `input`; `extra` adds flags.
fn engine(job: &Path, index: usize, input: &Node, extra: &[&str]) -> Node {
    let (index, inputs) = (index.to_string(), input.url());
    let args: Vec<&str> =
        ["--index", index.as_str(), "--inputs", inputs.as_str()].into_iter().chain(extra.iter().copied()).collect();
    node("engine", job, &args)
}

/// MemoryX started by hand against the SwarmX node `sx` and the input worker `input`, reporting progress on its
/// standard output and logging to `log`; `extra` adds flags.
fn memoryx(job: &Path, sx: &Node, input: &Node, extra: &[&str], log: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut mx = Command::new(env!("CARGO_BIN_EXE_wsctl"))
        .args(["node", "memoryx", "--job"])
        .arg(job)
        .arg("--identity")
        .arg(common::identity(job))
        .args(["--stage", &sx.url(), "--input", &input.url(), "--progress"])
        .args(extra)
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let progress = BufReader::new(mx.stdout.take().unwrap());
    (mx, progress)
}

/// Reads MemoryX's progress lines until step `step` has been reported.
fn wait_for_step(progress: &mut BufReader<ChildStdout>, step: u64) {
    let mut line = String::new();
    while !matches!(Handshake::from_line(line.trim()), Some(Handshake::Progress(p)) if p.step >= step) {
        line.clear();
        assert!(progress.read_line(&mut line).unwrap() > 0, "memoryx ended early");
    }
}

/// Runs a job of `cs2` engines (`mode` appended to its spec) as separate processes, kills the last engine a
/// few steps in and starts a replacement on its address; the run must finish on the undisturbed curve.
/// Returns MemoryX's log.
fn kill_and_replace_an_engine(name: &str, cs2: usize, mode: &str) -> String {
    let dir = scratch(name);
    let job = dir.join("job.yaml");
    let long = JOB
        .replace("cs2: 1", &format!("cs2: {cs2}"))
        .replace("intervalSteps: 5", "intervalSteps: 0")
        .replace("steps: 24", "steps: 120")
        + &format!("  executionMode: {mode}\n");
    std::fs::write(&job, long).unwrap();
    run_ok(&job, &dir.join("undisturbed"), &[]);

    let input = node("input", &job, &[]);
    let mut engines: Vec<Node> = (0..cs2).map(|i| engine(&job, i, &input, &[])).collect();
    let children: Vec<String> = engines.iter().map(Node::url).collect();
    let sx = node("swarmx", &job, &["--children", &children.join(",")]);
    let out = dir.join("disturbed");
    let log = dir.join("memoryx.log");
    let (mut mx, mut progress) = memoryx(&job, &sx, &input, &["--out", out.to_str().unwrap()], &log);
    // Freeze MemoryX a few steps in, kill the last engine under it, let it go on against the dead engine, and
    // only then start a replacement on the same address.
    wait_for_step(&mut progress, 6);
    let signal = |sig: &str| Command::new("kill").args([sig, &mx.id().to_string()]).status().unwrap();
    assert!(signal("-STOP").success());
    // Let the step already in flight below MemoryX finish everywhere, so the engine is lost between steps (lost
    // during the `Apply` broadcast, the survivors would be a step ahead and the run would go back to MemoryX's
    // copy instead; that path is the single-engine test's).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut victim = engines.pop().unwrap();
    let addr = victim.addr.clone();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    assert!(signal("-CONT").success());
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let _replacement = engine(&job, cs2 - 1, &input, &["--listen", &addr]);
    std::thread::spawn(move || for _ in progress.lines() {});
    let status = mx.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "memoryx finished after the engine was replaced: {stderr}");
    assert!(stderr.contains("step aborted, rerunning"), "a step really was aborted and rerun: {stderr}");
    let undisturbed = losses(&dir.join("undisturbed"));
    assert_eq!(undisturbed.len(), 120);
    same_curve(&undisturbed, &losses(&out), &format!("{name}: with an engine killed mid-run"));
    drop((engines, sx, input));
    stderr
}

#[test]
fn a_killed_engine_is_replaced_and_the_step_reruns() {
    let log = kill_and_replace_an_engine("engine-fault-streaming", 2, "weightStreaming");
    assert!(!log.contains("replica"), "weight streaming keeps no replicas: {log}");
}

#[test]
fn a_replacement_engine_gets_the_replica_of_a_surviving_one() {
    let log = kill_and_replace_an_engine("engine-fault-pipelined", 2, "pipelined");
    assert!(!log.contains("every replica was lost"), "engine 0 kept its replica: {log}");
}

#[test]
fn when_the_only_replica_is_lost_the_run_goes_back_to_memoryx_and_reruns() {
    let log = kill_and_replace_an_engine("engine-fault-alone", 1, "pipelined");
    assert!(log.contains("rerunning from MemoryX's copy"), "the lost steps were rerun from MemoryX's copy: {log}");
}

/// Pipelined, the sole replica lost: MemoryX took the replicas' state back into its memory at least every
/// `snapshotSeconds` (here 1), so the run goes back no further than that. Measured from MemoryX's own progress:
/// the steps redone had taken at most the snapshot interval (and a step) the first time; the curve is the
/// undisturbed one.
#[test]
fn a_lost_sole_replica_redoes_at_most_snapshot_seconds_of_work() {
    let dir = scratch("snapshot");
    let job = dir.join("job.yaml");
    let text =
        JOB.replace("intervalSteps: 5", "intervalSteps: 0, snapshotSeconds: 1").replace("steps: 24", "steps: 5000")
            + "  executionMode: pipelined\n";
    std::fs::write(&job, text).unwrap();
    run_ok(&job, &dir.join("undisturbed"), &[]);

    let input = node("input", &job, &[]);
    let mut victim = engine(&job, 0, &input, &[]);
    let sx = node("swarmx", &job, &["--children", &victim.url()]);
    let out = dir.join("disturbed");
    let log = dir.join("memoryx.log");
    let (mut mx, mut progress) = memoryx(&job, &sx, &input, &["--out", out.to_str().unwrap()], &log);
    // Each step's first report and when it came, until two and a half seconds of training have passed.
    let mut reported: std::collections::HashMap<u64, std::time::Instant> = std::collections::HashMap::new();
    let mut first = None;
    let mut line = String::new();
    loop {
        line.clear();
        assert!(progress.read_line(&mut line).unwrap() > 0, "memoryx ended early");
        if let Some(Handshake::Progress(p)) = Handshake::from_line(line.trim()) {
            let now = std::time::Instant::now();
            reported.entry(p.step).or_insert(now);
            // Mid-way between two snapshots (they follow the first step's second by second).
            if first.get_or_insert(now).elapsed() > std::time::Duration::from_millis(2500) {
                assert!(p.step < 4000, "the run is too fast to be disturbed mid-way: step {} after 2.5 s", p.step);
                break;
            }
        }
    }
    let addr = victim.addr.clone();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let _replacement = engine(&job, 0, &input, &["--listen", &addr]);
    std::thread::spawn(move || for _ in progress.lines() {});
    let status = mx.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "memoryx finished after the engine was replaced: {stderr}");
    same_curve(&losses(&dir.join("undisturbed")), &losses(&out), "with the sole replica lost");
    // The log's text without its terminal colours.
    let plain: String = {
        let mut out = String::new();
        let mut chars = stderr.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().find(|c| c.is_ascii_alphabetic());
            } else {
                out.push(c);
            }
        }
        out
    };
    let lost = plain
        .lines()
        .find(|l| l.contains("every replica was lost"))
        .unwrap_or_else(|| panic!("the replica was lost: {plain}"));
    let field = |name: &str| -> u64 {
        let at = lost.find(&format!("{name}=")).unwrap_or_else(|| panic!("{name} in {lost}")) + name.len() + 1;
        lost[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
    };
    let (from, to) = (field("from"), field("to"));
    assert!(to > 0 && to <= from, "MemoryX's copy was taken after the start: {lost}");
    let (t_to, t_from) = (reported[&to], reported.get(&from).copied().unwrap_or_else(std::time::Instant::now));
    let redone = t_from.duration_since(t_to);
    eprintln!("steps {to}..{from} redone: {} steps, {redone:?} of work the first time", from - to);
    assert!(
        redone <= std::time::Duration::from_millis(1500),
        "at most snapshotSeconds (1 s) of work redone, and a step: {redone:?} ({to}..{from})"
    );
    drop((sx, input));
}

/// An engine that stops answering without dying (SIGSTOP: a hung host, a silent partition) is found by its
/// missed keepalive pings; MemoryX reruns the step while it may come back and then fails naming the engine's
/// address, within its deadline, instead of hanging while holding every CS-2.
#[test]
fn a_frozen_engine_is_detected_and_named_within_the_deadline() {
    let dir = scratch("frozen");
    let job = dir.join("job.yaml");
    std::fs::write(
        &job,
        JOB.replace("cs2: 1", "cs2: 2")
            .replace("intervalSteps: 5", "intervalSteps: 0")
            .replace("steps: 24", "steps: 100000"),
    )
    .unwrap();
    let input = node("input", &job, &[]);
    let engines: Vec<Node> = (0..2).map(|i| engine(&job, i, &input, &[])).collect();
    let children: Vec<String> = engines.iter().map(Node::url).collect();
    let sx = node("swarmx", &job, &["--children", &children.join(",")]);
    let log = dir.join("memoryx.log");
    let (mut mx, mut progress) = memoryx(&job, &sx, &input, &["--retry-seconds", "10"], &log);
    wait_for_step(&mut progress, 3);
    let frozen = engines[1].child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &frozen]).status().unwrap().success());
    std::thread::spawn(move || for _ in progress.lines() {});
    let stopped_at = std::time::Instant::now();
    // Keepalive (5 s pings, 20 s timeout) finds the first loss; the 10 s retry deadline ends the run after it.
    let limit = std::time::Duration::from_secs(90);
    let status = loop {
        if let Some(s) = mx.try_wait().unwrap() {
            break Some(s);
        }
        if stopped_at.elapsed() > limit {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = Command::new("kill").args(["-CONT", &frozen]).status();
    let stderr = std::fs::read_to_string(&log).unwrap();
    let Some(status) = status else {
        let _ = mx.kill();
        panic!("MemoryX still waits {limit:?} after its engine froze: {stderr}");
    };
    assert!(!status.success(), "the run cannot finish without its engine");
    let last = stderr.lines().rev().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(last.contains(&engines[1].addr), "the error names the frozen engine ({}): {last}", engines[1].addr);
    drop((engines, sx, input));
}

#[test]
fn memoryx_restarts_from_its_checkpoint() {
    let dir = scratch("memoryx-restart");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB).unwrap();
    run_ok(&job, &dir.join("undisturbed"), &["--checkpoint-dir", dir.join("ckpt-a").to_str().unwrap()]);

    let input = node("input", &job, &[]);
    let e0 = engine(&job, 0, &input, &[]);
    let sx = node("swarmx", &job, &["--children", &e0.url()]);
    let out = dir.join("restarted");
    let ckpt = dir.join("ckpt-b");
    let identity = common::identity(&job);
    let (sx_url, input_url) = (sx.url(), input.url());
    let args = [
        "--identity",
        identity.to_str().unwrap(),
        "--stage",
        &sx_url,
        "--input",
        &input_url,
        "--out",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ];
    // Crash after 12 steps: the newest checkpoint holds step 10.
    let crashed = Command::new(env!("CARGO_BIN_EXE_wsctl"))
        .args(["node", "memoryx", "--job"])
        .arg(&job)
        .args(args)
        .args(["--crash-after-steps", "12"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(
        crashed.status.code(),
        Some(3),
        "fault injection exits abruptly: {}",
        String::from_utf8_lossy(&crashed.stderr)
    );
    assert_eq!(losses(&out).len(), 12);
    let steps: Vec<String> =
        std::fs::read_dir(&ckpt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert!(steps.iter().any(|s| s.contains("00000010")), "checkpoint of step 10 is there: {steps:?}");
    assert!(!steps.iter().any(|s| s.ends_with(".tmp")), "no half-written checkpoint: {steps:?}");

    let resumed = Command::new(env!("CARGO_BIN_EXE_wsctl"))
        .args(["node", "memoryx", "--job"])
        .arg(&job)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let curve = losses(&out);
    assert_eq!(curve.iter().map(|c| c.0).collect::<Vec<_>>(), (1..=24).collect::<Vec<_>>(), "every step exactly once");
    same_curve(&losses(&dir.join("undisturbed")), &curve, "after a MemoryX restart");
    drop((e0, sx, input));
}

/// Three weight servers, one killed between steps 12 and 13 and started again on its address with nothing: the
/// coordinator finds it holds another step, takes every server back to the last complete checkpoint (step 10)
/// and trains on, giving the undisturbed curve with every step exactly once.
#[test]
fn a_killed_weight_server_takes_every_server_back_to_the_last_complete_checkpoint() {
    let dir = scratch("weight-server-fault");
    let job = dir.join("job.yaml");
    std::fs::write(
        &job,
        JOB.replace("  checkpoint:", "  memoryx: {servers: 3}\n  executionMode: weightStreaming\n  checkpoint:"),
    )
    .unwrap();
    run_ok(&job, &dir.join("undisturbed"), &["--checkpoint-dir", dir.join("ckpt-a").to_str().unwrap()]);
    let input = node("input", &job, &[]);
    let e0 = engine(&job, 0, &input, &[]);
    let sx = node("swarmx", &job, &["--children", &e0.url()]);
    let ckpt = dir.join("ckpt-b");
    let (sx_url, input_url, ck) = (sx.url(), input.url(), ckpt.to_str().unwrap().to_string());
    let server = |index: &str, extra: &[&str]| {
        let args: Vec<&str> =
            ["--server-index", index, "--stage", &sx_url, "--input", &input_url, "--checkpoint-dir", &ck]
                .into_iter()
                .chain(extra.iter().copied())
                .collect();
        node("memoryx", &job, &args)
    };
    let (s1, s2) = (server("1", &[]), server("2", &[]));
    let servers = format!("{},{}", s1.url(), s2.url());
    let (out, log) = (dir.join("disturbed"), dir.join("memoryx.log"));
    let extra = ["--out", out.to_str().unwrap(), "--checkpoint-dir", &ck, "--weight-servers", &servers];
    let (mut mx, mut progress) = memoryx(&job, &sx, &input, &extra, &log);
    wait_for_step(&mut progress, 12);
    let signal = |sig: &str| Command::new("kill").args([sig, &mx.id().to_string()]).status().unwrap();
    assert!(signal("-STOP").success());
    let addr = s2.addr.clone();
    drop(s2);
    let _replacement = server("2", &["--listen", &addr]);
    assert!(signal("-CONT").success());
    std::thread::spawn(move || for _ in progress.lines() {});
    let status = mx.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "memoryx finished after the weight server was replaced: {stderr}");
    assert!(stderr.contains("resuming every server from the last complete checkpoint"), "{stderr}");
    let curve = losses(&out);
    assert_eq!(curve.iter().map(|c| c.0).collect::<Vec<_>>(), (1..=24).collect::<Vec<_>>(), "every step exactly once");
    let undisturbed = losses(&dir.join("undisturbed"));
    assert_eq!(curve, undisturbed, "bit for bit the undisturbed curve");
    // The complete checkpoints are the manifests; every server kept its slices of them.
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
        v.sort();
        v
    };
    assert!(names(&ckpt).contains(&"step-00000024.manifest.json".to_string()), "{:?}", names(&ckpt));
    assert!(names(&ckpt.join("server-2")).contains(&"step-00000024.slice-2-of-3.safetensors".to_string()));
    drop((e0, sx, input, s1));
}

/// A GET of a health or metrics endpoint as a probe or a scraper makes it: over TLS, without a certificate.
fn http_get(job: &Path, addr: &str, path: &str) -> String {
    common::https("GET", addr, path, &common::ca(job), None).expect("the endpoint answers")
}

/// The metric names the PromQL queries of the chart's Grafana dashboard `name` read.
fn dashboard_metrics(name: &str) -> BTreeSet<String> {
    let path = repo().join("charts/weightstream/dashboards").join(name);
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    for target in d["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let words = target["expr"].as_str().unwrap().split(|c: char| !(c.is_ascii_alphanumeric() || "_:".contains(c)));
        names.extend(words.filter(|w| w.starts_with("ws_") || w.starts_with("weightstream_")).map(str::to_string));
    }
    names
}

/// The metric names that have samples in a text exposition (the body of an HTTP response).
fn sampled(response: &str) -> BTreeSet<String> {
    let body = response.split_once("\r\n\r\n").map_or(response, |(_, body)| body);
    let samples = body.lines().filter(|l| !l.is_empty() && !l.starts_with('#'));
    samples.filter_map(|l| l.split(['{', ' ']).next()).map(str::to_string).collect()
}

/// Every role answers `/healthz` and `/metrics` while a job runs, and the metrics the chart's Grafana dashboards
/// query are there: the data plane's on the job's four roles, the operator's on the operator's exporter.
#[test]
fn every_server_has_health_and_metrics_and_the_dashboards_query_them() {
    let dir = scratch("metrics");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB.replace("intervalSteps: 5", "intervalSteps: 0")).unwrap();
    let (mut input, mut iout) = start("input", &job, &[]);
    let (igrpc, ihttp) = ready("input", &mut iout);
    let inputs = format!("https://{}", igrpc.expect("the input worker serves gRPC"));
    let (mut engine, mut out) = start("engine", &job, &["--inputs", &inputs]);
    let (grpc, http) = ready("engine", &mut out);
    let grpc = grpc.expect("the engine serves gRPC");
    let (mut swarmx, mut sout) = start("swarmx", &job, &["--children", &format!("https://{grpc}")]);
    let (sgrpc, shttp) = ready("swarmx", &mut sout);
    let stage = format!("https://{}", sgrpc.expect("SwarmX serves gRPC"));
    let args = ["--stage", &stage, "--input", &inputs, "--progress", "--linger"];
    let (mut memoryx, mut mout) = start("memoryx", &job, &args);
    let (_, mhttp) = ready("memoryx", &mut mout);
    wait_for_step(&mut mout, 24);
    for addr in [&http, &shttp, &ihttp, &mhttp] {
        assert!(http_get(&job, addr, "/healthz").ends_with("ok"), "{addr}");
    }
    // The engines' gauges follow once a second.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let metrics = http_get(&job, &http, "/metrics");
    for name in ["ws_engine_busy_fraction", "ws_engine_bytes_received", "ws_engine_sram_bytes"] {
        assert!(metrics.contains(name), "{name} missing from engine metrics:\n{metrics}");
    }
    let mut exported = sampled(&metrics);
    let metrics = http_get(&job, &shttp, "/metrics");
    assert!(metrics.contains("ws_swarmx_reduce_seconds") && metrics.contains("ws_swarmx_engines 1"), "{metrics}");
    exported.extend(sampled(&metrics));
    let metrics = http_get(&job, &ihttp, "/metrics");
    assert!(metrics.contains("ws_input_train_samples"), "{metrics}");
    exported.extend(sampled(&metrics));
    let metrics = http_get(&job, &mhttp, "/metrics");
    assert!(metrics.contains("ws_step 24"), "{metrics}");
    exported.extend(sampled(&metrics));
    let data_plane = dashboard_metrics("data-plane.json");
    assert!(data_plane.len() >= 8, "{data_plane:?}");
    let missing: Vec<&String> = data_plane.difference(&exported).collect();
    assert!(missing.is_empty(), "the data-plane dashboard queries {missing:?}, which no role exports: {exported:?}");
    // The operator's exporter, once it has counted a pass, the jobs and the pool.
    let op = operator::metrics::Metrics::new();
    op.observe(true, std::time::Duration::from_millis(3));
    op.census(&[("Running".to_string(), 1)]);
    op.set_pool(8, 2);
    let exported = sampled(&op.encode());
    let queried = dashboard_metrics("operator.json");
    assert!(queried.len() >= 4, "{queried:?}");
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(missing.is_empty(), "the operator dashboard queries {missing:?}, which it does not export: {exported:?}");
    for c in [&mut memoryx, &mut engine, &mut swarmx, &mut input] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Every data-plane endpoint of a job answers only to the job: gRPC stages refuse another job's certificate and
/// plaintext; MemoryX's `/status` and `/checkpoint` answer `401` without a certificate, refuse another job's in
/// the handshake and answer the job's own and the operator's; `/healthz` and `/metrics` stay open for probes
/// and scrapers. The job, meanwhile, trains to the end.
#[test]
fn every_endpoint_refuses_anyone_without_the_jobs_identity() {
    use wire::identity::{CERT, Identity, KEY, OPERATOR_CERT, OPERATOR_KEY};
    let dir = scratch("identity");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB.replace("intervalSteps: 5", "intervalSteps: 0").replace("steps: 24", "steps: 300"))
        .unwrap();
    let input = node("input", &job, &[]);
    let e0 = engine(&job, 0, &input, &[]);
    let sx = node("swarmx", &job, &["--children", &e0.url()]);
    let (mut mx, mut out) = memoryx(&job, &sx, &input, &["--linger"], &dir.join("memoryx.log"));
    let (_, mx_http) = ready("memoryx", &mut out);
    wait_for_step(&mut out, 2);
    std::thread::spawn(move || for _ in out.lines() {});

    let ids = common::identity(&job);
    let file = |name: &str| std::fs::read_to_string(ids.join(name)).unwrap();
    let own = Identity::load(&ids).unwrap();
    let other = wire::identity::issue("other", &[]).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |addr: &str, id: &Identity| {
        let dial = wire::grpc::Dial::new(id, std::time::Duration::from_secs(3));
        rt.block_on(runtime::swarmx::relay::connect(&format!("https://{addr}"), "plane", dial))
    };
    for (what, addr) in [("engine", &e0.addr), ("swarmx", &sx.addr)] {
        let err = connect(addr, &other.job_identity())
            .err()
            .unwrap_or_else(|| panic!("the {what} took another job's certificate"));
        assert!(err.to_string().contains(addr.as_str()), "{what}: {err}");
        let plaintext = rt.block_on(async {
            let mut c =
                runtime::protocol::pb::stage_client::StageClient::connect(format!("http://{addr}")).await.ok()?;
            c.info(runtime::protocol::pb::InfoRequest { job: "plane".into() }).await.ok()
        });
        assert!(plaintext.is_none(), "the {what} answered a plaintext call");
        assert_eq!(connect(addr, &own).expect("the job's own identity is let in").engines, 1, "{what}");
    }

    // The input worker answers only the job's own identity too.
    let describe = |id: &Identity| {
        rt.block_on(async {
            let dial = wire::grpc::Dial::new(id, std::time::Duration::from_secs(3));
            let channel = wire::grpc::channel(&input.url(), dial).ok()?;
            let mut client = runtime::protocol::pb::input_client::InputClient::new(channel);
            client.describe(runtime::protocol::pb::DescribeRequest { job: "plane".into() }).await.ok()
        })
    };
    assert!(describe(&other.job_identity()).is_none(), "the input worker took another job's certificate");
    assert!(describe(&own).is_some_and(|d| d.into_inner().train_samples > 0), "the job's own identity is let in");

    let ca = common::ca(&job);
    let get = |path: &str, client: Option<(&str, &str)>| common::https("GET", &mx_http, path, &ca, client);
    let (job_cert, job_key, op_cert, op_key) = (file(CERT), file(KEY), file(OPERATOR_CERT), file(OPERATOR_KEY));
    assert!(get("/healthz", None).unwrap().starts_with("HTTP/1.1 200"), "probes need no certificate");
    assert!(get("/metrics", None).unwrap().starts_with("HTTP/1.1 200"), "scrapers need no certificate");
    for path in ["/status", "/checkpoint"] {
        let method = if path == "/status" { "GET" } else { "POST" };
        let anonymous = common::https(method, &mx_http, path, &ca, None).unwrap();
        assert!(anonymous.starts_with("HTTP/1.1 401"), "{path} without a certificate: {anonymous}");
        let stranger = common::https(method, &mx_http, path, &ca, Some((&other.job.cert, &other.job.key)));
        assert!(
            stranger.as_ref().is_err() || !stranger.as_ref().unwrap().contains(" 200 "),
            "{path} with another job's certificate: {stranger:?}"
        );
    }
    let plain = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&mx_http).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        write!(s, "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        String::from_utf8_lossy(&b).to_string()
    };
    assert!(!plain.contains("step"), "plaintext HTTP got the status: {plain}");
    assert!(
        get("/status", Some((&op_cert, &op_key))).unwrap().starts_with("HTTP/1.1 200"),
        "the operator's identity reads /status"
    );

    // The job was never disturbed: it trains to the end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let status = get("/status", Some((&job_cert, &job_key))).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        if status.contains("Succeeded") {
            assert!(status.contains("\"step\":300"), "{status}");
            break;
        }
        assert!(!status.contains("Failed"), "{status}");
        assert!(std::time::Instant::now() < deadline, "the job did not finish: {status}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = mx.kill();
    let _ = mx.wait();
    drop((e0, sx, input));
}

/// A job's checkpoints come back over MemoryX's HTTPS with the job's identity: `wsctl checkpoint list` shows
/// them newest first, `pull` fetches the newest or a chosen step byte for byte (verified, nothing else left in
/// the folder); without the job's certificate the routes answer `401`, with another job's the pull fails, and no
/// name but a listed checkpoint's is served (traversal, temporary files, other files: `404`). The run's records
/// (`GET /run`: metrics, summary, TensorBoard event files) come back the same way (`wsctl tensorboard pull`).
#[test]
fn checkpoints_are_pulled_over_https_with_the_jobs_identity_only() {
    use wire::identity::{CERT, KEY};
    let dir = scratch("pull");
    let job = dir.join("job.yaml");
    std::fs::write(&job, JOB.replace("steps: 24", "steps: 20")).unwrap();
    let ck = dir.join("checkpoints");
    let input = node("input", &job, &[]);
    let e0 = engine(&job, 0, &input, &[]);
    let sx = node("swarmx", &job, &["--children", &e0.url()]);
    let run = dir.join("run");
    let args = ["--linger", "--checkpoint-dir", ck.to_str().unwrap(), "--out", run.to_str().unwrap()];
    let (mut mx, mut out) = memoryx(&job, &sx, &input, &args, &dir.join("memoryx.log"));
    let (_, mx_http) = ready("memoryx", &mut out);
    std::thread::spawn(move || for _ in out.lines() {});
    let ids = common::identity(&job);
    let (ca, cert, key) = (
        common::ca(&job),
        std::fs::read_to_string(ids.join(CERT)).unwrap(),
        std::fs::read_to_string(ids.join(KEY)).unwrap(),
    );
    let get = |path: &str| common::https("GET", &mx_http, path, &ca, Some((&cert, &key))).expect("MemoryX answers");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !get("/status").contains("Succeeded") {
        assert!(std::time::Instant::now() < deadline, "the job did not finish: {}", get("/status"));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Files that are not checkpoints, in the checkpoint folder and outside it.
    std::fs::write(ck.join(".step-00000099.safetensors.tmp"), b"half a checkpoint").unwrap();
    std::fs::write(ck.join("notes.txt"), b"not a checkpoint").unwrap();
    std::fs::write(dir.join("secret.txt"), b"not yours").unwrap();

    let url = format!("https://{mx_http}");
    let wsctl = |args: &[&str]| common::wsctl(args);
    let o = wsctl(&["checkpoint", "list", "--url", &url, "--identity", ids.to_str().unwrap()]);
    let listing = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().last()).collect();
    assert_eq!(files, vec!["step-00000020.safetensors", "step-00000015.safetensors"], "{listing}");
    let json = get("/checkpoints");
    assert!(json.starts_with("HTTP/1.1 200") && !json.contains("tmp") && !json.contains("notes"), "{json}");

    let pulled = dir.join("pulled");
    let pull = |extra: &[&str], identity: &Path| {
        let mut args = vec![
            "checkpoint",
            "pull",
            "--url",
            &url,
            "--identity",
            identity.to_str().unwrap(),
            "-o",
            pulled.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        wsctl(&args)
    };
    let o = pull(&["--job", job.to_str().unwrap()], &ids);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let newest = pulled.join("step-00000020.safetensors");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), newest.to_str().unwrap());
    assert_eq!(std::fs::read(&newest).unwrap(), std::fs::read(ck.join("step-00000020.safetensors")).unwrap());
    let o = pull(&["--step", "15"], &ids);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(pulled.join("step-00000015.safetensors")).unwrap(),
        std::fs::read(ck.join("step-00000015.safetensors")).unwrap()
    );
    let o = pull(&["--step", "3"], &ids);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no checkpoint of step 3") && err.contains("[20, 15]"), "{err}");
    let mut names: Vec<String> =
        std::fs::read_dir(&pulled).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        vec!["step-00000015.safetensors", "step-00000020.safetensors"],
        "only verified checkpoints, no partial files"
    );

    // A file damaged on MemoryX's volume arrives damaged: refused by its checksum, nothing kept.
    let damaged = ck.join("step-00000015.safetensors");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let n = bytes.len();
    bytes[n - 7] ^= 0x20;
    std::fs::write(&damaged, bytes).unwrap();
    let fresh = dir.join("fresh");
    let o = wsctl(&[
        "checkpoint",
        "pull",
        "--url",
        &url,
        "--identity",
        ids.to_str().unwrap(),
        "--step",
        "15",
        "-o",
        fresh.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("arrived damaged") && err.contains("checksum"), "{err}");
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0, "nothing kept");
    // A job whose plan cannot hold this checkpoint (a smaller model) bounds the download before it starts.
    let small = dir.join("small.yaml");
    std::fs::write(&small, JOB.replace("[784, 64, 32, 10]", "[784, 8, 10]")).unwrap();
    let o = wsctl(&[
        "checkpoint",
        "pull",
        "--url",
        &url,
        "--identity",
        ids.to_str().unwrap(),
        "--job",
        small.to_str().unwrap(),
        "-o",
        fresh.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("the job's plan allows"), "{err}");
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0, "nothing kept");

    // Another job's identity: the handshake fails, nothing is written.
    let other = dir.join("other-identity");
    wire::identity::issue("other", &[]).unwrap().write_roles_files(&other).unwrap();
    std::fs::remove_dir_all(&pulled).unwrap();
    let o = pull(&[], &other);
    assert!(!o.status.success(), "another job's identity pulled a checkpoint");
    assert!(std::fs::read_dir(&pulled).map(|d| d.count()).unwrap_or(0) == 0, "nothing written");

    // No certificate at all: 401 on the listing and on every file.
    for path in ["/checkpoints", "/checkpoints/step-00000020.safetensors"] {
        let anonymous = common::https("GET", &mx_http, path, &ca, None).unwrap();
        assert!(anonymous.starts_with("HTTP/1.1 401"), "{path}: {anonymous}");
    }
    // Only listed names are served, even to the job.
    for path in [
        "/checkpoints/../../etc/passwd",
        "/checkpoints/..%2F..%2F..%2Fetc%2Fpasswd",
        "/checkpoints/..%2Fsecret.txt",
        "/checkpoints/.step-00000099.safetensors.tmp",
        "/checkpoints/notes.txt",
        "/checkpoints/step-00000010.safetensors",
    ] {
        let answer = get(path);
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        assert!(
            !answer.contains("root:") && !answer.contains("not yours") && !answer.contains("half"),
            "{path}: {answer}"
        );
    }
    assert!(get("/checkpoints/..%2F..%2Fetc%2Fpasswd").contains("no checkpoint named"), "a clear message");

    // The run's records (`GET /run`), as `wsctl tensorboard pull` fetches them: the job's identity only, listed
    // names only, and the event file holds every step's loss once.
    std::fs::write(run.join("notes.txt"), b"not a record").unwrap();
    let listing = get("/run");
    assert!(
        listing.contains("metrics.jsonl") && listing.contains("events.out.tfevents.") && !listing.contains("notes")
    );
    for path in ["/run", "/run/metrics.jsonl"] {
        let anonymous = common::https("GET", &mx_http, path, &ca, None).unwrap();
        assert!(anonymous.starts_with("HTTP/1.1 401"), "{path}: {anonymous}");
    }
    for path in ["/run/notes.txt", "/run/..%2Fsecret.txt", "/run/..%2Fcheckpoints%2Fstep-00000020.safetensors"] {
        let answer = get(path);
        assert!(answer.starts_with("HTTP/1.1 404") && !answer.contains("not yours"), "{path}: {answer}");
    }
    let records = dir.join("records");
    let o = wsctl(&[
        "tensorboard",
        "pull",
        "--url",
        &url,
        "--identity",
        ids.to_str().unwrap(),
        "-o",
        records.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(printed.lines().count(), 3, "an event file, metrics.jsonl and summary.json: {printed}");
    assert_eq!(
        std::fs::read(records.join("metrics.jsonl")).unwrap(),
        std::fs::read(run.join("metrics.jsonl")).unwrap()
    );
    let event_file = printed.lines().find(|l| l.contains("tfevents")).unwrap();
    let events = runtime::tensorboard::read_events(&std::fs::read(event_file).unwrap()).unwrap();
    let losses: Vec<i64> = events
        .iter()
        .filter(|e| matches!(&e.what, Some(runtime::tensorboard::What::Summary(s)) if s.value.iter().any(|v| v.tag == "loss")))
        .map(|e| e.step)
        .collect();
    assert_eq!(losses, (1..=20).collect::<Vec<i64>>(), "every step's loss once");

    // A sliced checkpoint (a run on two weight servers, its files laid into the folder as the coordinator lays
    // them out) is listed with its slices and pulled joined into one checkpoint of the same state; a damaged
    // slice is refused by the manifest's checksum and nothing is kept.
    let two = dir.join("two.yaml");
    std::fs::write(
        &two,
        JOB.replace("steps: 24", "steps: 10").replace("  checkpoint:", "  memoryx: {servers: 2}\n  checkpoint:"),
    )
    .unwrap();
    let two_ck = dir.join("two-ck");
    let o = wsctl(&[
        "run",
        two.to_str().unwrap(),
        "--in-process",
        "--out",
        dir.join("two").to_str().unwrap(),
        "--checkpoint-dir",
        two_ck.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::create_dir_all(ck.join("server-1")).unwrap();
    for file in [
        "step-00000010.manifest.json",
        "step-00000010.slice-0-of-2.safetensors",
        "server-1/step-00000010.slice-1-of-2.safetensors",
    ] {
        std::fs::copy(two_ck.join(file), ck.join(file)).unwrap();
    }
    let o = wsctl(&["checkpoint", "list", "--url", &url, "--identity", ids.to_str().unwrap()]);
    let listing = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        listing.lines().any(|l| l.contains("step-00000010.manifest.json") && l.contains("(2 slices)")),
        "{listing}"
    );
    let sliced = dir.join("pulled-sliced");
    let o = wsctl(&[
        "checkpoint",
        "pull",
        "--url",
        &url,
        "--identity",
        ids.to_str().unwrap(),
        "--step",
        "10",
        "--job",
        two.to_str().unwrap(),
        "-o",
        sliced.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let joined = sliced.join("step-00000010.safetensors");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), joined.to_str().unwrap());
    let (step, mut got) = runtime::memoryx::checkpoint::read(&joined, 1 << 30).unwrap();
    let (_, mut want) =
        runtime::memoryx::manifest::read_joined(&two_ck.join("step-00000010.manifest.json"), 1 << 30).unwrap();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!((step, got.len()), (10, want.len()));
    assert!(got == want, "the pulled checkpoint holds the sliced state");
    assert_eq!(std::fs::read_dir(&sliced).unwrap().count(), 1, "the joined checkpoint alone, no staging left");
    let slice = ck.join("server-1/step-00000010.slice-1-of-2.safetensors");
    let mut bytes = std::fs::read(&slice).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x10;
    std::fs::write(&slice, bytes).unwrap();
    let fresh = dir.join("fresh-sliced");
    let o = wsctl(&[
        "checkpoint",
        "pull",
        "--url",
        &url,
        "--identity",
        ids.to_str().unwrap(),
        "--step",
        "10",
        "-o",
        fresh.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("arrived damaged") && err.contains("checksum"), "{err}");
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0, "nothing kept");
    let _ = mx.kill();
    let _ = mx.wait();
    drop((e0, sx, input));
}
