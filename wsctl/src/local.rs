//! The appliance on this machine: MemoryX, a SwarmX tree, one engine per CS-2 and its input workers, each its own process on
//! 127.0.0.1 with ephemeral ports — the same programs that run as pods, started as `wsctl node ROLE ARGS…` with
//! arguments rendered from the contract's types. `wsctl` supervises them: it learns their ports and progress
//! from their typed handshake lines, names a component that crashes and stops the rest, stops them all on
//! Ctrl-C, and every child also exits when `wsctl` goes away (their standard input closes), so no process is
//! left behind.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use crds::contract::{
    input_workers_of, CommonArgs, EngineArgs, Handshake, InputArgs, MemoryxArgs, ProgressReport, Role, RoleArgs, SwarmxArgs, SwarmxChild, SwarmxNode,
    SwarmxTree,
};

/// Runs one role in this process: `wsctl node ROLE ARGS…`, parsed by the role program's own parser.
pub fn node(role: &str, args: Vec<String>) -> Result<()> {
    fn parse<A: RoleArgs>(args: Vec<String>) -> A {
        A::try_parse_from(std::iter::once(A::ROLE.binary().to_string()).chain(args)).unwrap_or_else(|e| e.exit())
    }
    match Role::from_name(role) {
        Some(Role::Memoryx) => runtime::memoryx::node::main(parse(args))?,
        Some(Role::Swarmx) => runtime::swarmx::node::main(parse(args))?,
        Some(Role::Engine) => sim_wse::node::main(parse(args))?,
        Some(Role::Input) => runtime::input::node::main(parse(args))?,
        None => bail!("unknown role '{role}': use memoryx, swarmx, engine or input"),
    }
    Ok(())
}

/// What every local process of one run is told.
struct RunFiles<'a> {
    /// The run's copy of the job.
    job: &'a Path,
    /// Its wire identity.
    job_id: &'a str,
    /// The run's ephemeral TLS identity.
    identity: &'a Path,
}

/// The arguments every local process shares: the run's files, an ephemeral HTTP port, and exit when `wsctl`
/// goes away.
fn common(run: &RunFiles) -> CommonArgs {
    CommonArgs { job_id: Some(run.job_id.to_string()), exit_with_stdin: true, ..CommonArgs::new(run.job, run.identity) }
}

/// An ephemeral port on the loopback interface.
fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Engine `index`'s arguments, fed by the input workers at `inputs`.
fn engine_args(run: &RunFiles, index: u32, inputs: Vec<String>) -> EngineArgs {
    EngineArgs::new(common(run), loopback(), index, inputs)
}

/// Input worker `index`'s arguments, reading the data volume (if the job names one) from `data_root`.
fn input_args(run: &RunFiles, index: u32, data_root: Option<PathBuf>) -> InputArgs {
    InputArgs::new(common(run), loopback(), index, data_root)
}

/// A SwarmX node's arguments, given where its children listen.
fn swarmx_args(run: &RunFiles, children: Vec<String>) -> SwarmxArgs {
    SwarmxArgs::new(common(run), loopback(), children)
}

/// The local name of SwarmX node `node`: the operator's pod name without the job.
fn swarmx_name(node: &SwarmxNode) -> String {
    format!("swarmx-{}-{}", node.level, node.index)
}

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
    identity: PathBuf,
    interrupted: Arc<AtomicBool>,
}

impl Drop for Appliance {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        // The run's identity dies with it: its CA's key was never kept, and its certificate's key goes now.
        let _ = std::fs::remove_dir_all(&self.identity);
    }
}

/// Issues the run's ephemeral identity into a fresh directory only this user can read, so a local run is one
/// command and still speaks mutual TLS like a job in a cluster.
fn ephemeral_identity(job_id: &str) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("wsctl-identity-{}-{nanos}", std::process::id()));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    runtime::identity::issue(job_id, &[])?.write_roles_files(&dir)?;
    Ok(dir)
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
        let identity = ephemeral_identity(&job_id)?;
        Ok(Appliance { procs: Vec::new(), lines, tx, logs, job, job_id, identity, interrupted })
    }

    /// Starts `wsctl node ROLE ARGS…` as `name`.
    fn spawn<A: RoleArgs>(&mut self, name: &str, args: &A) -> Result<usize> {
        let exe = std::env::current_exe().context("cannot find the wsctl executable")?;
        let log = self.logs.join(format!("{name}.log"));
        let err = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(exe)
            .arg("node")
            .arg(A::ROLE.as_str())
            .args(args.argv())
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

    /// Starts a role and waits for its [`Handshake::Ready`]; returns the URL of its gRPC service.
    fn start<A: RoleArgs>(&mut self, name: &str, args: &A) -> Result<String> {
        let id = self.spawn(name, args)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check(None)?;
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(Line { child, text }) if child == id => {
                    if let Some(Handshake::Ready { grpc: Some(addr), .. }) = Handshake::from_line(&text) {
                        return Ok(format!("https://{addr}"));
                    }
                }
                Ok(_) => {}
                Err(_) if Instant::now() > deadline => bail!("{name} did not start within a minute"),
                Err(_) => {}
            }
        }
    }

    /// Starts `per_cs2` input workers for each of `engines` engines, reading the data volume from `data_root`;
    /// returns their addresses, worker by worker.
    pub fn start_inputs(&mut self, engines: u32, per_cs2: u32, data_root: Option<PathBuf>) -> Result<Vec<String>> {
        let (job, job_id, identity) = (self.job.clone(), self.job_id.clone(), self.identity.clone());
        let run = RunFiles { job: &job, job_id: &job_id, identity: &identity };
        (0..engines * per_cs2.max(1))
            .map(|i| self.start(&format!("input-{i}"), &input_args(&run, i, data_root.clone())))
            .collect()
    }

    /// Starts the plan's engines, each fed by its block of `inputs` (per [`input_workers_of`]), and its SwarmX
    /// tree above them, leaves first; returns the root's address.
    pub fn start_fabric(&mut self, engines: u32, tree: &SwarmxTree, inputs: &[String]) -> Result<String> {
        let (job, job_id, identity) = (self.job.clone(), self.job_id.clone(), self.identity.clone());
        let run = RunFiles { job: &job, job_id: &job_id, identity: &identity };
        let per_cs2 = (inputs.len() as u32 / engines.max(1)).max(1);
        let engine_urls = (0..engines)
            .map(|i| {
                let mine = input_workers_of(i, per_cs2).filter_map(|w| inputs.get(w as usize).cloned()).collect();
                self.start(&format!("engine-{i}"), &engine_args(&run, i, mine))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut node_urls: Vec<Vec<String>> = tree.levels.iter().map(|l| vec![String::new(); l.len()]).collect();
        for node in tree.nodes_bottom_up() {
            let children = node
                .children
                .iter()
                .map(|c| match *c {
                    SwarmxChild::Engine(e) => engine_urls[e as usize].clone(),
                    SwarmxChild::Swarmx { level, index } => node_urls[level][index].clone(),
                })
                .collect();
            node_urls[node.level][node.index] = self.start(&swarmx_name(node), &swarmx_args(&run, children))?;
        }
        Ok(node_urls[0][0].clone())
    }

    /// The arguments MemoryX gets in this appliance, driving the tree at `root` and asking the input worker at
    /// `input` what the data holds.
    pub fn memoryx_args(&self, root: String, input: String) -> MemoryxArgs {
        let run = RunFiles { job: &self.job, job_id: &self.job_id, identity: &self.identity };
        MemoryxArgs { progress: true, ..MemoryxArgs::new(common(&run), root, input) }
    }

    /// Starts MemoryX's weight servers 1..`servers` (server 0 is the coordinator, started by
    /// [`Appliance::run_memoryx`]), each as `coordinator`'s arguments say but for its index, so its checkpoint
    /// slices go beside the coordinator's; returns their addresses, in server order.
    pub fn start_weight_servers(&mut self, servers: u32, coordinator: &MemoryxArgs) -> Result<Vec<String>> {
        (1..servers)
            .map(|index| {
                let args = MemoryxArgs { server_index: index, progress: false, out: None, sample: 0, ..coordinator.clone() };
                self.start(&format!("memoryx-{index}"), &args)
            })
            .collect()
    }

    /// Starts MemoryX and follows its progress until it finishes, calling `on_progress` with each step's report.
    pub fn run_memoryx(&mut self, args: &MemoryxArgs, mut on_progress: impl FnMut(&ProgressReport)) -> Result<()> {
        let id = self.spawn(Role::Memoryx.as_str(), args)?;
        loop {
            if let Ok(Line { child, text }) = self.lines.recv_timeout(Duration::from_millis(100)) {
                if let (true, Some(Handshake::Progress(p))) = (child == id, Handshake::from_line(&text)) {
                    on_progress(&p);
                }
            }
            if self.check(Some(id))?.is_some() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command line the local runner renders parses back, through the role program's own parser, into
    /// the arguments it was rendered from.
    #[test]
    fn every_argv_the_local_runner_builds_parses_with_the_programs_parsers() {
        fn check<A: RoleArgs + PartialEq + std::fmt::Debug>(args: &A) {
            let argv = std::iter::once(A::ROLE.binary().to_string()).chain(args.argv());
            assert_eq!(&A::try_parse_from(argv).expect("parses"), args);
        }
        let job = Path::new("/tmp/run/job.yaml");
        let run = RunFiles { job, job_id: "j-1", identity: Path::new("/tmp/run/identity") };
        let tree = SwarmxTree::new(20, 4);
        for i in 0..20 {
            check(&engine_args(&run, i, vec![format!("https://127.0.0.1:{}", 40_000 + i)]));
            check(&input_args(&run, i, Some("/data".into())));
            check(&input_args(&run, i, None));
        }
        for node in tree.nodes() {
            let port = |c: &SwarmxChild| match *c {
                SwarmxChild::Engine(e) => 20_000 + e as usize,
                SwarmxChild::Swarmx { level, index } => 30_000 + 100 * level + index,
            };
            let children = node.children.iter().map(|c| format!("https://127.0.0.1:{}", port(c))).collect();
            check(&swarmx_args(&run, children));
        }
        let appliance = Appliance::new(job.into(), "j-1".into(), std::env::temp_dir().join("ws-local-test-logs")).unwrap();
        let mut m = appliance.memoryx_args("https://127.0.0.1:9".into(), "https://127.0.0.1:10".into());
        check(&m);
        m.checkpoint_dir = Some("/tmp/c".into());
        m.sample = 2;
        check(&m);
    }
}
