//! Faults in a local run (`wsctl run`, every role its own process), in both execution modes:
//! - every role (MemoryX's coordinator, another weight server, the SwarmX root, an inner SwarmX node, an engine,
//!   an input worker) killed (SIGKILL) or frozen (SIGSTOP) mid-run ends the run within its bound, naming the
//!   component, and leaves no process behind;
//! - MemoryX stopped with SIGTERM (its pod evicted, its node drained) or the run interrupted with Ctrl-C saves
//!   the step in flight, and the same command resumes it on the undisturbed curve, every step exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

mod common;
use common::{losses, repo, run_ok};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("faults", name)
}

/// Four engines under two inner SwarmX nodes (fan-out 2), four input workers, MemoryX over two weight servers.
const JOB: &str = r#"
apiVersion: weightstream.dev/v1alpha1
kind: TrainingJob
metadata: {name: faults}
spec:
  cs2: 4
  model: {kind: mlp, layers: [784, 64, 32, 10], sparsity: 0.7}
  data: {kind: mnist, path: examples/data/mnist}
  memoryx: {servers: 2}
  training:
    batchSize: 64
    steps: STEPS
    seed: 5
    optimizer: {kind: adamw, learningRate: 0.002, weightDecay: 0.0001}
  checkpoint: {intervalSteps: 0}
  executionMode: MODE
"#;

fn job(dir: &Path, steps: u64, mode: &str) -> PathBuf {
    let path = dir.join(format!("{mode}.yaml"));
    std::fs::write(&path, JOB.replace("STEPS", &steps.to_string()).replace("MODE", mode)).unwrap();
    path
}

/// A `wsctl run` in the background, its standard error to a file.
struct Run {
    child: Child,
    out: PathBuf,
    stderr: PathBuf,
}

impl Run {
    fn start(job: &Path, out: &Path, extra: &[&str]) -> Run {
        std::fs::create_dir_all(out).unwrap();
        let stderr = out.with_extension("stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_wsctl"))
            .arg("run")
            .arg(job)
            .arg("--out")
            .arg(out)
            .args(["--swarmx-fan-out", "2"])
            .args(extra)
            .current_dir(repo())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("wsctl run starts");
        Run { child, out: out.to_path_buf(), stderr }
    }

    /// Waits until MemoryX has recorded `step` steps; returns the steps recorded.
    fn wait_for_step(&mut self, step: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let done = std::fs::read_to_string(self.out.join("metrics.jsonl")).map_or(0, |t| t.lines().count() as u64);
            if done >= step {
                return done;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the run ended ({status}) before step {step}: {}", self.stderr());
            }
            assert!(Instant::now() < deadline, "no step {step} within 2 minutes: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of the component `name` (from the run's table of processes).
    fn pid(&self, name: &str) -> String {
        let table = std::fs::read_to_string(self.out.join("logs/processes")).expect("the table of processes");
        table
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(n, _)| *n == name)
            .map(|(_, pid)| pid.to_string())
            .unwrap_or_else(|| panic!("no {name} in {table}"))
    }

    fn signal(&self, name: &str, signal: &str) {
        assert!(
            Command::new("kill").args([signal, &self.pid(name)]).status().unwrap().success(),
            "kill {signal} {name}"
        );
    }

    /// Waits for the run to end, at most `limit`; its success and how long it took.
    fn wait(&mut self, limit: Duration) -> (bool, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), started.elapsed());
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the run still goes {limit:?} later: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every role killed, then frozen, one at a time a few steps into a long run: the run fails naming it, within
/// the retry budget plus a call deadline (and a frozen one in about three health checks), with nothing left
/// running. Returns how long each case took to end, for the log.
fn every_role_killed_and_frozen(mode: &str) {
    let dir = scratch(mode);
    let job = job(&dir, 1_000_000, mode);
    let roles = ["memoryx", "memoryx-1", "swarmx-0-0", "swarmx-1-1", "engine-2", "input-3"];
    for (signal, what) in [("-KILL", "killed"), ("-STOP", "frozen")] {
        for role in roles {
            let out = dir.join(format!("{role}-{what}"));
            let mut run = Run::start(&job, &out, &[]);
            run.wait_for_step(3);
            run.signal(role, signal);
            // The retry budget (60 s) and a call deadline bound any case; a frozen one is named by its missed
            // health checks (3 × 2 s, 3 s each) long before.
            let (ok, took) = run.wait(Duration::from_secs(90));
            let stderr = run.stderr();
            let last = stderr.lines().rev().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
            eprintln!("{mode}: {role} {what}: ended in {took:.1?}: {last}");
            assert!(!ok, "{mode}: the run cannot finish with {role} {what}");
            assert!(
                last.contains(&format!("{role} ")) || last.contains(&format!("{role}'s")),
                "{mode}: the error names {role} ({what}): {stderr}"
            );
            if what == "frozen" {
                assert!(
                    last.contains("stopped answering its health check"),
                    "{mode}: {role} is named as frozen: {last}"
                );
                assert!(
                    took < Duration::from_secs(30),
                    "{mode}: a frozen {role} is found in a few health checks: {took:?}"
                );
            } else {
                assert!(last.contains(&format!("{role} exited")), "{mode}: {role} is named as gone: {last}");
                assert!(took < Duration::from_secs(10), "{mode}: a killed {role} is found at once: {took:?}");
            }
            drop(run);
            let mut left = common::processes_under(&out);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !left.is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                left = common::processes_under(&out);
            }
            assert!(left.is_empty(), "{mode}: {role} {what}: processes left behind: {left:?}");
        }
    }
}

#[test]
fn every_role_killed_or_frozen_is_named_in_time_pipelined() {
    every_role_killed_and_frozen("pipelined");
}

#[test]
fn every_role_killed_or_frozen_is_named_in_time_weight_streaming() {
    every_role_killed_and_frozen("weightStreaming");
}

/// The newest checkpoint's step in `dir` (one file for one server, a manifest over slices for several).
fn newest_checkpoint(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.ends_with(".tmp"))
        .filter_map(|n| n.strip_prefix("step-")?.split('.').next()?.parse::<u64>().ok())
        .max()
}

/// A run stopped gracefully `how` (SIGTERM to MemoryX, as the kubelet sends it; SIGINT to `wsctl`, as Ctrl-C
/// does) a few steps in: MemoryX checkpoints the step in flight or the next (nothing is lost), the run ends
/// saying where it resumes from, and the same command resumes it on the undisturbed curve, bit for bit, every
/// step once.
fn stopped_and_resumed(mode: &str, how: &str) {
    let dir = scratch(&format!("{mode}-{how}"));
    let job = job(&dir, 300, mode);
    // In one process the engines' sums run in another order than through the tree: each is compared with its own.
    let in_process = how == "ctrl-c-in-process";
    let undisturbed_args: Vec<&str> =
        ["--swarmx-fan-out", "2"].into_iter().chain(in_process.then_some("--in-process")).collect();
    run_ok(&job, &dir.join("undisturbed"), &undisturbed_args);
    let undisturbed = losses(&dir.join("undisturbed"));
    assert_eq!(undisturbed.len(), 300);

    let out = dir.join("stopped");
    let ckpt = dir.join("checkpoints");
    let args = ["--checkpoint-dir", ckpt.to_str().unwrap()];
    let args: Vec<&str> = args.iter().copied().chain(in_process.then_some("--in-process")).collect();
    let mut run = Run::start(&job, &out, &args);
    let seen = run.wait_for_step(40);
    match how {
        "sigterm" => run.signal("memoryx", "-TERM"),
        _ => assert!(Command::new("kill").args(["-INT", &run.child.id().to_string()]).status().unwrap().success()),
    }
    let (ok, took) = run.wait(Duration::from_secs(60));
    let stderr = run.stderr();
    assert!(!ok, "a stopped run is not a finished one: {stderr}");
    let saved = newest_checkpoint(&ckpt).unwrap_or_else(|| panic!("no checkpoint after the stop: {stderr}"));
    let recorded = losses(&out).last().map_or(0, |c| c.0);
    eprintln!(
        "{mode}, {how}: step {seen} seen, checkpoint of step {saved} written, {recorded} recorded, stopped in {took:.1?}"
    );
    // How many steps pass between the test seeing one and the signal arriving depends on the machine's load (CI
    // once saw 4 where this machine sees 1 or 2, and a cold CI run 73 in the pipelined mode, which steps every
    // few milliseconds): the stop promises that nothing seen is lost, that the run ends on the step it saved, and
    // that it ends soon (in time, the step count being the load's), not at the end of the run.
    assert!(saved >= seen, "nothing seen is lost: step {saved} saved after {seen} seen");
    assert_eq!(recorded, saved, "the run ends on the step it saved, none run past it");
    assert!(
        saved < 300 && took < Duration::from_secs(10),
        "the stop ends the run soon, before its end: step {saved} of 300 after {seen} seen, in {took:?}"
    );
    let said = match how {
        "sigterm" | "ctrl-c-in-process" => format!("stopped on a termination signal after step {saved}"),
        _ => format!("interrupted after step {saved}; MemoryX saved it in"),
    };
    assert!(stderr.contains(&said), "the run says where it stopped ({said}): {stderr}");

    let again: Vec<&str> = ["--swarmx-fan-out", "2", "--checkpoint-dir", ckpt.to_str().unwrap()]
        .into_iter()
        .chain(in_process.then_some("--in-process"))
        .collect();
    run_ok(&job, &out, &again);
    let resumed = losses(&out);
    assert_eq!(
        resumed.iter().map(|c| c.0).collect::<Vec<_>>(),
        (1..=300).collect::<Vec<_>>(),
        "every step exactly once"
    );
    assert_eq!(resumed, undisturbed, "{mode}: the resumed run is the undisturbed one, bit for bit");
}

#[test]
fn sigterm_to_memoryx_saves_the_step_in_flight_and_the_run_resumes_pipelined() {
    stopped_and_resumed("pipelined", "sigterm");
}

#[test]
fn sigterm_to_memoryx_saves_the_step_in_flight_and_the_run_resumes_weight_streaming() {
    stopped_and_resumed("weightStreaming", "sigterm");
}

#[test]
fn ctrl_c_saves_the_step_in_flight_and_the_same_command_resumes() {
    stopped_and_resumed("pipelined", "ctrl-c");
}

#[test]
fn ctrl_c_in_process_saves_the_step_in_flight_and_the_same_command_resumes() {
    stopped_and_resumed("weightStreaming", "ctrl-c-in-process");
}
