//! The TLS connections under both of a role's servers (gRPC and HTTP) and under its gRPC clients, on rustls with
//! the job's identity.
//!
//! Handshakes are accepted on their own tasks, each bounded by [`HANDSHAKE_TIMEOUT`], so a slow or silent client
//! never holds up the next one. A gRPC connection reads its socket through a [`READ_BUFFER`]-byte buffer and
//! writes whole HTTP/2 frames as records at once: rustls alone reads a socket a few kilobytes at a time and
//! caps what it encrypts ahead at 64 KiB, which made a 64 MiB layer thousands of system calls each way.

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
/// Bytes a gRPC connection reads from its socket at once: a megabyte message arrives in a few reads.
pub const READ_BUFFER: usize = 1 << 20;

/// A TCP connection as TLS runs over it: read through a buffer of [`READ_BUFFER`] bytes for gRPC, directly
/// for HTTP (whose messages are small).
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

/// Accepts TLS connections on `listener` with `config`, each read through `buffer` bytes, and hands over those
/// whose handshake succeeded, with the peer's address. Ends when the receiver is dropped.
pub fn accept(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    buffer: usize,
) -> tokio::sync::mpsc::Receiver<(TlsStream<Socket>, SocketAddr)> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
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
            let (acceptor, done) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(Socket::new(tcp, buffer))).await {
                    Ok(Ok(mut tls)) => {
                        // Encrypt whatever HTTP/2 hands over at once (frames of up to a megabyte, bounded by the
                        // flow-control windows) instead of 64 KiB at a time.
                        tls.get_mut().1.set_buffer_limit(None);
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

/// Dials `host:port` over TLS with `config`, verifying the server as `server_name`, reads buffered by
/// [`READ_BUFFER`] bytes. The caller bounds the whole of it (connect and handshake) with its timeout.
pub async fn connect(
    host: &str,
    port: u16,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<Socket>> {
    let tcp = TcpStream::connect((host, port)).await?;
    let name = rustls_pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut tls = tokio_rustls::TlsConnector::from(config).connect(name, Socket::new(tcp, READ_BUFFER)).await?;
    tls.get_mut().1.set_buffer_limit(None);
    Ok(tls)
}
