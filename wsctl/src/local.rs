//! The appliance on this machine: MemoryX, a SwarmX tree, one engine per CS-2 and its input workers, each its own process on
//! 127.0.0.1 with ephemeral ports — the same programs that run as pods, started as `wsctl node ROLE ARGS…` with
//! arguments rendered from the contract's types. `wsctl` supervises them: it learns their ports and progress
//! from their typed handshake lines, names a component that crashes or stops answering its health check (a
//! frozen process) and stops the rest. On Ctrl-C MemoryX checkpoints the step in flight before the rest stop,
//! so the same command resumes the run. Every child also exits when `wsctl` goes away (their standard input
//! closes), so no process is left behind.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use crate::affinity::{CpuList, Pinning};
use anyhow::{Context, Result, anyhow, bail};
use crds::contract::{CommonArgs, Handshake, MemoryxArgs, ProgressReport, Role, RoleArgs};
use plan::appliance::Plan;
use plan::wiring::{Args, Component, Site, Wiring};

/// Runs one role in this process: `wsctl node [--cpus LIST] ROLE ARGS…`, parsed by the role program's own
/// parser; on `cpus` only when given (pinned before the role starts a thread, so all of them run there).
pub fn node(role: &str, args: Vec<String>, cpus: Option<&CpuList>) -> Result<()> {
    if let Some(cpus) = cpus {
        let now = cpus.pin_this_thread().map_err(anyhow::Error::msg)?;
        eprintln!("wsctl node {role}: on CPUs {now}");
    }
    fn parse<A: RoleArgs>(args: Vec<String>) -> A {
        A::try_parse_from(std::iter::once(A::ROLE.binary().to_string()).chain(args)).unwrap_or_else(|e| e.exit())
    }
    match Role::from_name(role) {
        Some(Role::Memoryx) => match runtime::coordinator::program::main(parse(args)) {
            // Stopped on a signal with its state saved: the status a stopped role program ends with.
            Err(e @ errors::Error::Stopped { .. }) => {
                eprintln!("{e}");
                std::process::exit(crds::contract::exit::STOPPED_STATUS);
            }
            other => other?,
        },
        Some(Role::Swarmx) => runtime::swarmx::node::main(parse(args))?,
        Some(Role::Engine) => sim_wse::node::main(parse(args))?,
        Some(Role::Input) => runtime::input::node::main(parse(args))?,
        None => bail!("unknown role '{role}': use memoryx, swarmx, engine or input"),
    }
    Ok(())
}

/// This machine as the wiring's [`Site`]: every component a process on 127.0.0.1 with an ephemeral port,
/// reading the run's copy of the job and its ephemeral identity, reached at the address it announced when it
/// came up (components start callees first, so every address asked for is known).
struct LocalSite {
    /// What every process is told: the run's files, an ephemeral HTTP port, and exit when `wsctl` goes away.
    common: CommonArgs,
    /// The folder standing in for the data volume, when the job names one.
    data_root: Option<PathBuf>,
    /// The gRPC address of every component started so far.
    addresses: HashMap<Component, String>,
}

impl LocalSite {
    /// The site of the run whose job copy is at `job`, known on the wire as `job_id`, with the identity at
    /// `identity`.
    fn new(job: &Path, job_id: &str, identity: &Path, data_root: Option<PathBuf>) -> LocalSite {
        let common =
            CommonArgs { job_id: Some(job_id.to_string()), exit_with_stdin: true, ..CommonArgs::new(job, identity) };
        LocalSite { common, data_root, addresses: HashMap::new() }
    }
}

impl Site for LocalSite {
    fn common(&self) -> CommonArgs {
        self.common.clone()
    }

    fn listen(&self, _: Role) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn address(&self, to: Component) -> String {
        self.addresses.get(&to).cloned().unwrap_or_default()
    }

    fn data_root(&self) -> Option<PathBuf> {
        self.data_root.clone()
    }
}

/// What MemoryX's processes write where, in a local run: the same for every weight server, except that only
/// the coordinator reports progress, writes the summary and decodes samples.
#[derive(Clone, Debug, Default)]
pub struct MemoryxOutputs {
    /// Where the summary, metrics and samples go.
    pub out: Option<PathBuf>,
    /// Lines to decode from a trained language model.
    pub sample: usize,
    /// Where checkpoints go.
    pub checkpoint_dir: Option<PathBuf>,
    /// The weight servers' disk tiers.
    pub tier_dir: Option<PathBuf>,
}

impl MemoryxOutputs {
    /// `args` (weight server `args.server_index`'s) with these outputs.
    fn apply(&self, args: MemoryxArgs) -> MemoryxArgs {
        let coordinator = args.server_index == 0;
        MemoryxArgs {
            progress: coordinator,
            out: if coordinator { self.out.clone() } else { None },
            sample: if coordinator { self.sample } else { 0 },
            checkpoint_dir: self.checkpoint_dir.clone(),
            tier_dir: self.tier_dir.clone(),
            ..args
        }
    }
}

/// Every component's arguments for a local run of `plan` at `site`, given the weight servers' addresses (known
/// only once they run): what [`Appliance::start`] starts, and what the tests compare with the operator's pods.
fn local_args(
    wiring: &Wiring,
    site: &LocalSite,
    component: Component,
    outputs: &MemoryxOutputs,
    servers: &[String],
) -> Args {
    let weight_servers = if component == Component::WeightServer(0) { servers.to_vec() } else { Vec::new() };
    match wiring.args(site, component, weight_servers) {
        Args::Memoryx(m) => Args::Memoryx(outputs.apply(m)),
        other => other,
    }
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

/// How the supervisor tells a frozen child (SIGSTOP, a hung host) from a busy one: its `/healthz`, asked every
/// [`Watchdog::PERIOD`]; [`Watchdog::MISSES`] unanswered in a row within [`Watchdog::TIMEOUT`] each name it —
/// the local counterpart of the liveness probe the operator gives every pod.
struct Watchdog {
    /// Each started child's name and health address.
    watched: Arc<Mutex<Vec<(String, SocketAddr)>>>,
    /// The first child found frozen, and for how long it had not answered.
    frozen: Arc<Mutex<Option<(String, Duration)>>>,
}

impl Watchdog {
    const PERIOD: Duration = Duration::from_secs(2);
    const TIMEOUT: Duration = Duration::from_secs(3);
    const MISSES: u32 = 3;

    /// Starts asking, on a thread of its own that ends with the process.
    fn start() -> Result<Watchdog> {
        let watched: Arc<Mutex<Vec<(String, SocketAddr)>>> = Arc::default();
        let frozen: Arc<Mutex<Option<(String, Duration)>>> = Arc::default();
        // Health only: `/healthz` asks for no client certificate, and the answer carries nothing to trust.
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .danger_accept_invalid_certs(true)
            .timeout(Self::TIMEOUT)
            .build()
            .context("cannot build the health-check client")?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (list, found) = (watched.clone(), frozen.clone());
        std::thread::spawn(move || {
            let mut missed: HashMap<String, (u32, Instant)> = HashMap::new();
            loop {
                std::thread::sleep(Self::PERIOD);
                let now: Vec<(String, SocketAddr)> = list.lock().map(|l| l.clone()).unwrap_or_default();
                let answers = runtime.block_on(futures::future::join_all(now.iter().map(|(name, addr)| {
                    let client = &client;
                    async move {
                        let answer = client.get(format!("https://{addr}/healthz")).send().await;
                        (name.clone(), answer.is_ok_and(|r| r.status().is_success()))
                    }
                })));
                for (name, ok) in answers {
                    if ok {
                        missed.remove(&name);
                        continue;
                    }
                    let (n, since) = missed.entry(name.clone()).or_insert((0, Instant::now()));
                    *n += 1;
                    if *n >= Self::MISSES
                        && let Ok(mut f) = found.lock()
                    {
                        f.get_or_insert((name, since.elapsed() + Self::TIMEOUT));
                    }
                }
            }
        });
        Ok(Watchdog { watched, frozen })
    }

    /// Watches `name`'s health at `http`.
    fn watch(&self, name: &str, http: SocketAddr) {
        if let Ok(mut l) = self.watched.lock() {
            l.push((name.to_string(), http));
        }
    }

    /// The child found frozen, if one was.
    fn frozen(&self) -> Option<(String, Duration)> {
        self.frozen.lock().ok().and_then(|f| f.clone())
    }
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
    /// Ctrl-C presses (SIGINT or SIGTERM to `wsctl`): the first stops MemoryX gracefully, a second at once.
    interrupted: Arc<AtomicUsize>,
    watchdog: Watchdog,
    /// Each started component's address (`host:port`) and name, so a failure that names an address says which
    /// component it is.
    addresses: Vec<(String, String)>,
    /// The engines' CPUs and every other role's (`wsctl run --engine-cpus`); `None` leaves them all to the kernel.
    pub pinning: Option<Pinning>,
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
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("wsctl-identity-{}-{nanos}", std::process::id()));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    wire::identity::issue(job_id, &[])?.write_roles_files(&dir)?;
    Ok(dir)
}

/// `text` with every component address it mentions (`https://host:port` or `host:port`) given the component's
/// name, and the names it mentioned: a failure reported by MemoryX says which component did not answer.
fn name_components(text: &str, addresses: &[(String, String)]) -> (String, Vec<String>) {
    let mut out = text.to_string();
    let mut named = Vec::new();
    for (addr, name) in addresses {
        // `host:port` whole: not the start of a longer port.
        let mut found = false;
        let mut rest = out.as_str();
        let mut rewritten = String::new();
        while let Some(at) = rest.find(addr.as_str()) {
            let end = at + addr.len();
            let whole = !rest[end..].starts_with(|c: char| c.is_ascii_digit());
            let start = if whole && rest[..at].ends_with("https://") { at - "https://".len() } else { at };
            rewritten.push_str(&rest[..start]);
            if whole {
                rewritten.push_str(&format!("{name} at {addr}"));
                found = true;
            } else {
                rewritten.push_str(&rest[start..end]);
            }
            rest = &rest[end..];
        }
        rewritten.push_str(rest);
        if found {
            out = rewritten;
            named.push(name.clone());
        }
    }
    (out, named)
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
        let interrupted = Arc::new(AtomicUsize::new(0));
        let flag = interrupted.clone();
        // A second handler cannot be installed in one process; the first one (from an earlier run) still works.
        let _ = ctrlc::set_handler(move || {
            flag.fetch_add(1, Ordering::SeqCst);
        });
        let (tx, lines) = mpsc::channel();
        let identity = ephemeral_identity(&job_id)?;
        let watchdog = Watchdog::start()?;
        Ok(Appliance {
            procs: Vec::new(),
            lines,
            tx,
            logs,
            job,
            job_id,
            identity,
            interrupted,
            watchdog,
            addresses: Vec::new(),
            pinning: None,
        })
    }

    /// Starts `wsctl node ROLE ARGS…` as `name`.
    fn spawn(&mut self, name: &str, args: &Args) -> Result<usize> {
        let exe = std::env::current_exe().context("cannot find the wsctl executable")?;
        let log = self.logs.join(format!("{name}.log"));
        let err = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(exe);
        // In a process group of its own, so a terminal's Ctrl-C reaches `wsctl` alone, which stops MemoryX
        // first (it checkpoints) and the rest after.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.arg("node");
        if let Some(p) = &self.pinning {
            let cpus = if args.role() == Role::Engine { &p.engines } else { &p.others };
            command.arg("--cpus").arg(cpus.to_string());
        }
        let mut child = command
            .arg(args.role().as_str())
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
        let line = format!("{name}\t{}\n", child.id());
        self.procs.push(Proc { name: name.to_string(), child, log });
        // Which process is which, for whoever looks into a run (and the fault tests).
        let table = self.logs.join("processes");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&table)
            .with_context(|| format!("cannot write {}", table.display()))?;
        std::io::Write::write_all(&mut f, line.as_bytes())
            .with_context(|| format!("cannot write {}", table.display()))?;
        Ok(id)
    }

    /// Fails with the name of the first child that has exited, unless it is `allowed` and exited cleanly.
    fn check(&mut self, allowed: Option<usize>) -> Result<Option<usize>> {
        if self.interrupted.load(Ordering::SeqCst) > 0 {
            bail!("interrupted; stopped MemoryX, SwarmX and the engines");
        }
        if let Some((name, silent)) = self.watchdog.frozen() {
            let log = self.logs.join(format!("{name}.log"));
            bail!(
                "{name} stopped answering its health check for {:.0}s ({} checks in a row): it is frozen or its host \
                 hung (log: {}); stopped the other components",
                silent.as_secs_f64(),
                Watchdog::MISSES,
                log.display()
            );
        }
        for (i, p) in self.procs.iter_mut().enumerate() {
            if let Some(status) = p.child.try_wait().with_context(|| format!("cannot check {}", p.name))? {
                if Some(i) == allowed && status.success() {
                    return Ok(Some(i));
                }
                let (line, blamed) = name_components(&last_line(&p.log), &self.addresses);
                let logs: String = blamed
                    .iter()
                    .map(|n| format!("; {n}'s log: {}", self.logs.join(format!("{n}.log")).display()))
                    .collect();
                return Err(anyhow!(
                    "{} exited ({status}): {line} (log: {}{logs}); stopped the other components",
                    p.name,
                    p.log.display()
                ));
            }
        }
        Ok(None)
    }

    /// Starts a role and waits for its [`Handshake::Ready`]; returns the URL of its gRPC service.
    fn start_one(&mut self, name: &str, args: &Args) -> Result<String> {
        let id = self.spawn(name, args)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check(None)?;
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(Line { child, text }) if child == id => {
                    if let Some(Handshake::Ready { grpc: Some(addr), http, .. }) = Handshake::from_line(&text) {
                        self.watchdog.watch(name, http);
                        return Ok(format!("https://{addr}"));
                    }
                }
                Ok(_) => {}
                Err(_) if Instant::now() > deadline => bail!("{name} did not start within a minute"),
                Err(_) => {}
            }
        }
    }

    /// Starts every component of `plan` but the coordinator, callees first (input workers, engines, the SwarmX
    /// tree from the leaves up, weight servers `1..`), reading the data volume from `data_root`; returns the
    /// coordinator's arguments, for [`Appliance::run_memoryx`].
    pub fn start(&mut self, plan: &Plan, data_root: Option<PathBuf>, outputs: &MemoryxOutputs) -> Result<MemoryxArgs> {
        let wiring = Wiring::of(plan);
        let mut site = LocalSite::new(&self.job, &self.job_id, &self.identity, data_root);
        let mut servers = Vec::new();
        for component in wiring.components() {
            match local_args(&wiring, &site, component, outputs, &servers) {
                Args::Memoryx(coordinator) if component == Component::WeightServer(0) => return Ok(coordinator),
                args => {
                    let url = self.start_one(&component.name(), &args)?;
                    self.addresses.push((url.trim_start_matches("https://").to_string(), component.name()));
                    if let Component::WeightServer(_) = component {
                        servers.push(url.clone());
                    }
                    site.addresses.insert(component, url);
                }
            }
        }
        bail!("the plan has no coordinator")
    }

    /// Starts MemoryX and follows its progress until it finishes, calling `on_progress` with each step's report.
    /// Interrupted, it gives MemoryX up to `stop` to checkpoint the step in flight ([`Appliance::stop_memoryx`]).
    pub fn run_memoryx(
        &mut self,
        args: &MemoryxArgs,
        stop: Duration,
        mut on_progress: impl FnMut(&ProgressReport),
    ) -> Result<()> {
        let id = self.spawn(Role::Memoryx.as_str(), &Args::Memoryx(args.clone()))?;
        loop {
            if let Ok(Line { child, text }) = self.lines.recv_timeout(Duration::from_millis(100)) {
                match (child == id, Handshake::from_line(&text)) {
                    (true, Some(Handshake::Progress(p))) => on_progress(&p),
                    (true, Some(Handshake::Ready { http, .. })) => self.watchdog.watch(Role::Memoryx.as_str(), http),
                    _ => {}
                }
            }
            if self.interrupted.load(Ordering::SeqCst) > 0 {
                return Err(self.stop_memoryx(id, stop));
            }
            if self.check(Some(id))?.is_some() {
                return Ok(());
            }
        }
    }

    /// Stops MemoryX as a pod is stopped, with SIGTERM: it finishes the step in flight, checkpoints it and exits,
    /// within `patience` (a second Ctrl-C cuts it short); the error says where the run resumes from.
    fn stop_memoryx(&mut self, id: usize, patience: Duration) -> anyhow::Error {
        let pid = self.procs[id].child.id();
        // SAFETY: kill(2) with a child's pid and a valid signal has no memory effects.
        #[cfg(unix)]
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        eprintln!("interrupted: MemoryX is checkpointing the step in flight (Ctrl-C again to stop at once)");
        let deadline = Instant::now() + patience;
        let mut stopped = None;
        let exited = loop {
            if let Ok(Line { child, text }) = self.lines.recv_timeout(Duration::from_millis(100))
                && let (true, Some(Handshake::Stopped { step, checkpoint })) =
                    (child == id, Handshake::from_line(&text))
            {
                stopped = Some((step, checkpoint));
            }
            if matches!(self.procs[id].child.try_wait(), Ok(Some(_))) {
                break true;
            }
            if Instant::now() >= deadline || self.interrupted.load(Ordering::SeqCst) > 1 {
                break false;
            }
        };
        match stopped {
            Some((step, Some(checkpoint))) => anyhow!(
                "interrupted after step {step}; MemoryX saved it in {checkpoint}: run the same command again to resume from it"
            ),
            Some((step, None)) => anyhow!(
                "interrupted after step {step}; nothing was saved (the run has no checkpoint folder: give --checkpoint-dir \
                 or spec.checkpoint.intervalSteps to make a run resumable)"
            ),
            None if exited => {
                anyhow!("interrupted; MemoryX exited without saving (log: {})", self.procs[id].log.display())
            }
            None => anyhow!(
                "interrupted; MemoryX did not checkpoint within {:.0}s and was stopped: the run resumes from its last checkpoint",
                patience.as_secs_f64()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure naming an address names the component at it, and only a whole address does.
    #[test]
    fn a_failure_names_the_component_at_the_address_it_mentions() {
        let addresses = vec![
            ("127.0.0.1:4567".to_string(), "engine-0".to_string()),
            ("127.0.0.1:45".to_string(), "swarmx-0-0".to_string()),
        ];
        let (line, named) = name_components("error: unavailable: https://127.0.0.1:4567: transport error", &addresses);
        assert_eq!(line, "error: unavailable: engine-0 at 127.0.0.1:4567: transport error");
        assert_eq!(named, vec!["engine-0".to_string()]);
        let (line, named) = name_components("nothing to see", &addresses);
        assert_eq!((line.as_str(), named.len()), ("nothing to see", 0));
    }

    /// Every command line the local runner renders parses back, through the role program's own parser, into
    /// the arguments it was rendered from.
    #[test]
    fn every_argv_the_local_runner_builds_parses_with_the_programs_parsers() {
        fn check<A: RoleArgs + PartialEq + std::fmt::Debug>(args: &A) {
            let argv = std::iter::once(A::ROLE.binary().to_string()).chain(args.argv());
            assert_eq!(&A::try_parse_from(argv).expect("parses"), args);
        }
        let mut job = crds::testing::mlp_job("j", "ml", 16);
        job.spec.memoryx.servers = Some(2);
        let plan = Plan::new(&job.spec, 1 << 40, 4).expect("a plan");
        let wiring = Wiring::of(&plan);
        for root in [Some(PathBuf::from("/data")), None] {
            let mut site = LocalSite::new(Path::new("/tmp/run/job.yaml"), "j-1", Path::new("/tmp/run/identity"), root);
            let outputs = MemoryxOutputs { checkpoint_dir: Some("/tmp/c".into()), sample: 2, ..Default::default() };
            for (port, component) in (40_000..).zip(wiring.components()) {
                match local_args(&wiring, &site, component, &outputs, &["https://127.0.0.1:9".into()]) {
                    Args::Input(a) => check(&a),
                    Args::Engine(a) => check(&a),
                    Args::Swarmx(a) => check(&a),
                    Args::Memoryx(a) => check(&a),
                }
                site.addresses.insert(component, format!("https://127.0.0.1:{port}"));
            }
        }
    }

    /// The operator's pods and the local runner's processes for the same job carry the same arguments for
    /// every role: the same components, each dialling the same components (addresses mapped back to what they
    /// name), with the same role flags. Only what a site decides may differ: where the job and identity files
    /// are, the ports, the log format, checkpoint and output folders, and that the cluster's weight servers share
    /// one pod template (so each is told the others' addresses and learns its index from its pod).
    #[test]
    fn the_operator_and_the_local_runner_wire_every_role_alike() {
        use k8s_openapi::api::core::v1::Container;
        use kube::ResourceExt;
        use operator::children::desired::desired;
        use operator::children::settings::{OperatorPeer, Settings};
        use operator::children::site::ClusterSite;

        fn parse<A: RoleArgs>(c: &Container) -> A {
            let argv = c.command.iter().flatten().take(1).cloned().chain(c.args.clone().unwrap_or_default());
            A::try_parse_from(argv).expect("the operator's argv parses")
        }
        for (cs2, workers, servers, volume) in [(1, 1, 1, false), (4, 2, 3, true), (16, 1, 2, false)] {
            let mut job = crds::testing::mlp_job("j", "ml", cs2);
            job.metadata.uid = Some("u-1".into());
            job.spec.data.workers = workers;
            job.spec.memoryx.servers = Some(servers);
            if volume {
                job.spec.data.volume = Some("claim".into());
            }
            let settings = Settings {
                default_image: "i".into(),
                fan_out: 2,
                request_cs2: false,
                operator: OperatorPeer::default(),
            };
            let d = desired(&job, &settings, cs2).expect("the operator's objects");
            let plan = Plan::for_spec(&job.spec, 2).expect("a plan");
            let wiring = Wiring::of(&plan);
            // Every component the local runner starts, at made-up loopback addresses, and the same in the cluster.
            let cluster = ClusterSite::of(&job);
            let mut local = LocalSite::new(
                Path::new("/run/job.yaml"),
                "j-1",
                Path::new("/run/identity"),
                volume.then(|| "/data".into()),
            );
            let mut named: HashMap<String, Component> = HashMap::new();
            for (port, c) in (40_000..).zip(wiring.components()) {
                let url = format!("https://127.0.0.1:{port}");
                local.addresses.insert(c, url.clone());
                named.insert(url, c);
                named.insert(cluster.address(c), c);
            }
            let to = |urls: &[String]| -> Vec<Component> { urls.iter().map(|u| named[u]).collect() };
            let outputs = MemoryxOutputs::default();
            let servers_urls: Vec<String> = (1..servers).map(|i| local.address(Component::WeightServer(i))).collect();
            // The cluster's pods by component: the pods' names are the components' names after the job's.
            let mut pods: HashMap<Component, Args> = HashMap::new();
            for pod in &d.pods {
                let c = wiring
                    .components()
                    .into_iter()
                    .find(|c| pod.name_any() == format!("j-{}", c.name()))
                    .expect("a pod per component");
                let container = &pod.spec.as_ref().expect("a pod spec").containers[0];
                let args = match c.role() {
                    Role::Input => Args::Input(parse(container)),
                    Role::Engine => Args::Engine(parse(container)),
                    Role::Swarmx => Args::Swarmx(parse(container)),
                    Role::Memoryx => unreachable!("MemoryX is a StatefulSet"),
                };
                pods.insert(c, args);
            }
            let template =
                &d.memoryx.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod template").containers[0];
            let memoryx: MemoryxArgs = parse(template);
            assert_eq!(
                pods.len() + 1,
                wiring.components().len() - (servers as usize - 1),
                "one pod per component, MemoryX aside"
            );
            for c in wiring.components() {
                match (c, local_args(&wiring, &local, c, &outputs, &servers_urls)) {
                    (Component::Input(_), Args::Input(l)) => {
                        let Some(Args::Input(k)) = pods.get(&c) else { panic!("{c:?} has no pod") };
                        assert_eq!((l.index, l.data_root.is_some()), (k.index, k.data_root.is_some()), "{c:?}");
                    }
                    (Component::Engine(_), Args::Engine(l)) => {
                        let Some(Args::Engine(k)) = pods.get(&c) else { panic!("{c:?} has no pod") };
                        assert_eq!((l.index, to(&l.inputs)), (k.index, to(&k.inputs)), "{c:?}");
                    }
                    (Component::Swarmx { .. }, Args::Swarmx(l)) => {
                        let Some(Args::Swarmx(k)) = pods.get(&c) else { panic!("{c:?} has no pod") };
                        assert_eq!((to(&l.children), l.connect_timeout), (to(&k.children), k.connect_timeout), "{c:?}");
                    }
                    (Component::WeightServer(i), Args::Memoryx(l)) => {
                        let k = &memoryx;
                        assert_eq!(
                            (
                                named[&l.stage],
                                named[&l.input],
                                l.connect_timeout,
                                l.retry_seconds,
                                l.hold_seconds,
                                l.crash_after_steps
                            ),
                            (
                                named[&k.stage],
                                named[&k.input],
                                k.connect_timeout,
                                k.retry_seconds,
                                k.hold_seconds,
                                k.crash_after_steps
                            ),
                            "{c:?}"
                        );
                        assert_eq!(l.server_index, i);
                        if i == 0 {
                            assert_eq!(
                                to(&l.weight_servers),
                                to(&k.weight_servers),
                                "the coordinator reaches every other weight server"
                            );
                        }
                    }
                    (c, args) => panic!("{c:?} rendered as {:?}", args.role()),
                }
            }
        }
    }
}
