//! TLS 1.3 connections whose records are sealed and opened in the connection's own buffers: the gRPC
//! connections that carry layers.
//!
//! rustls makes the handshake (its unbuffered API) and keeps the key schedule afterwards ([`rustls::kernel`],
//! the interface it offers for kernel TLS): it checks the peer's certificate, derives every traffic secret,
//! and derives the next ones on a key update. What this module does is what the kernel would do with those
//! secrets: seal application data into records and open the records received, with ring's AEAD (the same
//! code rustls calls), as RFC 8446 §5.2–5.3 says.
//!
//! Why: rustls' buffered connection copies a received record three times (into its deframer 4 KiB at a time,
//! out to a queue of plaintext, out to the reader) and allocates every record it sends. Here a reader with room
//! for a whole record (HTTP/2's, reading a megabyte frame) gets the socket's bytes in its own buffer, and the
//! records are opened there, each one's plaintext moved over the headers and tags before it by the decryption
//! itself: no copy beyond the kernel's. A smaller reader's records are read in reads of up to [`READ_BUFFER`]
//! bytes, opened where they landed and copied once into its buffer. A record sent is copied once, into the
//! buffer the socket sends from, and sealed there. A 64 MiB layer crosses a hop with one copy beyond the
//! plaintext protocol's, on the sending side (`wsctl bench transport`: 0.77× to 0.82× of raw TCP here).
//!
//! Everything the peer sends is checked before it is used: a record's length against TLS's bound before any
//! byte of it is buffered, its tag before its content is read, its inner content type, each alert and each
//! post-handshake message. Nonces are the record's sequence number under the connection's IV and never repeat:
//! before a direction reaches its suite's confidentiality limit this side sends a key update.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Most plaintext bytes in one record (RFC 8446 §5.1).
const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes of a record's encrypted part: plaintext, content type, padding and tag (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// A record's header: content type, legacy version, length.
const HEADER: usize = 5;
/// The AEAD tag of every suite here.
const TAG: usize = 16;
/// The outer content type of every protected record, and the inner one of application data.
const APPLICATION_DATA: u8 = 23;
/// Inner content types.
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
/// Post-handshake messages (RFC 8446 §4.6).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// Most bytes of post-handshake messages held while they are incomplete (rustls' own bound for handshakes).
const MAX_HANDSHAKE_MESSAGE: usize = 0xffff;
/// Most bytes of handshake records held while the handshake runs.
const HANDSHAKE_BUFFER: usize = MAX_HANDSHAKE_MESSAGE + MAX_CIPHERTEXT + HEADER;
/// Plaintext bytes sealed ahead of the socket before a write waits for it: a whole HTTP/2 frame of a layer (up
/// to a megabyte) at once. Smaller pieces (256 and 64 KiB) streamed a 64 MiB layer more slowly: the socket takes
/// a megabyte at once, and fewer, larger writes cost less (`wsctl bench transport`).
pub const WRITE_AHEAD: usize = 1 << 20;
/// Bytes a connection reads from its socket at once: a megabyte message arrives in a few reads.
pub const READ_BUFFER: usize = 1 << 20;
/// Records sent under one key before this side updates it, below every suite's confidentiality limit.
const KEY_UPDATE_MARGIN: u64 = 1 << 10;

/// The key schedule rustls keeps after the handshake, for either side.
trait Schedule: Tickets + Send + Sync {
    /// The next secrets this side sends under (after it sends a key update).
    fn update_tx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error>;
    /// The next secrets the peer sends under (after it sent a key update).
    fn update_rx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error>;
}

/// What a side does with a session ticket its peer sent.
trait Tickets {
    /// Keeps the ticket (a client), or refuses it (a server: clients send none).
    fn ticket(&mut self, payload: &[u8]) -> Result<(), rustls::Error>;
}

impl Tickets for KernelConnection<ClientConnectionData> {
    fn ticket(&mut self, payload: &[u8]) -> Result<(), rustls::Error> {
        self.handle_new_session_ticket(payload)
    }
}

impl Tickets for KernelConnection<ServerConnectionData> {
    fn ticket(&mut self, _: &[u8]) -> Result<(), rustls::Error> {
        Err(rustls::Error::General("a client sent a session ticket".into()))
    }
}

impl<Data> Schedule for KernelConnection<Data>
where
    KernelConnection<Data>: Tickets + Send + Sync,
{
    fn update_tx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error> {
        self.update_tx_secret().map(|(_, s)| s)
    }
    fn update_rx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error> {
        self.update_rx_secret().map(|(_, s)| s)
    }
}

/// One direction's key: the AEAD key, the IV and the next record's sequence number.
struct Direction {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Direction {
    fn new(secrets: ConnectionTrafficSecrets, seq: u64) -> io::Result<Direction> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return Err(invalid("the negotiated cipher suite is not one this connection seals")),
        };
        let key =
            UnboundKey::new(algorithm, key.as_ref()).map_err(|_| invalid("the traffic key has the wrong length"))?;
        let iv: [u8; NONCE_LEN] = iv.as_ref().try_into().map_err(|_| invalid("the traffic IV has the wrong length"))?;
        Ok(Direction { key: LessSafeKey::new(key), iv, seq })
    }

    /// The nonce of the next record (RFC 8446 §5.3), and the sequence number moved on.
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self.seq.checked_add(1).ok_or_else(|| invalid("the record sequence number wrapped"))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// The length of the record `header` begins, checked before any byte of it is buffered: a protected record
/// (RFC 8446 §5.2), within TLS's bounds.
fn record_len(header: &[u8; HEADER]) -> io::Result<usize> {
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if header[0] != APPLICATION_DATA {
        return Err(invalid(format!("the peer sent a record of type {} after the handshake", header[0])));
    }
    if !(TAG + 1..=MAX_CIPHERTEXT).contains(&len) {
        return Err(invalid(format!("the peer sent a record of {len} bytes, outside TLS's bounds")));
    }
    Ok(len)
}

/// An opened record's inner content type and the length of its content, its padding removed (RFC 8446 §5.2).
fn inner_content(opened: &[u8]) -> io::Result<(u8, usize)> {
    match opened.iter().rposition(|&b| b != 0) {
        Some(at) => Ok((opened[at], at)),
        None => Err(invalid("the peer sent a record without a content type")),
    }
}

fn tampered() -> io::Error {
    invalid("a record failed its authentication check: the connection was tampered with")
}

fn closed_without_notify() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection without a TLS close_notify")
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// A TLS 1.3 connection after its handshake, sealing and opening its own records.
pub struct Stream {
    tcp: TcpStream,
    schedule: Box<dyn Schedule>,
    tx: Direction,
    rx: Direction,
    /// Records sent under `tx`'s key before it must be updated.
    tx_limit: u64,
    /// Bytes read from the socket: `[plain.0, plain.1)` is opened plaintext not yet read,
    /// `[start, end)` records not yet opened.
    read: Vec<u8>,
    plain: (usize, usize),
    start: usize,
    end: usize,
    /// Post-handshake messages received, until each is whole.
    handshake: Vec<u8>,
    /// The peer sent close_notify: reads end.
    peer_closed: bool,
    /// Sealed records not yet written to the socket, from `sent`.
    write: Vec<u8>,
    sent: usize,
    /// This side sent close_notify: nothing more is sealed.
    closed: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("tcp", &self.tcp)
            .field("rx_seq", &self.rx.seq)
            .field("tx_seq", &self.tx.seq)
            .finish()
    }
}

impl Stream {
    fn new(
        tcp: TcpStream,
        secrets: ExtractedSecrets,
        schedule: Box<dyn Schedule>,
        suite: rustls::SupportedCipherSuite,
        early: Handover,
    ) -> io::Result<Stream> {
        let Some(suite) = suite.tls13() else {
            return Err(invalid("the connection negotiated TLS 1.2: layer streams speak TLS 1.3 only"));
        };
        let limit = suite.common.confidentiality_limit;
        let mut read = vec![0; READ_BUFFER.max(MAX_CIPHERTEXT + HEADER) + early.plaintext.len()];
        // Plaintext rustls opened during the handshake comes first, then the records after it.
        let p = early.plaintext.len();
        read[..p].copy_from_slice(&early.plaintext);
        let end = p + early.records.len();
        if end > read.len() {
            return Err(invalid("more bytes followed the handshake than a connection buffers"));
        }
        read[p..end].copy_from_slice(&early.records);
        Ok(Stream {
            tcp,
            schedule,
            tx: Direction::new(secrets.tx.1, secrets.tx.0)?,
            rx: Direction::new(secrets.rx.1, secrets.rx.0)?,
            tx_limit: limit.saturating_sub(KEY_UPDATE_MARGIN).max(1),
            read,
            plain: (0, p),
            start: p,
            end,
            handshake: Vec::new(),
            peer_closed: false,
            write: Vec::with_capacity(WRITE_AHEAD + 2 * (HEADER + MAX_CIPHERTEXT)),
            sent: 0,
            closed: false,
        })
    }

    /// Seals one record of content type `kind` holding `parts` (at most [`MAX_PLAINTEXT`] bytes in all) onto
    /// the write buffer, updating this side's key first when its limit is near.
    fn seal(&mut self, kind: u8, parts: &[&[u8]]) -> io::Result<()> {
        if self.tx.seq >= self.tx_limit && kind != HANDSHAKE {
            self.update_own_key()?;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= MAX_PLAINTEXT);
        let at = self.write.len();
        let sealed = u16::try_from(len + 1 + TAG).map_err(|_| invalid("a record too large to seal"))?;
        let header = [APPLICATION_DATA, 3, 3, (sealed >> 8) as u8, sealed as u8];
        self.write.extend_from_slice(&header);
        for p in parts {
            self.write.extend_from_slice(p);
        }
        self.write.push(kind);
        let nonce = self.tx.next_nonce()?;
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.write[at + HEADER..])
            .map_err(|_| invalid("sealing a record failed"))?;
        self.write.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Sends a key update (update_not_requested) under this side's key, and seals everything after it under
    /// the next one: at the key's limit, and in answer to a peer that asked for it.
    fn update_own_key(&mut self) -> io::Result<()> {
        self.seal(HANDSHAKE, &[&[KEY_UPDATE, 0, 0, 1, 0]])?;
        let next = self.schedule.update_tx().map_err(tls_error)?;
        self.tx = Direction::new(next, 0)?;
        Ok(())
    }

    /// Seals up to `budget` bytes of `bufs` as application data records; returns how many bytes were taken.
    fn seal_data(&mut self, bufs: &[io::IoSlice<'_>], budget: usize) -> io::Result<usize> {
        let mut taken = 0;
        let mut slices = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut current: &[u8] = slices.next().unwrap_or_default();
        while taken < budget && !current.is_empty() {
            // One record: whole pieces of the slices, up to the record's size.
            let room = MAX_PLAINTEXT.min(budget - taken);
            let mut parts: [&[u8]; 8] = [&[]; 8];
            let (mut n, mut filled) = (0, 0);
            while filled < room && n < parts.len() && !current.is_empty() {
                let k = current.len().min(room - filled);
                parts[n] = &current[..k];
                current = &current[k..];
                if current.is_empty() {
                    current = slices.next().unwrap_or_default();
                }
                n += 1;
                filled += k;
            }
            self.seal(APPLICATION_DATA, &parts[..n])?;
            taken += filled;
        }
        Ok(taken)
    }

    /// Writes sealed records to the socket until none is left, or the socket is full.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.write.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.write[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.write.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Opens the next whole record in the read buffer, if there is one: its plaintext becomes readable, or it is
    /// acted on (an alert, a post-handshake message).
    fn open_next(&mut self) -> io::Result<bool> {
        let available = &self.read[self.start..self.end];
        if available.len() < HEADER {
            return Ok(false);
        }
        let header: [u8; HEADER] = [available[0], available[1], available[2], available[3], available[4]];
        let len = record_len(&header)?;
        if available.len() < HEADER + len {
            return Ok(false);
        }
        let body = self.start + HEADER;
        self.start = body + len;
        let nonce = self.rx.next_nonce()?;
        let opened = self
            .rx
            .key
            .open_in_place(nonce, Aad::from(header), &mut self.read[body..body + len])
            .map_err(|_| tampered())?;
        match inner_content(opened)? {
            (APPLICATION_DATA, n) => self.plain = (body, body + n),
            (kind, n) => {
                let content = self.read[body..body + n].to_vec();
                self.control(kind, &content)?;
            }
        }
        Ok(true)
    }

    /// Bytes still to read of the record cut at the end of the read buffer (its header's rest, then its body).
    fn cut_record_rest(&self) -> usize {
        let available = &self.read[self.start..self.end];
        match available {
            [_, _, _, hi, lo, ..] => (HEADER + u16::from_be_bytes([*hi, *lo]) as usize).saturating_sub(available.len()),
            _ => HEADER - available.len(),
        }
    }

    /// Reads from the socket straight into `buf` and opens the records there, each record's plaintext moved over
    /// the headers and tags before it by the decryption itself (ring's `open_within`): a layer crosses this side
    /// with no copy beyond the kernel's. A record the read cut goes to the connection's buffer to be finished
    /// there. `buf` may gain nothing (only control records came, or a cut record): the caller reads again.
    fn poll_read_direct(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let at = buf.filled().len();
        ready!(Pin::new(&mut self.tcp).poll_read(cx, buf))?;
        if buf.filled().len() == at {
            return Poll::Ready(Err(closed_without_notify()));
        }
        let mut plain = 0;
        let opened = self.open_all(&mut buf.filled_mut()[at..], &mut plain);
        // Only what was opened and authenticated stays the reader's.
        buf.set_filled(at + plain);
        Poll::Ready(opened)
    }

    /// Opens every whole record of `region` where it lies, its plaintext gathered at the region's start (`plain`
    /// bytes of it), and moves the cut record at its end to the read buffer.
    fn open_all(&mut self, region: &mut [u8], plain: &mut usize) -> io::Result<()> {
        let mut at = 0;
        while !self.peer_closed && region.len() - at >= HEADER {
            let header: [u8; HEADER] = [region[at], region[at + 1], region[at + 2], region[at + 3], region[at + 4]];
            let len = record_len(&header)?;
            if region.len() - at < HEADER + len {
                break;
            }
            let nonce = self.rx.next_nonce()?;
            let to = *plain;
            let sealed = at + HEADER - to..;
            let opened = self
                .rx
                .key
                .open_within(nonce, Aad::from(header), &mut region[to..at + HEADER + len], sealed)
                .map_err(|_| tampered())?;
            let (kind, n) = inner_content(opened)?;
            at += HEADER + len;
            if kind == APPLICATION_DATA {
                *plain += n;
            } else {
                self.control(kind, &region[to..to + n])?;
            }
        }
        // After close_notify nothing more is read (RFC 8446 §6.1).
        let rest = if self.peer_closed { &[][..] } else { &region[at..] };
        self.read[..rest.len()].copy_from_slice(rest);
        (self.start, self.end, self.plain) = (0, rest.len(), (0, 0));
        Ok(())
    }

    /// Acts on an opened record that is not application data: an alert (close_notify ends the reads, any other
    /// fails the connection) or post-handshake messages.
    fn control(&mut self, kind: u8, content: &[u8]) -> io::Result<()> {
        match (kind, content) {
            (ALERT, [_, 0]) => self.peer_closed = true,
            (ALERT, [_, description]) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("the peer sent TLS alert {description}"),
                ));
            }
            (ALERT, _) => return Err(invalid("the peer sent a malformed alert")),
            (HANDSHAKE, _) => {
                if self.handshake.len() + content.len() > MAX_HANDSHAKE_MESSAGE {
                    return Err(invalid("the peer sent a post-handshake message larger than allowed"));
                }
                self.handshake.extend_from_slice(content);
                self.post_handshake()?;
            }
            (other, _) => return Err(invalid(format!("the peer sent content of type {other} after the handshake"))),
        }
        Ok(())
    }

    /// Acts on every whole post-handshake message received.
    fn post_handshake(&mut self) -> io::Result<()> {
        let mut messages = std::mem::take(&mut self.handshake);
        let mut at = 0;
        while let [kind, a, b, c, rest @ ..] = &messages[at..] {
            let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
            if rest.len() < len {
                break;
            }
            let payload = &rest[..len];
            match *kind {
                NEW_SESSION_TICKET => self.schedule.ticket(payload).map_err(tls_error)?,
                KEY_UPDATE => {
                    let requested = match payload {
                        [0] => false,
                        [1] => true,
                        _ => return Err(invalid("the peer sent a malformed key update")),
                    };
                    // A key update ends its record (RFC 8446 §5.1): what follows is under the new key.
                    if at + 4 + len != messages.len() {
                        return Err(invalid("the peer sent data after a key update in the same record"));
                    }
                    let next = self.schedule.update_rx().map_err(tls_error)?;
                    self.rx = Direction::new(next, 0)?;
                    if requested && !self.closed {
                        self.update_own_key()?;
                    }
                }
                other => return Err(invalid(format!("the peer sent handshake message {other} after the handshake"))),
            }
            at += 4 + len;
        }
        messages.drain(..at);
        self.handshake = messages;
        Ok(())
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let given = buf.filled().len();
        loop {
            // Every whole record buffered is opened into `buf` while it has room: one call hands over as much as
            // the socket brought, not a record's worth (a megabyte frame in one read, not 64).
            let (from, to) = this.plain;
            if from < to {
                let n = (to - from).min(buf.remaining());
                buf.put_slice(&this.read[from..from + n]);
                this.plain.0 += n;
                if buf.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            if this.open_next()? {
                if this.sent < this.write.len() {
                    // A key update answered: send it without waiting for the next write.
                    let _ = this.poll_send(cx)?;
                }
                continue;
            }
            if buf.filled().len() > given {
                // What was opened is the reader's now; the socket is read on its next call.
                return Poll::Ready(Ok(()));
            }
            // A reader with room for a whole record gets the socket's bytes straight, once nothing is buffered.
            let direct = buf.remaining() >= HEADER + MAX_CIPHERTEXT;
            if direct && this.start == this.end {
                ready!(this.poll_read_direct(cx, buf))?;
                if this.sent < this.write.len() {
                    let _ = this.poll_send(cx)?;
                }
                continue;
            }
            // Room for at least one whole record after what is buffered.
            if this.start == this.end {
                (this.start, this.end) = (0, 0);
            } else if this.read.len() - this.end < HEADER + MAX_CIPHERTEXT {
                this.read.copy_within(this.start..this.end, 0);
                (this.start, this.end) = (0, this.end - this.start);
            }
            this.plain = (this.start, this.start);
            // For such a reader, only the cut record is finished here: the bytes after it go straight again.
            let limit = if direct { (this.end + this.cut_record_rest()).min(this.read.len()) } else { this.read.len() };
            let mut into = ReadBuf::new(&mut this.read[this.end..limit]);
            ready!(Pin::new(&mut this.tcp).poll_read(cx, &mut into))?;
            let n = into.filled().len();
            if n == 0 {
                return Poll::Ready(Err(closed_without_notify()));
            }
            this.end += n;
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "the TLS connection was shut down")));
        }
        if this.write.len() - this.sent >= WRITE_AHEAD {
            ready!(this.poll_send(cx))?;
        }
        if this.sent >= WRITE_AHEAD {
            // What was sent goes, so the buffer stays within a few times WRITE_AHEAD.
            this.write.drain(..this.sent);
            this.sent = 0;
        }
        let budget = WRITE_AHEAD - (this.write.len() - this.sent).min(WRITE_AHEAD);
        let taken = this.seal_data(bufs, budget.max(1))?;
        // Start sending at once; what the socket cannot take yet waits for the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closed {
            // close_notify, a warning alert.
            this.seal(ALERT, &[&[1, 0]])?;
            this.closed = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Stream {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp.peer_addr().ok()
    }
}

/// What the handshake leaves for the record layer: plaintext rustls already opened, and bytes of records
/// after it.
struct Handover {
    plaintext: Vec<u8>,
    records: Vec<u8>,
}

/// The two sides' unbuffered connections, as one handshake drives them.
trait Handshake: Sized {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn finish(self) -> Result<(ExtractedSecrets, Box<dyn Schedule>, rustls::SupportedCipherSuite), rustls::Error>;
}

/// The same handshake steps for both sides: rustls defines them on each side's type.
macro_rules! handshake_for {
    ($conn:ty, $data:ty) => {
        impl Handshake for $conn {
            type Data = $data;
            fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn finish(
                self,
            ) -> Result<(ExtractedSecrets, Box<dyn Schedule>, rustls::SupportedCipherSuite), rustls::Error> {
                let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
                let suite = kernel.negotiated_cipher_suite();
                Ok((secrets, Box::new(kernel), suite))
            }
        }
    };
}

handshake_for!(UnbufferedClientConnection, ClientConnectionData);
handshake_for!(UnbufferedServerConnection, ServerConnectionData);

/// Drives `conn`'s handshake over `tcp` to its end, then hands the connection to the record layer.
async fn handshake<C: Handshake>(mut conn: C, mut tcp: TcpStream) -> io::Result<Stream> {
    let _ = tcp.set_nodelay(true);
    let mut incoming = vec![0; HANDSHAKE_BUFFER];
    let mut used = 0;
    let mut outgoing = Vec::new();
    let mut plaintext = Vec::new();
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..used]);
        let mut done = false;
        match state.map_err(tls_error)? {
            ConnectionState::EncodeTlsData(mut s) => {
                let at = outgoing.len();
                outgoing.resize(at + MAX_CIPHERTEXT + HEADER, 0);
                let n = match s.encode(&mut outgoing[at..]) {
                    Err(EncodeError::InsufficientSize(e)) if e.required_size <= HANDSHAKE_BUFFER => {
                        outgoing.resize(at + e.required_size, 0);
                        s.encode(&mut outgoing[at..])
                    }
                    other => other,
                }
                .map_err(|e| invalid(e.to_string()))?;
                outgoing.truncate(at + n);
            }
            ConnectionState::TransmitTlsData(s) => {
                tcp.write_all(&outgoing).await?;
                outgoing.clear();
                s.done();
            }
            ConnectionState::BlockedHandshake => {
                if used == incoming.len() {
                    return Err(invalid("the peer's handshake is larger than allowed"));
                }
                let n = tcp.read(&mut incoming[used..]).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ));
                }
                used += n;
            }
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(record) = r.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    if plaintext.len() + record.payload.len() > HANDSHAKE_BUFFER {
                        return Err(invalid("the peer sent more data during the handshake than allowed"));
                    }
                    plaintext.extend_from_slice(record.payload);
                }
            }
            ConnectionState::WriteTraffic(_) => done = true,
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            other => return Err(invalid(format!("unexpected TLS handshake state {other:?}"))),
        }
        incoming.copy_within(discard..used, 0);
        used -= discard;
        if done {
            break;
        }
    }
    let (secrets, schedule, suite) = conn.finish().map_err(tls_error)?;
    incoming.truncate(used);
    Stream::new(tcp, secrets, schedule, suite, Handover { plaintext, records: incoming })
}

/// The server side of a connection accepted on `tcp`, with `config` (which must allow extracting secrets).
pub async fn accept(tcp: TcpStream, config: Arc<rustls::ServerConfig>) -> io::Result<Stream> {
    handshake(UnbufferedServerConnection::new(config).map_err(tls_error)?, tcp).await
}

/// The client side of a connection to `server_name` on `tcp`, with `config` (which must allow extracting
/// secrets).
pub async fn connect(tcp: TcpStream, config: Arc<rustls::ClientConfig>, server_name: &str) -> io::Result<Stream> {
    let name = rustls_pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    handshake(UnbufferedClientConnection::new(config, name).map_err(tls_error)?, tcp).await
}

#[cfg(test)]
mod interop;

#[cfg(test)]
mod tests {
    use super::interop::{PAST_HANDSHAKE, READERS, Relay, through};
    use super::*;
    use crate::identity::{Identity, SERVER_NAME, issue};
    use tokio::net::TcpListener;

    fn identity() -> Identity {
        issue("records", &[]).unwrap().job_identity()
    }

    /// Bytes no two positions of which are likely equal by chance, so a shifted or repeated piece shows.
    pub(super) fn pattern(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A connected pair: this module's client and `server`'s stream.
    async fn pair<S, F>(server: impl FnOnce(TcpStream) -> F) -> (Stream, S)
    where
        F: std::future::Future<Output = io::Result<S>>,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            connect(tcp, Arc::new(identity_client()), SERVER_NAME).await
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let server = server(tcp).await.unwrap();
        (client.await.unwrap().unwrap(), server)
    }

    fn identity_client() -> rustls::ClientConfig {
        IDENTITY.with(|id| id.grpc_client_config().unwrap())
    }

    thread_local! {
        static IDENTITY: Identity = identity();
    }

    /// Writes `data` in pieces of `piece` bytes, some as vectored writes of two slices, then shuts down.
    async fn send<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8], piece: usize) {
        for c in data.chunks(piece) {
            let (a, b) = c.split_at(c.len() / 3);
            let mut at = 0;
            while at < c.len() {
                let bufs = if at < a.len() {
                    [io::IoSlice::new(&a[at..]), io::IoSlice::new(b)]
                } else {
                    [io::IoSlice::new(&c[at..]), io::IoSlice::new(&[])]
                };
                at += w.write_vectored(&bufs).await.unwrap();
            }
        }
        w.flush().await.unwrap();
    }

    #[tokio::test]
    async fn both_directions_carry_every_byte_and_close_cleanly() {
        let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
        let (mut client, mut server) = pair(|tcp| accept(tcp, config)).await;
        let (up, down) = (pattern(3 << 20 | 12_345, 1), pattern(1 << 20 | 7, 2));
        let (up2, down2) = (up.clone(), down.clone());
        let server_side = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = vec![0; 5000];
            while got.len() < up2.len() {
                let n = server.read(&mut buf).await.unwrap();
                assert!(n > 0, "the stream ended early");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == up2, "the server received other bytes than were sent");
            send(&mut server, &down2, 100_003).await;
            server.shutdown().await.unwrap();
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        });
        send(&mut client, &up, 1 << 20).await;
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got == down, "the client received other bytes than were sent");
        client.shutdown().await.unwrap();
        server_side.await.unwrap();
    }

    /// The record layer speaks TLS as rustls does: against rustls' own buffered server, which sends session
    /// tickets and asks for a key update, and after this side updates its own key at its limit.
    #[tokio::test]
    async fn it_interoperates_with_rustls_through_tickets_and_key_updates() {
        let mut config = IDENTITY.with(|id| id.server_config(false).unwrap());
        config.send_tls13_tickets = 2;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (mut client, mut server) = pair(|tcp| acceptor.accept(tcp)).await;
        client.tx_limit = 5;
        let (up, down) = (pattern(400_000, 3), pattern(300_000, 4));
        let (up2, down2) = (up.clone(), down.clone());
        let server_side = tokio::spawn(async move {
            let (first, second) = down2.split_at(100_000);
            server.write_all(first).await.unwrap();
            server.flush().await.unwrap();
            // rustls' key update asks the peer to update too.
            server.get_mut().1.refresh_traffic_keys().unwrap();
            server.write_all(second).await.unwrap();
            server.flush().await.unwrap();
            let mut got = vec![0; up2.len()];
            server.read_exact(&mut got).await.unwrap();
            assert!(got == up2, "rustls received other bytes than were sent");
            server.shutdown().await.unwrap();
        });
        let mut got = vec![0; down.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == down, "the client received other bytes than rustls sent");
        assert!(client.rx.seq < 100, "the client did not follow rustls' key update (sequence {})", client.rx.seq);
        send(&mut client, &up, 65_536).await;
        assert!(client.tx.seq <= 5, "the client did not update its own key at its limit (sequence {})", client.tx.seq);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        server_side.await.unwrap();
    }

    /// rustls' buffered client against this module's server.
    #[tokio::test]
    async fn a_rustls_client_reaches_the_record_layer_server() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(identity_client()));
        let client = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            tls.write_all(&pattern(70_000, 5)).await.unwrap();
            tls.flush().await.unwrap();
            let mut back = vec![0; 70_000];
            tls.read_exact(&mut back).await.unwrap();
            back
        });
        let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
        let mut server = accept(listener.accept().await.unwrap().0, config).await.unwrap();
        let mut got = vec![0; 70_000];
        server.read_exact(&mut got).await.unwrap();
        server.write_all(&got).await.unwrap();
        server.flush().await.unwrap();
        assert!(client.await.unwrap() == pattern(70_000, 5));
    }

    #[tokio::test]
    async fn a_changed_byte_is_refused_and_none_of_its_record_is_read() {
        let data = pattern(200_000, 6);
        for reader in READERS {
            let (clean, end) = through(Relay::default(), data.clone(), reader).await;
            end.unwrap();
            assert!(clean == data, "through the relay unchanged, every byte arrives");
            // Far past the handshake (a few KiB): inside an application data record.
            let (got, end) = through(Relay { flip: Some(100_000), ..Relay::default() }, data.clone(), reader).await;
            let err = end.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            assert!(err.to_string().contains("authentication"), "{err}");
            assert!(got.len() < 100_000 && data.starts_with(&got), "{} bytes read", got.len());
        }
    }

    #[tokio::test]
    async fn a_connection_cut_without_close_notify_is_an_error_not_an_end() {
        for reader in READERS {
            let cut = Relay { cut: Some(PAST_HANDSHAKE + 20_000), ..Relay::default() };
            let (_, end) = through(cut, pattern(50_000, 7), reader).await;
            let err = end.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        }
    }

    #[tokio::test]
    async fn a_record_longer_than_tls_allows_is_refused_from_its_header() {
        // The first record after the handshake claims 0xffff bytes: refused before they are buffered.
        let config = Arc::new(IDENTITY.with(|id| id.grpc_server_config().unwrap()));
        let (mut client, server) = pair(|tcp| accept(tcp, config)).await;
        client.tcp.write_all(&[APPLICATION_DATA, 3, 3, 0xff, 0xff, 0, 0, 0]).await.unwrap();
        let mut server = server;
        let err = server.read(&mut [0; 10]).await.unwrap_err();
        assert!(err.to_string().contains("outside TLS's bounds"), "{err}");
    }
}
