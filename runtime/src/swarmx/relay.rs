//! A SwarmX node on the network. Its children are stages — engines or further SwarmX nodes — so nodes stack
//! into a tree of any fan-out. Down the tree it splits the batch and broadcasts each layer; up the tree it sums
//! gradients and losses, so its parent sees one stage whatever is below.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use futures::future::try_join_all;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::model::loss::LossSum;
use crate::protocol::codec::grad::receive_grads;
use crate::protocol::codec::grad::{GradMeter, decode_grad, decode_grads, encode_grad_owned, encode_grads};
use crate::protocol::codec::layer::LayerMeter;
use crate::protocol::codec::state::StateMeter;
use crate::protocol::codec::step::encode_step;
use crate::protocol::pb::stage_client::StageClient;
use crate::protocol::pb::stage_server::Stage;
use crate::protocol::pb::{
    self, Ack, BeginStepRequest, GradChunk, InfoReply, InfoRequest, LayerChunk, ResidentStepRequest, SnapshotRequest,
    StateChunk, StepChunk,
};
use crate::protocol::reduce::Pairwise;
use crate::protocol::zero_copy;
use data::split_even;
use errors::{Error, Result};
use plan::limits::Limits;
use wire::grpc::JobGuard;
use wire::grpc::{Dial, channel};
use wire::status::{from_status, to_status};

/// Chunks of a layer a SwarmX node holds for each child before it waits for that child to take them: enough to
/// keep the link busy, far less than a layer.
const CUT_THROUGH: usize = 8;

/// One child of a SwarmX node.
#[derive(Clone)]
pub struct Child {
    /// Its address, for error messages.
    pub url: String,
    /// A client that reconnects by itself when the child comes back.
    pub client: StageClient<Channel>,
    /// Its channel, for the other services it serves (a SwarmX root's `Streamer`).
    pub channel: Channel,
    /// Engines below it.
    pub engines: u32,
    /// The smallest SRAM among them.
    pub sram_bytes: u64,
}

/// Connects to a stage at `url` for `job` as `dial` says, and learns its engines. Only `https://` addresses are
/// dialled: a plaintext one would carry the job's weights to whoever listens.
pub async fn connect(url: &str, job: &str, dial: Dial<'_>) -> Result<Child> {
    let channel = channel(url, dial)?;
    let client =
        StageClient::new(channel.clone()).max_decoding_message_size(8 << 20).max_encoding_message_size(8 << 20);
    let timeout = dial.connect;
    let deadline = Instant::now() + timeout;
    loop {
        match client.clone().info(InfoRequest { job: job.to_string() }).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                return Ok(Child {
                    url: url.to_string(),
                    client,
                    channel,
                    engines: reply.engines,
                    sram_bytes: reply.sram_bytes,
                });
            }
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                return Err(Error::Protocol(format!("{url}: {}", s.message())));
            }
            Err(s) if Instant::now() >= deadline => {
                return Err(Error::Unavailable(format!("{url} did not answer within {timeout:?}: {}", s.message())));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Each stage's part of a step's `samples`, for stages over `engines` engines each (in engine order): the batch
/// is split as if over all the engines, and each stage gets its engines' consecutive parts, so the shards do
/// not depend on the shape of the tree.
pub(crate) fn shares(engines: impl Iterator<Item = u32>, samples: &[u32]) -> Vec<Vec<u32>> {
    let engines: Vec<usize> = engines.map(|e| e as usize).collect();
    let parts = split_even(samples, engines.iter().sum());
    let mut next = 0;
    engines
        .iter()
        .map(|&n| {
            let mine = parts.get(next..next + n).map(<[&[u32]]>::concat).unwrap_or_default();
            next += n;
            mine
        })
        .collect()
}

/// The `Stage` service of a SwarmX node.
pub struct Relay {
    job: JobGuard,
    children: Vec<Child>,
    /// What the plan lets one message make this node hold: the batch of the engines below it, each layer's
    /// shape, the model's state. Everything a node receives — from its parent or back from its children — is
    /// metered against it before it is kept.
    limits: Arc<Limits>,
    reduce_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Relay {
    /// A node for `job` over connected `children`, in engine order, refusing anything beyond the job's `limits`.
    pub fn new(job: String, children: Vec<Child>, limits: Limits) -> Self {
        let buckets = prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 16);
        Relay {
            job: JobGuard::new(job, "a SwarmX node"),
            children,
            limits: Arc::new(limits),
            reduce_seconds: prometheus_client::metrics::histogram::Histogram::new(buckets),
        }
    }

    /// Time from a backward layer's first chunk to its children's gradients summed, for `/metrics` (a node of
    /// one child sums nothing: its child's gradient passes up as it comes).
    pub fn reduce_seconds(&self) -> prometheus_client::metrics::histogram::Histogram {
        self.reduce_seconds.clone()
    }

    /// Engines below this node.
    pub fn engines(&self) -> u32 {
        self.children.iter().map(|c| c.engines).sum()
    }

    /// Each child's part of a step's batch. The batch is split as if over all engines below, and each child
    /// gets its engines' consecutive parts, so the shards do not depend on the shape of the tree. A batch larger
    /// than the shards of the engines below is refused before it is copied for any child.
    fn split(&self, r: &BeginStepRequest) -> Result<Vec<BeginStepRequest>, Status> {
        let engines = self.engines() as usize;
        Error::check_limit(
            || format!("the samples of a BeginStep (the shards of the {engines} engines below this SwarmX node)"),
            r.samples.len() as u64,
            self.limits.samples(engines),
        )
        .map_err(to_status)?;
        Ok(shares(self.children.iter().map(|c| c.engines), &r.samples)
            .into_iter()
            .map(|samples| BeginStepRequest { samples, ..r.clone() })
            .collect())
    }

    /// Sends the same chunks to every child through `call`, failing with the first child's error (named).
    async fn broadcast<C, F, Fut, R>(&self, chunks: Vec<C>, call: F) -> Result<(), Status>
    where
        C: Clone,
        F: Fn(StageClient<Channel>, Vec<C>) -> Fut,
        Fut: std::future::Future<Output = Result<R, Status>>,
    {
        let calls = self.children.iter().map(|child| {
            let reply = call(child.client.clone(), chunks.clone());
            async move { reply.await.map_err(|s| Self::child_error(child, s)) }
        });
        try_join_all(calls).await.map(|_| ())
    }

    /// Refuses what a child sent back (a reply beyond the plan, a malformed gradient), naming the child and
    /// keeping the refusal's kind.
    fn child_refused(child: &Child, e: Error) -> Status {
        to_status(match e {
            Error::OverLimit { what, value, limit } => {
                Error::OverLimit { what: format!("{}: {what}", child.url), value, limit }
            }
            e => Error::Protocol(format!("{}: {e}", child.url)),
        })
    }

    /// Passes a child's failure up with the child named, keeping "unavailable" distinguishable.
    fn child_error(child: &Child, s: Status) -> Status {
        to_status(from_status(s, &child.url))
    }

    /// Passes a layer stream on to every child as it arrives: each chunk, metered against the layer's shape, is
    /// sent to all children before the next is read, so a layer crosses the node once rather than being gathered
    /// first, and the node holds at most [`CUT_THROUGH`] chunks per child. `call` makes the call of child `i`
    /// (in the node's order) from its channel and the stream of chunks; the replies come back in child order. A
    /// parent's stream that fails part-way ends the children's streams early (they refuse a truncated layer)
    /// and is the error returned.
    async fn relay_down<R, F, Fut>(&self, mut stream: Streaming<LayerChunk>, call: F) -> Result<Vec<R>, Status>
    where
        F: Fn(usize, Channel, ReceiverStream<LayerChunk>) -> Fut,
        Fut: std::future::Future<Output = Result<R, Status>>,
    {
        let (senders, receivers): (Vec<_>, Vec<_>) = self.children.iter().map(|_| mpsc::channel(CUT_THROUGH)).unzip();
        let calls = try_join_all(
            self.children
                .iter()
                .zip(receivers)
                .enumerate()
                .map(|(i, (child, rx))| call(i, child.channel.clone(), ReceiverStream::new(rx))),
        );
        let feed = async move {
            let mut meter = LayerMeter::default();
            while let Some(c) = stream.message().await? {
                self.job.check(&c.job)?;
                meter.check(&c, self.job.job(), &self.limits).map_err(to_status)?;
                for tx in &senders {
                    if tx.send(c.clone()).await.is_err() {
                        // That child's call has ended: its reply says why.
                        return Ok(());
                    }
                }
            }
            Ok::<(), Status>(())
        };
        let (fed, replies) = futures::join!(feed, calls);
        fed?;
        replies
    }

    /// A backward layer through a node with one child: the child's gradient is the whole sum, so its chunks go
    /// up as they arrive, metered against the plan like any reply, and are neither gathered nor decoded here.
    /// The parent (in the end MemoryX) decodes and checks the gradient as it would a sum.
    async fn pass_up(&self, layer: Streaming<LayerChunk>) -> Result<Response<GradStream>, Status> {
        let mut replies = self
            .relay_down(layer, |i, channel, chunks| async move {
                let child = &self.children[i];
                zero_copy::backward(channel, chunks)
                    .await
                    .map_err(|s| Self::child_error(child, s))
                    .map(|r| (child.clone(), r))
            })
            .await?;
        let (child, stream) = replies.pop().ok_or_else(|| Status::internal("SwarmX node has no children"))?;
        let limits = self.limits.clone();
        let mut meter = GradMeter::new(&limits);
        let relayed = futures::StreamExt::map(stream, move |c| {
            let c = c.map_err(|s| Self::child_error(&child, s))?;
            meter.check(&c, &limits).map_err(|e| Self::child_refused(&child, e))?;
            Ok(c)
        });
        Ok(Response::new(Box::pin(relayed)))
    }

    /// A child's reply stream of gradients, metered against the plan as it arrives (a child is a peer of the
    /// job, but what it sends is bounded like anything else).
    async fn child_grads<T>(
        &self,
        child: &Child,
        mut stream: Streaming<T>,
        mut grad: impl FnMut(&mut T) -> Option<GradChunk>,
        mut rest: impl FnMut(T),
    ) -> Result<Vec<GradChunk>, Status> {
        let mut meter = GradMeter::new(&self.limits);
        let mut chunks = Vec::new();
        while let Some(mut c) = stream.message().await.map_err(|s| Self::child_error(child, s))? {
            if let Some(g) = grad(&mut c) {
                meter.check(&g, &self.limits).map_err(|e| Self::child_refused(child, e))?;
                chunks.push(g);
            }
            rest(c);
        }
        Ok(chunks)
    }
}

type GradStream = Pin<Box<dyn Stream<Item = Result<GradChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Stage for Relay {
    async fn info(&self, request: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        self.job.check(&request.get_ref().job)?;
        let sram_bytes = self.children.iter().map(|c| c.sram_bytes).min().unwrap_or(0);
        Ok(Response::new(InfoReply { job: self.job.job().to_string(), engines: self.engines(), sram_bytes }))
    }

    async fn begin_step(&self, request: Request<BeginStepRequest>) -> Result<Response<Ack>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let calls = self.children.iter().zip(self.split(&r)?).map(|(child, req)| {
            let mut client = child.client.clone();
            async move { client.begin_step(req).await.map_err(|s| Self::child_error(child, s)) }
        });
        try_join_all(calls).await?;
        Ok(Response::new(Ack {}))
    }

    async fn forward(&self, request: Request<Streaming<LayerChunk>>) -> Result<Response<Ack>, Status> {
        self.relay_down(request.into_inner(), |i, channel, chunks| async move {
            zero_copy::forward(channel, chunks).await.map_err(|s| Self::child_error(&self.children[i], s))
        })
        .await?;
        Ok(Response::new(Ack {}))
    }

    async fn loss(&self, request: Request<pb::LossRequest>) -> Result<Response<pb::LossReply>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let calls = self.children.iter().map(|child| {
            let mut client = child.client.clone();
            let r = r.clone();
            async move { client.loss(r).await.map_err(|s| Self::child_error(child, s)) }
        });
        let replies = try_join_all(calls).await?.into_iter().map(|r| LossSum::from(r.into_inner()));
        let total = Pairwise::of(replies).map_err(to_status)?.unwrap_or_default();
        Ok(Response::new(total.into()))
    }

    type BackwardStream = GradStream;

    async fn backward(&self, request: Request<Streaming<LayerChunk>>) -> Result<Response<GradStream>, Status> {
        if let [_] = self.children.as_slice() {
            return self.pass_up(request.into_inner()).await;
        }
        let started = std::time::Instant::now();
        let grads = self
            .relay_down(request.into_inner(), |i, channel, chunks| async move {
                let child = &self.children[i];
                let stream = zero_copy::backward(channel, chunks).await.map_err(|s| Self::child_error(child, s))?;
                let parts = self.child_grads(child, stream, |c| Some(std::mem::take(c)), |_| ()).await?;
                decode_grad(parts, &self.limits).map_err(|e| Self::child_refused(child, e))
            })
            .await?;
        let sum =
            Pairwise::of(grads).map_err(to_status)?.ok_or_else(|| Status::internal("SwarmX node has no children"))?;
        self.reduce_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Response::new(Box::pin(tokio_stream::iter(encode_grad_owned(sum).into_iter().map(Ok)))))
    }

    async fn stats(&self, request: Request<pb::StatsRequest>) -> Result<Response<pb::StatsReply>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let calls = self.children.iter().map(|child| {
            let mut client = child.client.clone();
            let r = r.clone();
            async move { client.stats(r).await.map_err(|s| Self::child_error(child, s)) }
        });
        let engines = try_join_all(calls).await?.into_iter().flat_map(|r| r.into_inner().engines).collect();
        Ok(Response::new(pb::StatsReply { engines }))
    }

    async fn prime(&self, request: Request<Streaming<StateChunk>>) -> Result<Response<Ack>, Status> {
        let mut stream = request.into_inner();
        let mut meter = StateMeter::new(&self.limits);
        let mut chunks = Vec::new();
        while let Some(c) = stream.message().await? {
            self.job.check(&c.job)?;
            meter.check(&c, self.job.job()).map_err(to_status)?;
            chunks.push(c);
        }
        self.broadcast(chunks, |mut c, ch| async move { c.prime(tokio_stream::iter(ch)).await }).await?;
        Ok(Response::new(Ack {}))
    }

    type SnapshotStream = StateStream;

    async fn snapshot(&self, request: Request<SnapshotRequest>) -> Result<Response<StateStream>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        // Any replica will do: they are equal. A child that has none (a replacement engine) is passed over.
        let mut last = Status::failed_precondition("SwarmX node has no children");
        for child in &self.children {
            let mut client = child.client.clone();
            let got = async {
                let mut stream = client.snapshot(r.clone()).await?.into_inner();
                let mut meter = StateMeter::new(&self.limits);
                let mut chunks = Vec::new();
                while let Some(c) = stream.message().await? {
                    meter.check(&c, self.job.job()).map_err(to_status)?;
                    chunks.push(c);
                }
                Ok::<_, Status>(chunks)
            }
            .await;
            match got {
                Ok(chunks) => return Ok(Response::new(Box::pin(tokio_stream::iter(chunks.into_iter().map(Ok))))),
                Err(s) => last = Self::child_error(child, s),
            }
        }
        Err(last)
    }

    type StepStream = StepChunkStream;

    async fn step(&self, request: Request<ResidentStepRequest>) -> Result<Response<StepChunkStream>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        if let [child] = self.children.as_slice() {
            // One child's sum is the whole sum: it can reduce (and apply) itself, and nothing needs to pass here.
            let mut client = child.client.clone();
            let reply = client.step(r).await.map_err(|s| Self::child_error(child, s))?.into_inner();
            let url = child.url.clone();
            let relayed = futures::StreamExt::map(reply, move |c| c.map_err(|s| to_status(from_status(s, &url))));
            return Ok(Response::new(Box::pin(relayed)));
        }
        let begins: Vec<Option<BeginStepRequest>> = match &r.begin {
            Some(b) => {
                self.job.check(&b.job)?;
                self.split(b)?.into_iter().map(Some).collect()
            }
            None => vec![None; self.children.len()],
        };
        let calls = self.children.iter().zip(begins).map(|(child, begin)| {
            let mut client = child.client.clone();
            let below = ResidentStepRequest { reduce: false, begin, ..r.clone() };
            async move {
                let stream = client.step(below).await.map_err(|s| Self::child_error(child, s))?.into_inner();
                let mut loss = None;
                let grads = self
                    .child_grads(child, stream, |c: &mut StepChunk| c.grad.take(), |c| loss = loss.or(c.loss))
                    .await?;
                let loss = loss
                    .ok_or_else(|| Status::invalid_argument(format!("{}: a step reply without its loss", child.url)))?;
                let grads = decode_grads(grads, &self.limits).map_err(|e| Self::child_refused(child, e))?;
                Ok::<_, Status>((loss, grads))
            }
        });
        let started = Instant::now();
        let (mut total, mut sum) = (Pairwise::default(), Pairwise::default());
        for (loss, grads) in try_join_all(calls).await? {
            total.push(LossSum::from(loss)).map_err(to_status)?;
            sum.push(grads).map_err(to_status)?;
        }
        let loss: pb::LossReply = total.finish().map_err(to_status)?.unwrap_or_default().into();
        let sum = sum.finish().map_err(to_status)?.unwrap_or_default();
        if !r.reduce {
            return Ok(Response::new(Box::pin(tokio_stream::iter(encode_step(loss, sum).into_iter().map(Ok)))));
        }
        // The top of the tree: every engine below applies the same sum, so the replicas stay equal.
        let mut chunks = encode_grads(sum);
        if let Some(first) = chunks.first_mut() {
            first.job = r.job.clone();
            first.step = r.step;
        }
        self.broadcast(chunks, |mut c, ch| async move { c.apply(tokio_stream::iter(ch)).await }).await?;
        self.reduce_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Response::new(Box::pin(tokio_stream::iter(encode_step(loss, Vec::new()).into_iter().map(Ok)))))
    }

    async fn apply(&self, request: Request<Streaming<GradChunk>>) -> Result<Response<Ack>, Status> {
        let chunks = receive_grads(request.into_inner(), self.job.job(), &self.limits).await?;
        self.broadcast(chunks, |mut c, ch| async move { c.apply(tokio_stream::iter(ch)).await }).await?;
        Ok(Response::new(Ack {}))
    }
}

type StateStream = Pin<Box<dyn Stream<Item = Result<StateChunk, Status>> + Send>>;
type StepChunkStream = Pin<Box<dyn Stream<Item = Result<StepChunk, Status>> + Send>>;
