//! The HTTP side of every role, over TLS with the job's identity.
//!
//! One port serves two audiences. Kubelet probes `/healthz` and Prometheus scrapes `/metrics` without a
//! client certificate (they hold none of the job's), so the TLS handshake lets a client without a certificate
//! in; a client presenting a certificate of another CA is refused by the handshake itself. Every other route
//! (MemoryX's `/status` and `/checkpoint`) answers only to a client that presented the job's certificate or the
//! operator's, and answers `401` to anyone else. Who may reach the port at all is the NetworkPolicy's business.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use axum::Router;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::error::Result;
use crate::identity::Identity;

/// How long a client may take to finish its TLS handshake: a client that opens a connection and says nothing
/// holds a task for no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; more wait in the kernel's backlog.
const HANDSHAKES: usize = 64;

/// Who is at the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// Whether it presented a certificate of the job's CA (the job's or the operator's).
    pub authenticated: bool,
}

/// A TCP listener that hands axum only connections whose TLS handshake succeeded. Handshakes run on their own
/// tasks, each with [`HANDSHAKE_TIMEOUT`], so a slow or silent client never holds up the next one.
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
}

impl TlsListener {
    /// Starts accepting on `listener` with `identity`'s server configuration (client certificates optional).
    pub fn new(listener: tokio::net::TcpListener, identity: &Identity) -> Result<TlsListener> {
        let local = listener.local_addr().map_err(|e| crate::error::Error::io("reading the bound address", e))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(identity.server_config(true)?));
        let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES);
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else { return };
                let (tcp, addr) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("accepting an HTTP connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, done) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let authenticated = tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                            let _ = done.send((tls, Peer { addr, authenticated })).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake from {addr} refused: {e}"),
                        Err(_) => tracing::debug!("TLS handshake from {addr} timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor task ended with its listener: serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, authenticated: false })
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        *stream.remote_addr()
    }
}

/// Refuses a request whose connection presented no certificate of the job's CA.
async fn require_identity(ConnectInfo(peer): ConnectInfo<Peer>, request: Request, next: Next) -> Response {
    if peer.authenticated {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "this endpoint needs the job's client certificate\n").into_response()
    }
}

/// Serves `open` to anyone who completes the handshake and `protected` only to holders of the job's (or the
/// operator's) certificate, on `listener`, until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, identity: &Identity, open: Router, protected: Router) -> Result<()> {
    let listener = TlsListener::new(listener, identity)?;
    let app = if protected.has_routes() {
        open.merge(protected.route_layer(axum::middleware::from_fn(require_identity)))
    } else {
        open
    };
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .await
        .map_err(|e| crate::error::Error::io("serving HTTP", e))
}
