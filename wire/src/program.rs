//! One role program's life, written once for the four programs (MemoryX, SwarmX, the engine, input workers):
//! start (logging, signals, the watchdog on standard input), load the job and its identity, derive the plan's
//! limits, bind and announce the listeners, serve HTTP (health, metrics and the job's protected routes) and a
//! gRPC service. A program says only what is its own: which service, which routes, which metrics.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::routing::get;
use crds::contract::exit::{REFUSED_STATUS, STOPPED_STATUS};
use crds::contract::{CommonArgs, Handshake, Role};
use plan::limits::Limits;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::grpc::Dial;
use crate::identity::Identity;
use errors::{Error, Result};

/// A started role program: its job, identity, limits and async runtime.
pub struct Program {
    /// The role this program plays.
    pub role: Role,
    /// The arguments every role takes.
    pub common: CommonArgs,
    /// The job manifest it loaded.
    pub job: crds::TrainingJob,
    /// The job's wire identity: the name every request must carry.
    pub job_id: String,
    /// The job's TLS identity, served and presented on every connection.
    pub identity: Identity,
    /// What the plan lets any message make this program allocate.
    pub limits: Limits,
    /// The async runtime its services and clients run on.
    pub runtime: tokio::runtime::Runtime,
}

impl Program {
    /// Starts `role`'s program with `common`: logging, termination on a signal, the standard-input watchdog,
    /// then the job, its identity, its limits and an async runtime.
    pub fn start(role: Role, common: &CommonArgs) -> Result<Program> {
        start(common);
        let (job, job_id) = load_job(common)?;
        let identity = load_identity(common)?;
        let limits = Limits::for_spec(&job.spec);
        let runtime = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
        Ok(Program { role, common: common.clone(), job, job_id, identity, limits, runtime })
    }

    /// Binds the gRPC listener at `grpc` and the HTTP one, then announces both with [`Handshake::Ready`] for a
    /// local supervisor; returns them in that order.
    pub fn listen(&self, grpc: SocketAddr) -> Result<(TcpListener, TcpListener)> {
        self.runtime.block_on(async {
            let grpc = bind(grpc, self.role, "grpc").await?;
            let http = bind(self.common.http, self.role, "http").await?;
            announce_ready(self.role, Some(&grpc), &http)?;
            Ok((grpc, http))
        })
    }

    /// Binds the HTTP listener alone and announces it: a program without a gRPC service of its own.
    pub fn listen_http(&self) -> Result<TcpListener> {
        self.runtime.block_on(async {
            let http = bind(self.common.http, self.role, "http").await?;
            announce_ready(self.role, None, &http)?;
            Ok(http)
        })
    }

    /// Serves HTTP on `http` in the background: `/healthz` and `/metrics` (from `registry`) to anyone,
    /// `protected` to the job's holders only.
    pub fn serve_http(
        &self,
        http: TcpListener,
        registry: Registry,
        protected: Router,
    ) -> tokio::task::JoinHandle<Result<()>> {
        let identity = self.identity.clone();
        self.runtime.spawn(async move { serve_http(http, Arc::new(Mutex::new(registry)), &identity, protected).await })
    }

    /// From now on a termination signal (SIGTERM: the pod evicted, the node drained; SIGINT) asks the program
    /// to stop at its next safe point rather than exiting at once: the returned flag is set, and the program
    /// (MemoryX's coordinator) finishes the step in flight, checkpoints and ends with [`Error::Stopped`]. A
    /// second signal exits at once, and the kubelet's grace period (sized from the plan) bounds the wait.
    pub fn stop_gracefully(&self) -> Arc<AtomicBool> {
        let t = termination();
        t.graceful.store(true, Ordering::SeqCst);
        t.requested.clone()
    }

    /// From now on a termination signal exits at once: there is nothing left to save (the job is over and
    /// MemoryX only serves its status). A signal that came meanwhile exits now.
    pub fn stop_at_once(&self) {
        let t = termination();
        t.graceful.store(false, Ordering::SeqCst);
        if t.requested.load(Ordering::SeqCst) {
            tracing::info!("stopping on the termination signal received earlier");
            std::process::exit(STOPPED_STATUS);
        }
    }

    /// How this program dials other roles: its identity, `connect_seconds` for a peer to come up, and the
    /// per-call deadline from the command line or else from the plan's limits.
    pub fn dial(&self, connect_seconds: u64) -> Dial<'_> {
        let call =
            self.common.call_timeout_seconds.map_or_else(|| self.limits.call_timeout(), std::time::Duration::from_secs);
        Dial::new(&self.identity, std::time::Duration::from_secs(connect_seconds)).with_call_timeout(call)
    }
}

/// Serves `/healthz` and `/metrics` (Prometheus text from `registry`) to anyone who reaches the port, and
/// `protected` (MemoryX's `/status` and `/checkpoint`) only to holders of the job's certificate, over TLS with
/// the job's `identity`, on `listener` until the process ends (see [`crate::https`]).
async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: Arc<Mutex<Registry>>,
    identity: &Identity,
    protected: Router,
) -> Result<()> {
    let metrics = move || {
        let registry = registry.clone();
        async move {
            let mut text = String::new();
            if let Ok(r) = registry.lock() {
                // Encoding into a String cannot fail for well-formed metrics.
                let _ = encode(&mut text, &r);
            }
            ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        }
    };
    let open = Router::new().route("/healthz", get(|| async { "ok" })).route("/metrics", get(metrics));
    crate::https::serve(listener, identity, open, protected).await
}

/// What a termination signal does to this program: exit at once, or (while [`Program::stop_gracefully`] holds)
/// ask it to stop at its next safe point.
struct Termination {
    /// Whether a signal only asks the program to stop.
    graceful: AtomicBool,
    /// Set by the first signal while graceful.
    requested: Arc<AtomicBool>,
}

/// The process's one [`Termination`]: signals are the process's, not a program object's.
fn termination() -> &'static Termination {
    static TERMINATION: OnceLock<Termination> = OnceLock::new();
    TERMINATION.get_or_init(|| Termination { graceful: AtomicBool::new(false), requested: Arc::default() })
}

/// Logs through tracing-subscriber: human-readable by default (coloured on a terminal), one JSON object per line
/// with `json`.
fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a pod's log and a local run's log file are read as text (wsctl logs, the
    // dashboard, post-mortem bundles), where escape codes are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// Reads the job manifest named by a role's arguments, and its wire identity (the job's name unless given).
fn load_job(args: &CommonArgs) -> Result<(crds::TrainingJob, String)> {
    let text =
        std::fs::read_to_string(&args.job).map_err(|e| Error::io(format!("reading {}", args.job.display()), e))?;
    let job = crds::parse_training_job(&text)?;
    let id = args.job_id.clone().unwrap_or_else(|| job.metadata.name.clone().unwrap_or_else(|| "job".into()));
    Ok((job, id))
}

/// Reads the job's TLS identity named by a role's arguments: without it a role can neither serve nor call.
fn load_identity(args: &CommonArgs) -> Result<Identity> {
    Identity::load(&args.identity)
}

/// Starts logging and, when asked, the standard-input watchdog: what every role program does first.
fn start(args: &CommonArgs) {
    init_logging(args.json_logs);
    // As a container's first process, a program ignores SIGTERM unless it handles it, and Kubernetes would
    // wait out the grace period while it kept working. Stop at once instead (checkpoints are written
    // atomically, so nothing is left half-written, and an interrupted step is rerun on restart), unless the
    // program has work to save first: then the first signal asks it to stop at its next safe point.
    let _ = ctrlc::set_handler(|| {
        let t = termination();
        if t.graceful.load(Ordering::SeqCst) && !t.requested.swap(true, Ordering::SeqCst) {
            tracing::info!(
                "asked to stop: finishing the step in flight and checkpointing (a second signal stops at once)"
            );
            return;
        }
        tracing::info!("stopping on a termination signal");
        std::process::exit(STOPPED_STATUS);
    });
    if args.exit_with_stdin {
        std::thread::spawn(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            std::process::exit(0);
        });
    }
}

/// A role program's exit: success, or the error on standard error and a failure status. Every program (and
/// `wsctl node`) ends through here, so they report alike.
pub fn exit(result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e @ Error::Stopped { .. }) => {
            eprintln!("{e}");
            std::process::ExitCode::from(STOPPED_STATUS as u8)
        }
        Err(e) if e.is_refusal() => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(REFUSED_STATUS as u8)
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Binds `addr` for `role`'s `what` endpoint. The caller announces the bound addresses with
/// [`Handshake::Ready`] once all its listeners are up.
async fn bind(addr: SocketAddr, role: Role, what: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::io(format!("{role}: binding {what} on {addr}"), e))
}

/// Announces that `role` serves `grpc` (if it has a service) and `http`, for a local supervisor.
fn announce_ready(role: Role, grpc: Option<&tokio::net::TcpListener>, http: &tokio::net::TcpListener) -> Result<()> {
    let addr = |l: &tokio::net::TcpListener| l.local_addr().map_err(|e| Error::io("reading the bound address", e));
    let grpc = grpc.map(addr).transpose()?;
    Handshake::Ready { role, grpc, http: addr(http)? }.announce();
    Ok(())
}
