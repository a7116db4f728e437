//! `wsctl bench transport`: how fast a layer streams over loopback through the real protocol, against a raw
//! TCP socket copying the same bytes. The gRPC path is the one MemoryX and the engines use: the layer is cut
//! by `protocol::codec::layer::encode_layer` into chunks of at most 1 MiB (slices of the layer's own buffer),
//! sent from those buffers (`protocol::zero_copy::forward`) on a `Stage.Forward` call over a channel built by
//! `swarmx::relay::connect` to a server started by `protocol::serve_layer_stage` (same windows and frame sizes), read
//! from the frames as an engine reads them (`protocol::direct`) and put back together with `LayerAssembler` into a
//! recycled buffer, every length checked. The
//! raw path is the floor any protocol pays: one length word, the bytes, and a count back.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use plan::limits::Limits;
use runtime::protocol::codec::chunk::Recycled;
use runtime::protocol::codec::layer::{LayerAssembler, encode_layer};
use runtime::protocol::direct::{Chunks, DirectStage, LayerCalls, assemble};
use runtime::protocol::pb::stage_server::{Stage, StageServer};
use runtime::protocol::pb::{self, Ack, BeginStepRequest, InfoReply, InfoRequest, LayerChunk};
use runtime::protocol::{LayerStream, Pass, WeightPayload};
use runtime::protocol::{STAGE_MESSAGE_BYTES, zero_copy};
use serde::Serialize;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// Sizes and repetitions of one `bench transport` run.
#[derive(clap::Args)]
pub struct TransportArgs {
    /// Payload bytes per transfer, a multiple of 4 (f32 weights); the default is one 4096 x 4096 f32 layer.
    #[arg(long, default_value_t = 4096 * 4096 * 4)]
    pub bytes: usize,
    /// Timed transfers per path; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One path's measurement.
#[derive(Serialize)]
struct PathReport {
    /// Payload bytes the sender handed over per transfer.
    bytes_sent: u64,
    /// Payload bytes the receiver counted per transfer (the last one), to show the bytes really moved.
    bytes_received: u64,
    /// Messages per transfer (gRPC chunks; 1 for the raw socket).
    messages: usize,
    /// Median seconds per transfer, from the first byte handed over to the receiver's answer; the paths take
    /// turns, one transfer each per round.
    seconds: f64,
    /// Payload bytes per second at the median.
    bytes_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    bytes: usize,
    repeats: usize,
    grpc: PathReport,
    /// The same gRPC stream without TLS, for what the encryption costs.
    grpc_plaintext: PathReport,
    tcp: PathReport,
    /// gRPC bytes/s over raw TCP bytes/s.
    grpc_over_tcp: f64,
    /// Median seconds of `encode_layer` alone (cutting the layer into chunks), in memory.
    encode_s: f64,
    /// Median seconds of `LayerAssembler` alone (putting the chunks back and checking them), in memory.
    assemble_s: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A `Stage` that takes forward layers, assembles them and counts their payload bytes; nothing else.
struct Sink {
    job: String,
    received: AtomicU64,
    /// The benchmark layer's shape, as a role's plan would bound it.
    limits: Limits,
    /// Value buffers of layers received, reused as an engine reuses them.
    recycled: Arc<Recycled>,
}

/// Limits of a model whose only layer is a dense one of `values` weights (one output), as the benchmark streams:
/// the roles assemble against their plan's limits, so the benchmark measures the same checks.
fn bench_limits(values: usize) -> Limits {
    Limits { shard: 1, layers: vec![plan::layout::LinearShape::new(values, 1, false)], optimizer_values: 0 }
}

impl LayerCalls for Sink {
    async fn forward_layer(&self, chunks: Chunks) -> Result<(), Status> {
        let asm = LayerAssembler::recycling(self.recycled.clone());
        let (_, layer) = assemble(chunks, asm, &self.job, &self.limits).await?;
        self.received.store(layer.weights.wire_bytes(), Ordering::SeqCst);
        self.recycled.give(layer.weights.into_values());
        Ok(())
    }

    async fn backward_layer(&self, _: Chunks) -> Result<Vec<pb::GradChunk>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }
}

#[tonic::async_trait]
impl Stage for Sink {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        Ok(Response::new(InfoReply { job: self.job.clone(), engines: 1, sram_bytes: 0 }))
    }

    async fn begin_step(&self, _: Request<BeginStepRequest>) -> Result<Response<Ack>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    async fn forward(&self, request: Request<Streaming<LayerChunk>>) -> Result<Response<Ack>, Status> {
        self.forward_layer(Box::pin(request.into_inner())).await.map(|()| Response::new(Ack {}))
    }

    async fn loss(&self, _: Request<pb::LossRequest>) -> Result<Response<pb::LossReply>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    type BackwardStream = tokio_stream::Empty<Result<pb::GradChunk, Status>>;

    async fn backward(&self, _: Request<Streaming<LayerChunk>>) -> Result<Response<Self::BackwardStream>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    async fn stats(&self, _: Request<pb::StatsRequest>) -> Result<Response<pb::StatsReply>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    async fn prime(&self, _: Request<Streaming<pb::StateChunk>>) -> Result<Response<Ack>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    type SnapshotStream = tokio_stream::Empty<Result<pb::StateChunk, Status>>;

    async fn snapshot(&self, _: Request<pb::SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    type StepStream = tokio_stream::Empty<Result<pb::StepChunk, Status>>;

    async fn step(&self, _: Request<pb::ResidentStepRequest>) -> Result<Response<Self::StepStream>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }

    async fn apply(&self, _: Request<Streaming<pb::GradChunk>>) -> Result<Response<Ack>, Status> {
        Err(Status::unimplemented("the transport benchmark only streams layers"))
    }
}

/// One transfer of a fresh copy of `layer` on `channel`'s `Stage.Forward`, sent as the roles send it
/// ([`zero_copy::forward`]): its seconds and messages. The copy is made before the clock starts, as MemoryX
/// hands over a new stream per layer.
async fn forward_once(channel: &Channel, layer: &LayerStream, step: u64) -> Result<(f64, usize)> {
    let fresh = layer.clone();
    let start = Instant::now();
    let chunks = encode_layer(fresh, JOB, step);
    let messages = chunks.len();
    zero_copy::forward(channel.clone(), tokio_stream::iter(chunks))
        .await
        .map_err(|s| anyhow!("streaming a layer: {}", s.message()))?;
    Ok((start.elapsed().as_secs_f64(), messages))
}

/// A sink for `layer`'s stream.
fn sink_for(layer: &LayerStream) -> Result<Arc<Sink>> {
    let values = match &layer.weights {
        WeightPayload::Dense(v) => v.len(),
        _ => bail!("the benchmark layer is dense"),
    };
    Ok(Arc::new(Sink {
        job: JOB.into(),
        received: AtomicU64::new(0),
        limits: bench_limits(values),
        recycled: Arc::default(),
    }))
}

/// The job the benchmark's streams belong to.
const JOB: &str = "bench-transport";

/// A channel to a sink served through the runtime's gRPC transport on loopback, over mutual TLS as the roles
/// talk: the figure includes the encryption a job pays.
async fn grpc(sink: Arc<Sink>) -> Result<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind a loopback port")?;
    let identity = wire::identity::issue(JOB, &[])?.job_identity();
    let url = format!("https://{}", listener.local_addr()?);
    let served = identity.clone();
    tokio::spawn(async move { runtime::protocol::serve_layer_stage(sink, listener, &served).await });
    let child =
        runtime::swarmx::relay::connect(&url, JOB, wire::grpc::Dial::new(&identity, Duration::from_secs(10))).await?;
    Ok(child.channel)
}

/// A channel to a sink served with the same windows and frames but no TLS: no role talks this way (they speak
/// only mutual TLS); it is measured so the report can say what the encryption costs.
async fn grpc_plaintext(sink: Arc<Sink>) -> Result<Channel> {
    use wire::grpc::{FRAME, WINDOW};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind a loopback port")?;
    let url = format!("http://{}", listener.local_addr()?);
    let generated = StageServer::from_arc(sink.clone()).max_decoding_message_size(STAGE_MESSAGE_BYTES);
    let svc = DirectStage::new(sink, generated, STAGE_MESSAGE_BYTES);
    tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(4 * WINDOW)
            .max_frame_size(FRAME)
            .add_service(svc)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .tcp_nodelay(true)
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(4 * WINDOW)
        .max_frame_size(FRAME)
        .connect()
        .await
        .context("cannot connect to the plaintext sink")?;
    Ok(channel)
}

/// Receives transfers on one connection: a little-endian u64 length, that many bytes into a reused buffer,
/// then the count read is sent back. Returns when the sender closes the connection.
fn tcp_receiver(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 8];
        match conn.read_exact(&mut len) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let n = usize::try_from(u64::from_le_bytes(len)).map_err(std::io::Error::other)?;
        buf.resize(n, 0);
        conn.read_exact(&mut buf)?;
        conn.write_all(&(n as u64).to_le_bytes())?;
    }
}

/// One transfer of `payload` over a plain TCP connection: its seconds and the bytes the receiver counted.
fn tcp_once(conn: &mut TcpStream, payload: &[u8]) -> Result<(f64, u64)> {
    let start = Instant::now();
    conn.write_all(&(payload.len() as u64).to_le_bytes())?;
    conn.write_all(payload)?;
    let mut count = [0u8; 8];
    conn.read_exact(&mut count).context("the TCP receiver did not answer")?;
    Ok((start.elapsed().as_secs_f64(), u64::from_le_bytes(count)))
}

/// The three paths' reports: each of `repeats` rounds (after one warm-up) times gRPC with TLS, gRPC without and
/// raw TCP back to back, so whatever else the machine does falls on all three alike.
fn paths(layer: &LayerStream, payload: &[u8], repeats: usize) -> Result<[PathReport; 3]> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let (tls_sink, plain_sink) = (sink_for(layer)?, sink_for(layer)?);
    let (tls, plain) = rt.block_on(async {
        Ok::<_, anyhow::Error>((grpc(tls_sink.clone()).await?, grpc_plaintext(plain_sink.clone()).await?))
    })?;
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<()> { tcp_receiver(listener.accept()?.0) });
    let mut conn = TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    conn.set_nodelay(true)?;
    let mut times: [Vec<f64>; 3] = Default::default();
    let (mut messages, mut tcp_received) = ([0; 2], 0);
    for round in 0..=repeats as u64 {
        let (a, m0) = rt.block_on(forward_once(&tls, layer, round))?;
        let (b, m1) = rt.block_on(forward_once(&plain, layer, round))?;
        let (c, got) = tcp_once(&mut conn, payload)?;
        (messages, tcp_received) = ([m0, m1], got);
        if round > 0 {
            for (t, v) in times.iter_mut().zip([a, b, c]) {
                t.push(v);
            }
        }
    }
    drop(conn);
    receiver.join().map_err(|_| anyhow!("the TCP receiver thread panicked"))?.context("TCP receiver")?;
    let bytes = layer.weights.wire_bytes();
    let [t0, t1, t2] = times;
    let report = |received: u64, messages: usize, t: Vec<f64>| {
        let seconds = median(t);
        PathReport {
            bytes_sent: bytes,
            bytes_received: received,
            messages,
            seconds,
            bytes_per_s: bytes as f64 / seconds.max(1e-12),
        }
    };
    Ok([
        report(tls_sink.received.load(Ordering::SeqCst), messages[0], t0),
        report(plain_sink.received.load(Ordering::SeqCst), messages[1], t1),
        report(tcp_received, 1, t2),
    ])
}

/// Runs `wsctl bench transport` and prints its report.
pub fn transport(args: TransportArgs) -> Result<()> {
    // The hop measured is SwarmX's to an engine: both keep their buffers warm, and so does this process.
    runtime::process::keep_allocator_warm();
    if args.bytes == 0 || !args.bytes.is_multiple_of(4) {
        bail!("--bytes must be a positive multiple of 4 (whole f32 weights), got {}", args.bytes);
    }
    if args.bytes > 1 << 32 {
        bail!("--bytes is at most 4294967296 (4 GiB): the layer and its chunks are all held in memory");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let values: Vec<f32> = (0..args.bytes / 4).map(|i| (i % 1021) as f32 * 1e-3).collect();
    let layer = LayerStream { layer: 0, pass: Pass::Forward, weights: WeightPayload::Dense(values), bias: Vec::new() };
    let WeightPayload::Dense(values) = &layer.weights else { bail!("the benchmark layer is dense") };
    let payload: &[u8] = bytemuck::cast_slice(values);

    let mut encode = Vec::new();
    let mut assemble = Vec::new();
    let recycled = Arc::new(Recycled::default());
    // One warm-up, as on the wire: a receiver in steady state assembles into a buffer it has used before.
    for i in 0..=args.repeats {
        let fresh = layer.clone();
        let start = Instant::now();
        let chunks = encode_layer(fresh, "bench-transport", 0);
        let encoded = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let mut asm = LayerAssembler::recycling(recycled.clone());
        let limits = bench_limits(values.len());
        for c in chunks {
            asm.push(c, "bench-transport", &limits)?;
        }
        let (_, assembled) = asm.finish()?;
        if i > 0 {
            encode.push(encoded);
            assemble.push(start.elapsed().as_secs_f64());
        }
        recycled.give(assembled.weights.into_values());
    }

    let [grpc, grpc_plaintext, tcp] = paths(&layer, payload, args.repeats)?;
    for (name, p) in [("gRPC", &grpc), ("gRPC without TLS", &grpc_plaintext), ("TCP", &tcp)] {
        if p.bytes_received != p.bytes_sent {
            bail!("bytes were lost: {name} moved {} of {}", p.bytes_received, p.bytes_sent);
        }
    }
    let report = Report {
        bytes: args.bytes,
        repeats: args.repeats,
        grpc_over_tcp: grpc.bytes_per_s / tcp.bytes_per_s,
        grpc,
        grpc_plaintext,
        tcp,
        encode_s: median(encode),
        assemble_s: median(assemble),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{} bytes per transfer over 127.0.0.1, median of {} rounds (the paths take turns)",
        report.bytes, report.repeats
    );
    let paths =
        [("gRPC Stage.Forward", &report.grpc), ("  without TLS", &report.grpc_plaintext), ("raw TCP", &report.tcp)];
    for (name, p) in paths {
        println!(
            "  {name:<18} {:>4} messages  {:>8.2} ms  {:>7.2} GB/s",
            p.messages,
            1e3 * p.seconds,
            p.bytes_per_s / 1e9
        );
    }
    println!(
        "  gRPC / TCP {:.0}%; of the gRPC time, encoding takes {:.2} ms and assembling {:.2} ms in memory",
        100.0 * report.grpc_over_tcp,
        1e3 * report.encode_s,
        1e3 * report.assemble_s
    );
    Ok(())
}
