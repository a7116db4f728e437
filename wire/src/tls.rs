//! The TLS connections under both of a role's servers (gRPC and HTTP) and under its gRPC clients, on rustls with
//! the job's identity.
//!
//! Handshakes are accepted on their own tasks, each bounded by [`HANDSHAKE_TIMEOUT`], so a slow or silent client
//! never holds up the next one. A gRPC connection carries layers, and seals and opens its own records
//! ([`record`]); an HTTP connection carries small messages and is rustls' buffered connection over a [`Socket`].

pub mod record;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake: a client that opens a connection and says nothing
/// holds a task for no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; more wait in the kernel's backlog.
const HANDSHAKES: usize = 64;

/// A TCP connection as rustls' buffered connection runs over it (HTTP), its reads buffered: rustls alone reads a
/// socket a few kilobytes at a time.
#[derive(Debug)]
pub struct Socket(BufReader<TcpStream>);

impl Socket {
    /// `tcp`, reads buffered by `buffer` bytes (at least 1), with Nagle's delay off: every write is a whole
    /// frame that should leave at once.
    pub fn new(tcp: TcpStream, buffer: usize) -> Socket {
        let _ = tcp.set_nodelay(true);
        Socket(BufReader::with_capacity(buffer.max(1), tcp))
    }
}

impl AsyncRead for Socket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Socket {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().peer_addr().ok()
    }
}

/// The server half of a buffered rustls connection with `config`, each read through `buffer` bytes: for
/// [`accept`].
pub fn buffered(
    config: rustls::ServerConfig,
    buffer: usize,
) -> impl Fn(TcpStream) -> Pin<Box<dyn Future<Output = std::io::Result<TlsStream<Socket>>> + Send>> + Send + 'static {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    move |tcp| {
        let accepting = acceptor.accept(Socket::new(tcp, buffer));
        Box::pin(async move {
            let mut tls = accepting.await?;
            // Encrypt whatever is handed over at once instead of 64 KiB at a time.
            tls.get_mut().1.set_buffer_limit(None);
            Ok(tls)
        })
    }
}

/// Accepts TLS connections on `listener`, each made by `handshake` (bounded by [`HANDSHAKE_TIMEOUT`]), and
/// hands over those whose handshake succeeded, with the peer's address. Ends when the receiver is dropped.
pub fn accept<S, H, F>(listener: tokio::net::TcpListener, handshake: H) -> tokio::sync::mpsc::Receiver<(S, SocketAddr)>
where
    S: Send + 'static,
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = std::io::Result<S>> + Send + 'static,
{
    let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES);
    let permits = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else { return };
            let (tcp, addr) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (shaking, done) = (handshake(tcp), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, shaking).await {
                    Ok(Ok(tls)) => {
                        let _ = done.send((tls, addr)).await;
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
    ready
}

/// Dials `host:port` over TLS with `config` (which must allow extracting secrets: [`record`]), verifying the
/// server as `server_name`. The caller bounds the whole of it (connect and handshake) with its timeout.
pub async fn connect(
    host: &str,
    port: u16,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> std::io::Result<record::Stream> {
    let tcp = TcpStream::connect((host, port)).await?;
    record::connect(tcp, config, server_name).await
}
