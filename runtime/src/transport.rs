//! What the gRPC roles share: turning errors into statuses and back, so a lost component stays distinguishable
//! from a bad message on every hop, and the small HTTP side of every server (health and Prometheus metrics).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tonic::Status;

use crds::contract::{CommonArgs, Handshake, Role};

use crate::error::Error;
use crate::identity::Identity;

/// The status↔error mapping lives in [`crate::protocol::status`]; re-exported here, where callers have always
/// found it.
pub use crate::protocol::status::{from_status, to_status};

/// Serves `/healthz` and `/metrics` (Prometheus text from `registry`) to anyone who reaches the port, and
/// `protected` (MemoryX's `/status` and `/checkpoint`) only to holders of the job's certificate, over TLS with
/// the job's `identity`, on `listener` until the process ends (see [`crate::https`]).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: Arc<Mutex<Registry>>,
    identity: &Identity,
    protected: Router,
) -> crate::Result<()> {
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

/// Logs through tracing-subscriber: human-readable by default, one JSON object per line with `json`.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// Reads the job manifest named by a role's arguments, and its wire identity (the job's name unless given).
pub fn load_job(args: &CommonArgs) -> crate::Result<(crds::TrainingJob, String)> {
    let text =
        std::fs::read_to_string(&args.job).map_err(|e| Error::io(format!("reading {}", args.job.display()), e))?;
    let job = crds::parse_training_job(&text)?;
    let id = args.job_id.clone().unwrap_or_else(|| job.metadata.name.clone().unwrap_or_else(|| "job".into()));
    Ok((job, id))
}

/// Reads the job's TLS identity named by a role's arguments: without it a role can neither serve nor call.
pub fn load_identity(args: &CommonArgs) -> crate::Result<Identity> {
    Identity::load(&args.identity)
}

/// How a role program dials its stages: the job's identity, `connect_seconds` for a stage to come up, and the
/// per-call deadline from the command line or else from the plan's `limits`.
pub fn dial<'a>(
    args: &CommonArgs,
    identity: &'a Identity,
    connect_seconds: u64,
    limits: &crate::plan::Limits,
) -> crate::swarmx::relay::Dial<'a> {
    let call = args.call_timeout_seconds.map_or_else(|| limits.call_timeout(), std::time::Duration::from_secs);
    crate::swarmx::relay::Dial::new(identity, std::time::Duration::from_secs(connect_seconds)).with_call_timeout(call)
}

/// Starts logging and, when asked, the standard-input watchdog: what every role program does first.
pub fn start(args: &CommonArgs) {
    init_logging(args.json_logs);
    // As a container's first process, a program ignores SIGTERM unless it handles it, and Kubernetes would
    // wait out the grace period while it kept working. Stop at once instead: MemoryX's checkpoints are
    // written atomically, so nothing is left half-written, and an interrupted step is rerun on restart.
    let _ = ctrlc::set_handler(|| {
        tracing::info!("stopping on a termination signal");
        std::process::exit(143);
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
pub fn exit(result: crate::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Binds `addr` for `role`'s `what` endpoint. The caller announces the bound addresses with
/// [`Handshake::Ready`] once all its listeners are up.
pub async fn bind(addr: SocketAddr, role: Role, what: &str) -> crate::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::io(format!("{role}: binding {what} on {addr}"), e))
}

/// Announces that `role` serves `grpc` (if it has a service) and `http`, for a local supervisor.
pub fn announce_ready(
    role: Role,
    grpc: Option<&tokio::net::TcpListener>,
    http: &tokio::net::TcpListener,
) -> crate::Result<()> {
    let addr = |l: &tokio::net::TcpListener| l.local_addr().map_err(|e| Error::io("reading the bound address", e));
    let grpc = grpc.map(addr).transpose()?;
    Handshake::Ready { role, grpc, http: addr(http)? }.announce();
    Ok(())
}

/// HTTP/2 flow-control window per stream: larger than any chunk, so a layer streams without waiting for
/// window updates on every 64 KiB.
pub const WINDOW: u32 = 8 << 20;

/// How often every gRPC connection pings its peer, idle or not.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a ping may go unanswered before the peer counts as lost: generous, so a busy machine is not taken
/// for a dead one, and short enough that a frozen engine costs a step, not the job.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// HTTP/2 frame size: large frames carry a layer in a few frames instead of one per 16 KiB.
pub const FRAME: u32 = (1 << 20) - 1;

/// Serves a `Stage` service on an already bound listener until the process ends, over mutual TLS: only a
/// client presenting a certificate of the job's CA completes the handshake.
pub async fn serve_stage<S: crate::protocol::pb::stage_server::Stage>(
    service: Arc<S>,
    listener: tokio::net::TcpListener,
    identity: &Identity,
) -> crate::Result<()> {
    let svc = crate::protocol::pb::stage_server::StageServer::from_arc(service)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20);
    serve(svc, listener, identity).await
}

/// Serves an input worker's `Input` service on an already bound listener until the process ends, over mutual
/// TLS like every stage. Its replies are bounded by `reply_bytes`, the plan's largest shard.
pub async fn serve_input(
    service: Arc<crate::input::server::InputServer>,
    listener: tokio::net::TcpListener,
    identity: &Identity,
    reply_bytes: usize,
) -> crate::Result<()> {
    let svc = crate::protocol::pb::input_server::InputServer::from_arc(service)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(reply_bytes);
    serve(svc, listener, identity).await
}

/// Serves a weight server's `Weights` service on an already bound listener until the process ends, over mutual
/// TLS like every stage; each message is a chunk of at most 1 MiB.
pub async fn serve_weights(
    service: Arc<crate::memoryx::service::WeightsService>,
    listener: tokio::net::TcpListener,
    identity: &Identity,
) -> crate::Result<()> {
    let svc = crate::protocol::pb::weights_server::WeightsServer::from_arc(service)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20);
    serve(svc, listener, identity).await
}

/// Serves one gRPC service, its message limits already set, on `listener` until the process ends: the one
/// place every role's service meets [`grpc_server`].
async fn serve<S>(svc: S, listener: tokio::net::TcpListener, identity: &Identity) -> crate::Result<()>
where
    S: tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    grpc_server(identity)?
        .add_service(svc)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await
        .map_err(|e| Error::Unavailable(format!("gRPC server stopped: {e}")))
}

/// Every role's gRPC server: mutual TLS with the job's identity, keepalives that find a frozen peer, and
/// windows and frames sized for layers.
fn grpc_server(identity: &Identity) -> crate::Result<tonic::transport::Server> {
    Ok(tonic::transport::Server::builder()
        .tls_config(identity.grpc_server())
        .map_err(|e| Error::Identity(format!("the gRPC server's TLS configuration: {e}")))?
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_nodelay(true)
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(4 * WINDOW)
        .max_frame_size(FRAME))
}

/// Receives an `Apply` stream: the step's summed gradients, whose first chunk names the job and the step. A
/// stream of another job is refused before anything is applied, and every chunk is metered against the plan's
/// `limits` before it is kept, so an `Apply` can never make a stage hold more than the model's gradients.
pub async fn receive_grads(
    mut stream: tonic::Streaming<crate::protocol::pb::GradChunk>,
    job: &str,
    limits: &crate::plan::Limits,
) -> Result<Vec<crate::protocol::pb::GradChunk>, Status> {
    let mut meter = crate::protocol::wire::GradMeter::new(limits);
    let mut chunks = Vec::new();
    while let Some(c) = stream.message().await? {
        if chunks.is_empty() && c.job != job {
            return Err(Status::failed_precondition(format!("gradients of job '{}' reached a stage of job '{job}'", c.job)));
        }
        meter.check(&c, limits).map_err(to_status)?;
        chunks.push(c);
    }
    Ok(chunks)
}
