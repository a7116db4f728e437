//! The appliance on this machine: MemoryX, a SwarmX tree and one engine per CS-2, each its own process on
//! 127.0.0.1 with ephemeral ports — the same programs that run as pods. `wsctl` supervises them: it names a
//! component that crashes and stops the rest, stops them all on Ctrl-C, and every child also exits when
//! `wsctl` goes away (their standard input closes), so no process is left behind.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// A line a child printed on standard output.
struct Line {
    child: usize,
    text: String,
}

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

/// The running processes of one local job.
pub struct Appliance {
    procs: Vec<Proc>,
    lines: Receiver<Line>,
    tx: Sender<Line>,
    logs: PathBuf,
    job: PathBuf,
    job_id: String,
    interrupted: Arc<AtomicBool>,
}

impl Drop for Appliance {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string))
        .unwrap_or_else(|| "(no output)".into())
}

impl Appliance {
    /// An empty appliance for the job manifest at `job`, logging into `logs`.
    pub fn new(job: PathBuf, job_id: String, logs: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
        let interrupted = Arc::new(AtomicBool::new(false));
        let flag = interrupted.clone();
        // A second handler cannot be installed in one process; the first one (from an earlier run) still works.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
        let (tx, lines) = mpsc::channel();
        Ok(Appliance { procs: Vec::new(), lines, tx, logs, job, job_id, interrupted })
    }

    /// Starts `wsctl node ROLE ARGS…` as `name`.
    fn spawn(&mut self, name: &str, role: &str, args: &[String]) -> Result<usize> {
        let exe = std::env::current_exe().context("cannot find the wsctl executable")?;
        let log = self.logs.join(format!("{name}.log"));
        let err = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(exe)
            .arg("node")
            .arg(role)
            .arg("--job")
            .arg(&self.job)
            .arg("--job-id")
            .arg(&self.job_id)
            .arg("--exit-with-stdin")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let id = self.procs.len();
        if let Some(out) = child.stdout.take() {
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                for text in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    if tx.send(Line { child: id, text }).is_err() {
                        break;
                    }
                }
            });
        }
        self.procs.push(Proc { name: name.to_string(), child, log });
        Ok(id)
    }

    /// Fails with the name of the first child that has exited, unless it is `allowed` and exited cleanly.
    fn check(&mut self, allowed: Option<usize>) -> Result<Option<usize>> {
        if self.interrupted.load(Ordering::SeqCst) {
            bail!("interrupted; stopped MemoryX, SwarmX and the engines");
        }
        for (i, p) in self.procs.iter_mut().enumerate() {
            if let Some(status) = p.child.try_wait().with_context(|| format!("cannot check {}", p.name))? {
                if Some(i) == allowed && status.success() {
                    return Ok(Some(i));
                }
                return Err(anyhow!(
                    "{} exited ({status}): {} (log: {}); stopped the other components",
                    p.name,
                    last_line(&p.log),
                    p.log.display()
                ));
            }
        }
        Ok(None)
    }

    /// Starts a role and waits for it to announce its gRPC address.
    fn start(&mut self, name: &str, role: &str, args: &[String]) -> Result<String> {
        let id = self.spawn(name, role, args)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check(None)?;
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(Line { child, text }) if child == id => {
                    if let Some(addr) = text.strip_prefix(&format!("{role} grpc listening on ")).or_else(|| text.strip_prefix("engine grpc listening on ")) {
                        return Ok(format!("http://{addr}"));
                    }
                }
                Ok(_) => {}
                Err(_) if Instant::now() > deadline => bail!("{name} did not start within a minute"),
                Err(_) => {}
            }
        }
    }

    /// Starts `engines` engines and a SwarmX tree of `fanout` above them; returns the root's address.
    pub fn start_fabric(&mut self, engines: u32, fanout: usize) -> Result<String> {
        let mut level = Vec::new();
        for i in 0..engines {
            level.push(self.start(&format!("engine-{i}"), "engine", &["--index".into(), i.to_string()])?);
        }
        let mut depth = 0;
        loop {
            let mut next = Vec::new();
            for (k, group) in level.chunks(fanout.max(2)).enumerate() {
                let name = format!("swarmx-{depth}-{k}");
                next.push(self.start(&name, "swarmx", &["--children".into(), group.join(",")])?);
            }
            level = next;
            depth += 1;
            if level.len() == 1 {
                return Ok(level.remove(0));
            }
        }
    }

    /// Starts MemoryX against the root and follows its progress until it finishes, calling `on_progress` with
    /// each step's metrics.
    pub fn run_memoryx(&mut self, args: &[String], mut on_progress: impl FnMut(&serde_json::Value)) -> Result<()> {
        let id = self.spawn("memoryx", "memoryx", args)?;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(Line { child, text }) if child == id => {
                    if let Some(json) = text.strip_prefix("progress ") {
                        if let Ok(v) = serde_json::from_str(json) {
                            on_progress(&v);
                        }
                    }
                }
                _ => {}
            }
            if self.check(Some(id))?.is_some() {
                return Ok(());
            }
        }
    }
}
