//! The training loop's view of a SwarmX tree on the network: the [`Swarm`] trait over gRPC. It keeps one
//! layer in flight ahead of the one being computed, so the engines find the next layer already received when
//! they finish the current one, and never more than that. The coordinator drives one stage (the SwarmX root,
//! or a one-engine job's engine); a SwarmX root streaming straight from the weight servers drives its children
//! the same way, each layer encoded once and sent to all of them, their gradients summed as its relay sums them.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::future::{BoxFuture, try_join_all};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::direct::DirectRoot;
use super::relay::{Child, connect, shares};
use super::{StepRequest, StreamSource, Streamer, Swarm};
use crate::engine::role::EngineStats;
use crate::engine::server::stats_from_pb;
use crate::model::loss::LossSum;
use crate::protocol::LayerGrad;
use crate::protocol::codec::grad::{GradMeter, decode_grad};
use crate::protocol::codec::layer::encode_layer;
use crate::protocol::codec::state::{StateMeter, decode_state, encode_state};
use crate::protocol::pb::stage_client::StageClient;
use crate::protocol::pb::{self, BeginStepRequest, LayerChunk};
use crate::protocol::reduce::Pairwise;
use crate::protocol::zero_copy;
use errors::{Error, Result};
use plan::limits::Limits;
use wire::grpc::Dial;
use wire::status::from_status;

/// Layers sent ahead of the one the engines are computing.
const PREFETCH: usize = 1;

/// One stage's call of a layer: its channel, the layer's chunks, and its address for errors.
type LayerCall<T> = Arc<dyn Fn(Channel, Vec<LayerChunk>, String) -> BoxFuture<'static, Result<T>> + Send + Sync>;

/// A client of the stages below: the root SwarmX node (or a single engine: they speak the same service), or a
/// SwarmX root's children, in engine order.
pub struct RemoteSwarm {
    handle: Handle,
    stages: Vec<Child>,
    job: String,
    step: u64,
    /// What the plan allows the replies to hold (each layer's gradients, the replicas' state): checked as they
    /// arrive, so even the fabric cannot make MemoryX hold more than the model.
    limits: Arc<Limits>,
    /// The root's own streaming from the weight servers, once asked for ([`RemoteSwarm::stream_from`]).
    direct: Option<DirectRoot>,
}

impl RemoteSwarm {
    /// Connects to the stage at `url` for `job` as `dial` says, on
    /// the runtime of `handle`; replies beyond the job's `limits` are refused. Call it from outside the runtime's
    /// worker threads: the loop blocks on the network.
    pub fn connect(handle: Handle, url: &str, job: &str, dial: Dial<'_>, limits: Limits) -> Result<Self> {
        Self::connect_all(handle, std::slice::from_ref(&url.to_string()), job, dial, limits)
    }

    /// [`RemoteSwarm::connect`] to several stages side by side (`urls`, in engine order): each layer goes to
    /// all of them and their replies are summed in that order.
    pub fn connect_all(handle: Handle, urls: &[String], job: &str, dial: Dial<'_>, limits: Limits) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::Protocol("a fabric needs at least one stage".into()));
        }
        let stages = handle.block_on(try_join_all(urls.iter().map(|url| connect(url, job, dial))))?;
        Ok(RemoteSwarm { handle, stages, job: job.to_string(), step: 0, limits: Arc::new(limits), direct: None })
    }

    /// Has the root stream every step's layers straight from the weight servers at `servers` (the coordinator's
    /// first) instead of from the caller: MemoryX without a funnel.
    pub fn stream_from(&mut self, servers: Vec<String>) -> Result<()> {
        let root = self.only()?;
        self.direct = Some(DirectRoot::new(self.handle.clone(), &root.url, root.channel.clone(), &self.job, servers));
        Ok(())
    }

    /// The one stage, for the calls of pipelined execution (which the coordinator makes of the root alone).
    fn only(&self) -> Result<&Child> {
        match self.stages.as_slice() {
            [only] => Ok(only),
            _ => Err(Error::Protocol("pipelined execution is driven through the SwarmX root alone".into())),
        }
    }

    /// Runs `call` on every stage at once, with `input(i)` for stage `i`, and returns their answers in order.
    fn on_stages<T, F>(&self, call: impl Fn(StageClient<Channel>, usize) -> F) -> Result<Vec<T>>
    where
        F: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let calls = self.stages.iter().enumerate().map(|(i, stage)| {
            let reply = call(stage.client.clone(), i);
            async move { reply.await.map_err(|s| from_status(s, &stage.url)) }
        });
        self.handle.block_on(try_join_all(calls))
    }

    /// Streams `layers` layers pulled from `next` to every stage, at most [`PREFETCH`] layers ahead, and hands
    /// `sink` each layer's answers, combined over the stages by `combine` (in stage order), as they complete.
    /// `sink` runs outside the async runtime (between waits), so it may block, on a weight server for instance.
    /// On failure the calls still in flight are abandoned.
    fn pass_into<T: Send + 'static>(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        call: LayerCall<T>,
        combine: fn(Vec<T>) -> Result<T>,
        sink: &mut dyn FnMut(T) -> Result<()>,
    ) -> Result<()> {
        let (job, step, handle) = (self.job.clone(), self.step, self.handle.clone());
        let stages: Vec<(Channel, String)> = self.stages.iter().map(|s| (s.channel.clone(), s.url.clone())).collect();
        let first = stages.first().map(|(_, url)| url.clone()).unwrap_or_default();
        let mut inflight: VecDeque<JoinHandle<Result<T>>> = VecDeque::new();
        let wait =
            |h: JoinHandle<Result<T>>| handle.block_on(h).map_err(|e| Error::Unavailable(format!("{first}: {e}")))?;
        let result: Result<()> = (|| {
            for _ in 0..layers {
                let chunks = encode_layer(next()?, &job, step);
                let calls: Vec<_> =
                    stages.iter().map(|(client, url)| call(client.clone(), chunks.clone(), url.clone())).collect();
                drop(chunks);
                inflight.push_back(handle.spawn(async move { combine(try_join_all(calls).await?) }));
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

/// The one answer of a layer's forward calls.
fn acked(_: Vec<()>) -> Result<()> {
    Ok(())
}

/// A layer's gradients summed over the stages, in order, as a SwarmX node sums its children's.
fn summed(grads: Vec<LayerGrad>) -> Result<LayerGrad> {
    Pairwise::of(grads)?.ok_or_else(|| Error::Protocol("no stage answered".into()))
}

impl Swarm for RemoteSwarm {
    fn engines(&self) -> usize {
        self.stages.iter().map(|s| s.engines as usize).sum()
    }

    fn begin_step(&mut self, request: &StepRequest) -> Result<()> {
        self.step = request.step;
        let req = request.to_pb(&self.job);
        let parts = shares(self.stages.iter().map(|s| s.engines), &req.samples);
        self.on_stages(|mut client, i| {
            let samples = parts.get(i).cloned().unwrap_or_default();
            let req = BeginStepRequest { samples, ..req.clone() };
            async move { client.begin_step(req).await }
        })?;
        Ok(())
    }

    fn forward_pass(&mut self, layers: usize, next: StreamSource<'_>) -> Result<LossSum> {
        let call: LayerCall<()> = Arc::new(|channel, chunks, url| {
            Box::pin(async move {
                zero_copy::forward(channel, tokio_stream::iter(chunks)).await.map_err(|s| from_status(s, &url))
            })
        });
        self.pass_into(layers, next, call, acked, &mut |()| Ok(()))?;
        let req = pb::LossRequest { job: self.job.clone(), step: self.step };
        let losses = self.on_stages(|mut client, _| {
            let req = req.clone();
            async move { client.loss(req).await }
        })?;
        Ok(Pairwise::of(losses.into_iter().map(|r| LossSum::from(r.into_inner())))?.unwrap_or_default())
    }

    fn backward_pass_into(
        &mut self,
        layers: usize,
        next: StreamSource<'_>,
        sink: &mut dyn FnMut(LayerGrad) -> Result<()>,
    ) -> Result<()> {
        let limits = self.limits.clone();
        let call: LayerCall<LayerGrad> = Arc::new(move |channel, chunks, url| {
            let limits = limits.clone();
            Box::pin(async move {
                let mut stream =
                    zero_copy::backward(channel, tokio_stream::iter(chunks)).await.map_err(|s| from_status(s, &url))?;
                let mut meter = GradMeter::new(&limits);
                let mut parts = Vec::new();
                while let Some(c) = stream.message().await.map_err(|s| from_status(s, &url))? {
                    meter.check(&c, &limits)?;
                    parts.push(c);
                }
                decode_grad(parts, &limits)
            })
        });
        self.pass_into(layers, next, call, summed, sink)
    }

    fn streamer(&mut self) -> Option<&mut dyn Streamer> {
        self.direct.as_mut().map(|d| d as &mut dyn Streamer)
    }

    fn sram_bytes(&self) -> u64 {
        self.stages.iter().map(|s| s.sram_bytes).min().unwrap_or(0)
    }

    fn holds_replicas(&self) -> bool {
        self.stages.len() == 1
    }

    fn prime(&mut self, state: &[u8]) -> Result<()> {
        let root = self.only()?;
        let mut client = root.client.clone();
        let (chunks, url) = (encode_state(bytes::Bytes::copy_from_slice(state), &self.job), root.url.clone());
        self.handle.block_on(async move {
            client.prime(tokio_stream::iter(chunks)).await.map(|_| ()).map_err(|s| from_status(s, &url))
        })
    }

    fn resident_step(&mut self, request: &StepRequest) -> Result<LossSum> {
        let root = self.only()?;
        let (mut client, url) = (root.client.clone(), root.url.clone());
        let begin = Some(request.to_pb(&self.job));
        let req = pb::ResidentStepRequest { job: self.job.clone(), step: request.step, reduce: true, begin };
        self.step = request.step;
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
        let root = self.only()?;
        let (mut client, url) = (root.client.clone(), root.url.clone());
        let (req, job) = (pb::SnapshotRequest { job: self.job.clone() }, self.job.clone());
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
        let req = pb::StatsRequest { job: self.job.clone() };
        let replies = self.on_stages(|mut client, _| {
            let req = req.clone();
            async move { client.stats(req).await }
        })?;
        Ok(replies.iter().flat_map(|r| r.get_ref().engines.iter().map(stats_from_pb)).collect())
    }
}
