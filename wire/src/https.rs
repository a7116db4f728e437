//! The HTTP side of every role, over TLS with the job's identity.
//!
//! One port serves two audiences. Kubelet probes `/healthz` and Prometheus scrapes `/metrics` without a
//! client certificate (they hold none of the job's), so the TLS handshake lets a client without a certificate
//! in; a client presenting a certificate of another CA is refused by the handshake itself. Every other route
//! (MemoryX's `/status` and `/checkpoint`) answers only to a client that presented the job's certificate or the
//! operator's, and answers `401` to anyone else. Who may reach the port at all is the NetworkPolicy's business.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use tokio_rustls::server::TlsStream;

use crate::identity::Identity;
use crate::tls::Socket;
use errors::Result;

/// Who is at the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// Whether it presented a certificate of the job's CA (the job's or the operator's).
    pub authenticated: bool,
}

/// A TCP listener that hands axum only connections whose TLS handshake succeeded ([`crate::tls::accept`]).
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsStream<Socket>, SocketAddr)>,
}

/// Bytes an HTTP connection reads at once: its requests and answers are small.
const HTTP_READ_BUFFER: usize = 16 << 10;

impl TlsListener {
    /// Starts accepting on `listener` with `identity`'s server configuration (client certificates optional).
    pub fn new(listener: tokio::net::TcpListener, identity: &Identity) -> Result<TlsListener> {
        let local = listener.local_addr().map_err(|e| errors::Error::io("reading the bound address", e))?;
        let ready = crate::tls::accept(listener, crate::tls::buffered(identity.server_config(true)?, HTTP_READ_BUFFER));
        Ok(TlsListener { local, ready })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<Socket>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some((tls, addr)) => {
                let authenticated = tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                (tls, Peer { addr, authenticated })
            }
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
pub async fn serve(
    listener: tokio::net::TcpListener,
    identity: &Identity,
    open: Router,
    protected: Router,
) -> Result<()> {
    let listener = TlsListener::new(listener, identity)?;
    let app = if protected.has_routes() {
        open.merge(protected.route_layer(axum::middleware::from_fn(require_identity)))
    } else {
        open
    };
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .await
        .map_err(|e| errors::Error::io("serving HTTP", e))
}
