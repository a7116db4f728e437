//! The record layer against rustls' own buffered connection, and fuzzed: every TLS 1.3 suite in both directions
//! through key updates, records fragmented across reads and coalesced into one; the alerts each side sends the
//! other; and, property-based (proptest, a bounded number of cases per run), bytes that are no records and
//! changed or cut streams, which must end in an error after a prefix of what was sent, never in other bytes.

use std::net::SocketAddr;
use std::sync::Arc;

use proptest::prelude::*;
use rustls::crypto::ring::cipher_suite;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tests::pattern;
use super::*;
use crate::identity::{Identity, SERVER_NAME, issue, rustls_peer};

thread_local! {
    static IDENTITY: Identity = issue("interop", &[]).unwrap().job_identity();
}

/// TLS 1.3's suites, all of which the record layer seals.
fn suites() -> [rustls::SupportedCipherSuite; 3] {
    [
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ]
}

/// What a relay between two sockets does to the bytes from the first to the second.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Relay {
    /// Hands them on in writes of at most this many bytes (records split across the reader's reads).
    pub(super) piece: Option<usize>,
    /// Flips a bit of the byte at this offset.
    pub(super) flip: Option<usize>,
    /// Ends the connection (a TCP close, no close_notify) after this many bytes.
    pub(super) cut: Option<usize>,
}

/// Accepts one connection on `listener` and relays it to `to`, changing the forward bytes as `relay` says.
async fn relay(listener: TcpListener, to: SocketAddr, relay: Relay) {
    let (mut a, _) = listener.accept().await.unwrap();
    let mut b = TcpStream::connect(to).await.unwrap();
    let _ = (a.set_nodelay(true), b.set_nodelay(true));
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let forward = async {
        let mut buf = vec![0; 1 << 16];
        let mut total = 0;
        loop {
            let mut n = ar.read(&mut buf).await.unwrap_or(0);
            if let Some(cut) = relay.cut {
                n = n.min(cut.saturating_sub(total));
            }
            if n == 0 {
                let _ = bw.shutdown().await;
                return;
            }
            if let Some(at) = relay.flip.filter(|at| (total..total + n).contains(at)) {
                buf[at - total] ^= 0x20;
            }
            total += n;
            for piece in buf[..n].chunks(relay.piece.unwrap_or(n)) {
                if bw.write_all(piece).await.is_err() {
                    return;
                }
            }
        }
    };
    let back = async {
        let _ = tokio::io::copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
    };
    tokio::join!(forward, back);
}

/// Listeners for a server and for the relay in front of it; connect to the second.
async fn relayed(r: Relay) -> (TcpListener, SocketAddr) {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    tokio::spawn(relay(front, server.local_addr().unwrap(), r));
    (server, front_addr)
}

/// The sizes of the buffers readers read into: one smaller than a record, so records are opened in the
/// connection's buffer and copied out, and one that holds several, so they are opened where they land in it.
pub(super) const READERS: [usize; 2] = [7_001, 70_001];

/// Reads until `want` bytes came or the stream ended, `reader` bytes at a time; returns them, or the error with
/// what came before it.
async fn read_all<R: AsyncRead + Unpin>(r: &mut R, want: usize, reader: usize) -> (Vec<u8>, io::Result<()>) {
    let mut got = Vec::new();
    let mut buf = vec![0; reader];
    while got.len() < want {
        match r.read(&mut buf).await {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Err(e)),
        }
    }
    (got, Ok(()))
}

/// Writes `data` in writes of `piece` bytes, flushing after each.
async fn write_in<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8], piece: usize) {
    for c in data.chunks(piece) {
        w.write_all(c).await.unwrap();
        w.flush().await.unwrap();
    }
}

/// This module's client against rustls' server with one `suite`: both directions carry every byte, through a
/// key update rustls asks for and this side's own at its limit; rustls seals `fragment`-byte records (many to
/// one read) and the relay splits everything into `piece`-byte writes (one record over many reads).
async fn client_against_rustls(suite: rustls::SupportedCipherSuite, fragment: usize, piece: usize, reader: usize) {
    let (mut server_config, _) = IDENTITY.with(|id| rustls_peer(id, suite)).unwrap();
    server_config.max_fragment_size = Some(fragment);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let (listener, front) = relayed(Relay { piece: Some(piece), ..Relay::default() }).await;
    let (up, down) = (pattern(150_000, 1), pattern(120_000, 2));
    let (up2, down2) = (up.clone(), down.clone());
    let server = tokio::spawn(async move {
        let mut tls = acceptor.accept(listener.accept().await.unwrap().0).await.unwrap();
        assert_eq!(tls.get_ref().1.negotiated_cipher_suite(), Some(suite));
        // The key update right before the last byte: this side opens that byte as the first record of the new key.
        let (first, second) = down2.split_at(down2.len() - 1);
        write_in(&mut tls, first, 9_000).await;
        tls.get_mut().1.refresh_traffic_keys().unwrap();
        write_in(&mut tls, second, 9_000).await;
        let (got, end) = read_all(&mut tls, up2.len(), reader).await;
        end.unwrap();
        assert!(got == up2, "rustls received other bytes than were sent ({:?})", suite.suite());
        tls.shutdown().await.unwrap();
    });
    let tcp = TcpStream::connect(front).await.unwrap();
    let mut client =
        connect(tcp, Arc::new(IDENTITY.with(|id| id.grpc_client_config().unwrap())), SERVER_NAME).await.unwrap();
    client.tx_limit = 3;
    let (got, end) = read_all(&mut client, down.len(), reader).await;
    end.unwrap();
    assert!(got == down, "the record layer received other bytes than rustls sent ({:?})", suite.suite());
    assert_eq!(client.rx.seq, 1, "it followed rustls' key update ({:?})", suite.suite());
    write_in(&mut client, &up, 40_000).await;
    assert!(client.tx.seq <= 3, "it updated its own key at its limit (sequence {})", client.tx.seq);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "nothing after rustls' close_notify");
    server.await.unwrap();
}

/// rustls' client with one `suite` against this module's server, the same way round.
async fn rustls_against_server(suite: rustls::SupportedCipherSuite, fragment: usize, piece: usize, reader: usize) {
    let (_, mut client_config) = IDENTITY.with(|id| rustls_peer(id, suite)).unwrap();
    client_config.max_fragment_size = Some(fragment);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
    let (listener, front) = relayed(Relay { piece: Some(piece), ..Relay::default() }).await;
    let (up, down) = (pattern(130_000, 3), pattern(110_000, 4));
    let (up2, down2) = (up.clone(), down.clone());
    let client = tokio::spawn(async move {
        let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let mut tls = connector.connect(name, TcpStream::connect(front).await.unwrap()).await.unwrap();
        assert_eq!(tls.get_ref().1.negotiated_cipher_suite(), Some(suite));
        let (first, second) = up2.split_at(up2.len() - 1);
        write_in(&mut tls, first, 5_000).await;
        tls.get_mut().1.refresh_traffic_keys().unwrap();
        write_in(&mut tls, second, 5_000).await;
        let (got, end) = read_all(&mut tls, down2.len(), reader).await;
        end.unwrap();
        assert!(got == down2, "rustls received other bytes than were sent ({:?})", suite.suite());
        tls.shutdown().await.unwrap();
    });
    let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
    let mut server = accept(listener.accept().await.unwrap().0, config).await.unwrap();
    server.tx_limit = 4;
    let (got, end) = read_all(&mut server, up.len(), reader).await;
    end.unwrap();
    assert!(got == up, "the record layer received other bytes than rustls sent ({:?})", suite.suite());
    assert_eq!(server.rx.seq, 1, "it followed rustls' key update ({:?})", suite.suite());
    write_in(&mut server, &down, 33_333).await;
    assert!(server.tx.seq <= 4, "it updated its own key at its limit (sequence {})", server.tx.seq);
    server.shutdown().await.unwrap();
    client.await.unwrap();
}

#[tokio::test]
async fn every_suite_interoperates_with_rustls_both_ways_through_key_updates_fragments_and_coalesced_records() {
    for suite in suites() {
        // Small records coalesced into one read, then records split into 1-byte and odd-sized pieces.
        for (fragment, piece) in [(64, 1 << 16), (16_384, 1), (1_000, 777)] {
            for reader in READERS {
                client_against_rustls(suite, fragment, piece, reader).await;
                rustls_against_server(suite, fragment, piece, reader).await;
            }
        }
    }
}

/// A record that fails rustls' check draws its alert (bad_record_mac, 20), which this side reports as the
/// peer's alert; rustls' fatal alert to a well-formed stream (here, its own refusal) ends reads the same way.
#[tokio::test]
async fn a_forged_record_draws_rustls_alert_which_this_side_reports() {
    let (server_config, _) = IDENTITY.with(|id| rustls_peer(id, cipher_suite::TLS13_AES_128_GCM_SHA256)).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // rustls may meet the forged record with its handshake's last message, or after it.
    let server = tokio::spawn(async move {
        match acceptor.accept(listener.accept().await.unwrap().0).await {
            Ok(mut tls) => tls.read(&mut [0; 100]).await.unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut client =
        connect(tcp, Arc::new(IDENTITY.with(|id| id.grpc_client_config().unwrap())), SERVER_NAME).await.unwrap();
    // A record of the right shape whose tag is not the key's.
    let mut forged = vec![APPLICATION_DATA, 3, 3, 0, 40];
    forged.extend(pattern(40, 9));
    client.tcp.write_all(&forged).await.unwrap();
    let refused = server.await.unwrap();
    assert!(refused.to_lowercase().contains("decrypt"), "rustls refused the record: {refused}");
    let err = client.read(&mut [0; 10]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted, "{err}");
    assert!(err.to_string().contains("alert 20"), "{err}");
}

/// This side's server with this side's client through `relay`; what the server read, `reader` bytes at a time,
/// and how its reading ended.
pub(super) async fn through(r: Relay, data: Vec<u8>, reader: usize) -> (Vec<u8>, io::Result<()>) {
    let (listener, front) = relayed(r).await;
    let want = data.len();
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(front).await.unwrap();
        let config = Arc::new(IDENTITY.with(|id| id.grpc_client_config().unwrap()));
        let mut c = connect(tcp, config, SERVER_NAME).await.unwrap();
        // The server may refuse before all is sent: a failed write is its answer, not this test's failure.
        let _ = c.write_all(&data).await;
        let _ = c.shutdown().await;
    });
    let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
    let accepted = accept(listener.accept().await.unwrap().0, config).await;
    let out = match accepted {
        Ok(mut server) => {
            let deadline = std::time::Duration::from_secs(20);
            match tokio::time::timeout(deadline, read_all(&mut server, want + 1, reader)).await {
                Ok(read) => read,
                Err(_) => (Vec::new(), Err(io::Error::new(io::ErrorKind::TimedOut, "the server hung"))),
            }
        }
        Err(e) => (Vec::new(), Err(e)),
    };
    let _ = client.await;
    out
}

/// The bytes the client sends before its first application record: a handshake flight with its certificate is
/// under 4 KiB; changes past this offset fall on records.
pub(super) const PAST_HANDSHAKE: usize = 8 << 10;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A changed bit anywhere past the handshake, or a cut there, and writes of any size: the server reads a
    /// prefix of what was sent, then an error (never other bytes, never a clean end, never a hang).
    #[test]
    fn a_changed_or_cut_stream_yields_a_prefix_then_an_error(
        len in 20_000usize..120_000,
        at in 0usize..100_000,
        cut in any::<bool>(),
        piece in prop_oneof![Just(None), (1usize..3_000).prop_map(Some)],
        seed in any::<u64>(),
        reader in proptest::sample::select(&READERS[..]),
    ) {
        let data = pattern(len, seed);
        let at = PAST_HANDSHAKE + at;
        let r = if cut { Relay { cut: Some(at), piece, ..Relay::default() } } else { Relay { flip: Some(at), piece, ..Relay::default() } };
        let (got, end) = runtime().block_on(through(r, data.clone(), reader));
        prop_assert!(data.starts_with(&got), "the server read bytes that were not sent");
        // A change past everything sent changes nothing: all of it arrives, and close_notify ends it.
        if got.len() < data.len() {
            prop_assert!(end.is_err(), "a changed stream ended without an error after {} bytes", got.len());
        } else {
            prop_assert!(end.is_ok(), "{end:?}");
        }
    }

    /// Bytes that are not records, after a good handshake: an error, none of them read as data.
    #[test]
    fn bytes_that_are_not_records_are_refused(
        noise in proptest::collection::vec(any::<u8>(), 1..6_000),
        typed in any::<bool>(),
        reader in proptest::sample::select(&READERS[..]),
    ) {
        let mut noise = noise;
        if typed && noise.len() > 5 {
            // Shaped like a record, so the opener gets past the header: a length within bounds, and a body.
            let len = ((noise.len() - 5).clamp(TAG + 1, MAX_CIPHERTEXT)) as u16;
            noise[..5].copy_from_slice(&[APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8]);
        }
        let got = runtime().block_on(async move {
            let (listener, front) = relayed(Relay::default()).await;
            let client = tokio::spawn(async move {
                let tcp = TcpStream::connect(front).await.unwrap();
                let config = Arc::new(IDENTITY.with(|id| id.grpc_client_config().unwrap()));
                let mut c = connect(tcp, config, SERVER_NAME).await.unwrap();
                let _ = c.tcp.write_all(&noise).await;
                let _ = c.tcp.shutdown().await;
                // Held until the server is done, so the connection ends by the shutdown above.
                c
            });
            let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
            // The noise may arrive with the handshake's last message: refused by the handshake, or after it.
            let read = match accept(listener.accept().await.unwrap().0, config).await {
                Ok(mut server) => {
                    tokio::time::timeout(std::time::Duration::from_secs(20), read_all(&mut server, 1 << 20, reader)).await
                }
                Err(e) => Ok((Vec::new(), Err(e))),
            };
            drop(client.await);
            read
        });
        let (data, end) = got.map_err(|_| TestCaseError::fail("the server hung"))?;
        prop_assert!(data.is_empty() && end.is_err(), "{} bytes read, {end:?}", data.len());
    }
}
