//! Both halves of gRPC between the roles: dialling (mutual TLS with the job's identity, deadlines, keepalives)
//! and serving (the same TLS, keepalives, windows and frames sized for layers), and the one check every
//! service makes that a request is of its own job.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::identity::{Identity, SERVER_NAME};
use crate::tls::HANDSHAKE_TIMEOUT;
use errors::{Error, Result};

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

/// How a role dials its stages: over mutual TLS with the job's identity, waiting up to `connect` for a stage
/// to come up, and giving each call at most `call`. Keepalives find a peer that stops answering altogether
/// (a frozen process, a silent partition) within [`KEEPALIVE_TIMEOUT`]; the call deadline is
/// the backstop for a peer whose transport still answers pings while its calls never finish.
#[derive(Clone, Copy, Debug)]
pub struct Dial<'a> {
    /// The job's identity.
    pub identity: &'a Identity,
    /// How long a stage may take to come up.
    pub connect: Duration,
    /// How long one call may take, its streams included.
    pub call: Duration,
}

impl<'a> Dial<'a> {
    /// Dials with `identity`, waiting up to `connect` for a stage, and [`DEFAULT_CALL_TIMEOUT`] per call.
    pub fn new(identity: &'a Identity, connect: Duration) -> Dial<'a> {
        Dial { identity, connect, call: DEFAULT_CALL_TIMEOUT }
    }

    /// The same, with `call` per call.
    pub fn with_call_timeout(self, call: Duration) -> Dial<'a> {
        Dial { call, ..self }
    }
}

/// The per-call deadline when neither the plan nor the command line gives one.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A lazily connecting channel to the role at `url`, over mutual TLS with `dial`'s identity and deadlines: what
/// every client of a role (a stage, an input worker) is built on. Only `https://` addresses are dialled.
pub fn channel(url: &str, dial: Dial<'_>) -> Result<Channel> {
    let Some(address) = url.strip_prefix("https://") else {
        return Err(Error::Protocol(format!("stage address '{url}' is not https://: stages speak only mutual TLS")));
    };
    let tls = Arc::new(dial.identity.grpc_client_config()?);
    // The TLS is ours (`tls::connect`: records sealed and opened in the connection's buffers), so tonic is given
    // the plain address and a connector that hands it the connection already encrypted.
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| Error::Protocol(format!("bad stage address '{url}': {e}")))?
        // Covers the TCP connect and the TLS handshake together: a frozen peer's kernel still accepts the
        // connection, and only the handshake would hang.
        .connect_timeout(HANDSHAKE_TIMEOUT)
        .timeout(dial.call)
        // A peer that stops answering (a frozen process, a silent partition) is found by its unanswered pings
        // and its calls fail as unavailable, so the step is rerun instead of waiting for ever.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(4 * WINDOW)
        .max_frame_size(FRAME);
    let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let tls = tls.clone();
        async move {
            let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(443);
            let stream = crate::tls::connect(&host, port, tls, SERVER_NAME).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// The job a service belongs to: every request names its job, and one of another job is refused before it is
/// looked at, so a misrouted or replayed call from a sibling job cannot touch this one.
#[derive(Clone, Debug)]
pub struct JobGuard {
    job: String,
    what: &'static str,
}

impl JobGuard {
    /// The guard of `what` (as a refusal names it: "an engine", "a weight server") serving job `job`.
    pub fn new(job: impl Into<String>, what: &'static str) -> JobGuard {
        JobGuard { job: job.into(), what }
    }

    /// The job served.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Refuses a request for job `job` unless it is this service's.
    pub fn check(&self, job: &str) -> Result<(), Status> {
        if job != self.job {
            return Err(Status::failed_precondition(format!(
                "request for job '{job}' reached {} of job '{}'",
                self.what, self.job
            )));
        }
        Ok(())
    }
}

/// Serves one gRPC service, its message limits already set, on `listener` until the process ends, over mutual
/// TLS: only a client presenting a certificate of the job's CA completes the handshake.
pub async fn serve<S>(svc: S, listener: tokio::net::TcpListener, identity: &Identity) -> Result<()>
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
    serve_routes(tonic::service::Routes::new(svc), listener, identity).await
}

/// [`serve`] for several services on one listener (one process answering two protocols): the one
/// place every role's services meet `grpc_server`.
pub async fn serve_routes(
    routes: tonic::service::Routes,
    listener: tokio::net::TcpListener,
    identity: &Identity,
) -> Result<()> {
    let config = Arc::new(identity.grpc_server_config()?);
    let accepted = crate::tls::accept(listener, move |tcp| crate::tls::record::accept(tcp, config.clone()));
    let incoming = tokio_stream::wrappers::ReceiverStream::new(accepted).map(|(tls, _)| Ok::<_, std::io::Error>(tls));
    grpc_server()
        .add_routes(routes)
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Unavailable(format!("gRPC server stopped: {e}")))
}

/// Every role's gRPC server over the connections [`serve`] accepts (mutual TLS with the job's identity, Nagle's
/// delay off: `tls::Socket`): keepalives that find a frozen peer, and windows and frames sized for layers.
fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(4 * WINDOW)
        .max_frame_size(FRAME)
}
