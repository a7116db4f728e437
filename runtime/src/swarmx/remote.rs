//! The training loop's view of a SwarmX tree on the network: the [`Swarm`] trait over gRPC. It keeps one
//! layer in flight ahead of the one being computed, so the engines find the next layer already received when
//! they finish the current one, and never more than that.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::relay::{Child, connect};
use super::{Split, StepRequest, StreamSource, Swarm};
use crate::engine::role::EngineStats;
use crate::engine::server::stats_from_pb;
use crate::model::loss::LossSum;
use crate::protocol::LayerGrad;
use crate::protocol::codec::grad::{GradMeter, decode_grad};
use crate::protocol::codec::layer::encode_layer;
use crate::protocol::codec::state::{StateMeter, decode_state, encode_state};
use crate::protocol::pb::{self, BeginStepRequest};
use errors::{Error, Result};
use plan::limits::Limits;
use wire::grpc::Dial;
use wire::status::from_status;

/// Layers sent ahead of the one the engines are computing.
const PREFETCH: usize = 1;

/// A client of the root SwarmX node (or of a single engine: they speak the same service).
pub struct RemoteSwarm {
    handle: Handle,
    root: Child,
    job: String,
    step: u64,
    /// What the plan allows the replies to hold (each layer's gradients, the replicas' state): checked as they
    /// arrive, so even the fabric cannot make MemoryX hold more than the model.
    limits: Arc<Limits>,
}

impl RemoteSwarm {
    /// Connects to the stage at `url` for `job` as `dial` says, on
    /// the runtime of `handle`; replies beyond the job's `limits` are refused. Call it from outside the runtime's
    /// worker threads: the loop blocks on the network.
    pub fn connect(handle: Handle, url: &str, job: &str, dial: Dial<'_>, limits: Limits) -> Result<Self> {
        let root = handle.block_on(connect(url, job, dial))?;
        Ok(RemoteSwarm { handle, root, job: job.to_string(), step: 0, limits: Arc::new(limits) })
    }

    /// A step's batch as it travels.
    fn begin_request(&self, request: &StepRequest) -> BeginStepRequest {
        BeginStepRequest {
            job: self.job.clone(),
            step: request.step,
            samples: request.samples.clone(),
            split: match request.split {
                Split::Train => pb::Split::Train,
                Split::Test => pb::Split::Test,
            } as i32,
            grad_scale: request.grad_scale,
            micro_batch: u32::try_from(request.micro_batch).unwrap_or(u32::MAX),
        }
    }

    /// Runs one pass: sends each stream as its own call, at most `PREFETCH` ahead, and returns the results in
    /// order. On failure the calls still in flight are abandoned.
    fn pass<T: Send + 'static>(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        call: impl Fn(
            pb::stage_client::StageClient<tonic::transport::Channel>,
            Vec<pb::LayerChunk>,
        ) -> JoinHandle<Result<T>>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(layers);
        self.pass_into(layers, next, call, &mut |t| {
            out.push(t);
            Ok(())
        })?;
        Ok(out)
    }

    /// Streams `layers` layers pulled from `next` down the tree, at most [`PREFETCH`] calls ahead, handing each
    /// call's result to `sink` in order as it completes. `sink` runs outside the async runtime (between waits),
    /// so it may block, on a weight server for instance.
    fn pass_into<T: Send + 'static>(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        call: impl Fn(
            pb::stage_client::StageClient<tonic::transport::Channel>,
            Vec<pb::LayerChunk>,
        ) -> JoinHandle<Result<T>>,
        sink: &mut dyn FnMut(T) -> Result<()>,
    ) -> Result<()> {
        let (client, job, step, url) = (self.root.client.clone(), self.job.clone(), self.step, self.root.url.clone());
        let handle = self.handle.clone();
        let mut inflight: VecDeque<JoinHandle<Result<T>>> = VecDeque::new();
        let wait =
            |h: JoinHandle<Result<T>>| handle.block_on(h).map_err(|e| Error::Unavailable(format!("{url}: {e}")))?;
        let result: Result<()> = (|| {
            for _ in 0..layers {
                let stream = next()?;
                let chunks = encode_layer(stream, &job, step);
                inflight.push_back({
                    let _runtime = handle.enter();
                    call(client.clone(), chunks)
                });
                while inflight.len() > PREFETCH {
                    if let Some(h) = inflight.pop_front() {
                        sink(wait(h)?)?;
                    }
                }
            }
            while let Some(h) = inflight.pop_front() {
                sink(wait(h)?)?;
            }
            Ok(())
        })();
        for h in inflight {
            h.abort();
        }
        result
    }
}

impl Swarm for RemoteSwarm {
    fn engines(&self) -> usize {
        self.root.engines as usize
    }

    fn begin_step(&mut self, request: &StepRequest) -> Result<()> {
        self.step = request.step;
        let req = self.begin_request(request);
        let mut client = self.root.client.clone();
        let url = self.root.url.clone();
        self.handle.block_on(async move { client.begin_step(req).await.map(|_| ()).map_err(|s| from_status(s, &url)) })
    }

    fn forward_pass(&mut self, layers: usize, next: StreamSource<'_>) -> Result<LossSum> {
        let url = self.root.url.clone();
        let u = url.clone();
        self.pass(layers, next, move |mut client, chunks| {
            let u = u.clone();
            tokio::spawn(async move {
                client.forward(tokio_stream::iter(chunks)).await.map(|_| ()).map_err(|s| from_status(s, &u))
            })
        })?;
        let mut client = self.root.client.clone();
        let req = pb::LossRequest { job: self.job.clone(), step: self.step };
        let reply = self.handle.block_on(async move { client.loss(req).await.map_err(|s| from_status(s, &url)) })?;
        Ok(reply.into_inner().into())
    }

    fn backward_pass_into(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        sink: &mut dyn FnMut(LayerGrad) -> Result<()>,
    ) -> Result<()> {
        let (url, limits) = (self.root.url.clone(), self.limits.clone());
        self.pass_into(
            layers,
            next,
            move |mut client, chunks| {
                let (u, limits) = (url.clone(), limits.clone());
                tokio::spawn(async move {
                    let mut stream =
                        client.backward(tokio_stream::iter(chunks)).await.map_err(|s| from_status(s, &u))?.into_inner();
                    let mut meter = GradMeter::new(&limits);
                    let mut parts = Vec::new();
                    while let Some(c) = stream.message().await.map_err(|s| from_status(s, &u))? {
                        meter.check(&c, &limits)?;
                        parts.push(c);
                    }
                    decode_grad(parts, &limits)
                })
            },
            sink,
        )
    }

    fn sram_bytes(&self) -> u64 {
        self.root.sram_bytes
    }

    fn holds_replicas(&self) -> bool {
        true
    }

    fn prime(&mut self, state: &[u8]) -> Result<()> {
        let mut client = self.root.client.clone();
        let (chunks, url) = (encode_state(bytes::Bytes::copy_from_slice(state), &self.job), self.root.url.clone());
        self.handle.block_on(async move {
            client.prime(tokio_stream::iter(chunks)).await.map(|_| ()).map_err(|s| from_status(s, &url))
        })
    }

    fn resident_step(&mut self, request: &StepRequest) -> Result<LossSum> {
        self.step = request.step;
        let mut client = self.root.client.clone();
        let begin = Some(self.begin_request(request));
        let req = pb::ResidentStepRequest { job: self.job.clone(), step: request.step, reduce: true, begin };
        let url = self.root.url.clone();
        let loss = self.handle.block_on(async move {
            let mut stream = client.step(req).await.map_err(|s| from_status(s, &url))?.into_inner();
            let mut loss = None;
            while let Some(c) = stream.message().await.map_err(|s| from_status(s, &url))? {
                loss = loss.or(c.loss);
            }
            loss.ok_or_else(|| Error::Protocol(format!("{url}: a step reply without its loss")))
        })?;
        Ok(loss.into())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>> {
        let mut client = self.root.client.clone();
        let (req, url, job) = (pb::SnapshotRequest { job: self.job.clone() }, self.root.url.clone(), self.job.clone());
        let limits = self.limits.clone();
        self.handle.block_on(async move {
            let mut stream = client.snapshot(req).await.map_err(|s| from_status(s, &url))?.into_inner();
            let mut meter = StateMeter::new(&limits);
            let mut chunks = Vec::new();
            while let Some(c) = stream.message().await.map_err(|s| from_status(s, &url))? {
                meter.check(&c, &job)?;
                chunks.push(c);
            }
            decode_state(chunks, &job, &limits)
        })
    }

    fn stats(&mut self) -> Result<Vec<EngineStats>> {
        let mut client = self.root.client.clone();
        let (req, url) = (pb::StatsRequest { job: self.job.clone() }, self.root.url.clone());
        let reply = self.handle.block_on(async move { client.stats(req).await.map_err(|s| from_status(s, &url)) })?;
        Ok(reply.into_inner().engines.iter().map(stats_from_pb).collect())
    }
}
