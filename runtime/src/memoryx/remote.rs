//! A weight server on the network, as the coordinator drives it: each [`WeightServer`] call is one `Weights`
//! gRPC call over mutual TLS, bounded by the call timeout, with every tensor that comes back metered against the
//! slice's lengths (which the coordinator derives from the plan) before it is kept.

use std::sync::Arc;

use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::grpc_service::{Assembler, Filler, chunks, copied_chunks};
use super::slice::{LayerLengths, LayerTensors, SliceId};
use super::weight_server::{ServerUsage, WeightServer, check_room};
use crate::protocol::WeightPayload;
use crate::protocol::codec::layer::LayerAssembler;
use crate::protocol::pb::weights_client::WeightsClient;
use crate::protocol::pb::{TensorChunk, WeightsRequest};
use errors::{Error, Result};
use kernels::sparse::SparsePattern;
use plan::limits::Limits;
use wire::grpc::{Dial, channel};
use wire::status::from_status;

/// Chunks a call to a weight server is fed ahead of what it has sent ([`RemoteServer::send`]).
const IN_FLIGHT: usize = 4;

/// Weight server `slice` at `url`.
pub struct RemoteServer {
    handle: tokio::runtime::Handle,
    url: String,
    job: String,
    slice: SliceId,
    /// Its slice's lengths, per layer.
    lengths: Vec<LayerLengths>,
    client: WeightsClient<Channel>,
}

impl RemoteServer {
    /// The server holding `slice` of a model whose whole layers have `lengths`, at `url`, for `job`. Dialled
    /// lazily; its calls block, so make them outside the async runtime of `handle`.
    pub fn new(
        handle: tokio::runtime::Handle,
        url: &str,
        job: &str,
        slice: SliceId,
        lengths: &[LayerLengths],
        dial: Dial<'_>,
    ) -> Result<Self> {
        let _runtime = handle.enter();
        let client = WeightsClient::new(channel(url, dial)?)
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20);
        Ok(RemoteServer {
            handle,
            url: url.to_string(),
            job: job.to_string(),
            slice,
            lengths: slice.lengths(lengths),
            client,
        })
    }

    fn request(&self, layer: usize, step: u64) -> WeightsRequest {
        WeightsRequest { job: self.job.clone(), layer: layer as u64, step }
    }

    /// Asks the server who it is and what step it holds, checking it is the server this client is for.
    fn hello(&self) -> Result<crate::protocol::pb::WeightsInfo> {
        let mut client = self.client.clone();
        let info = self.handle.block_on(client.hello(self.request(0, 0))).map_err(|s| self.failed(s))?.into_inner();
        if (info.index, info.count) != (self.slice.index, self.slice.count) {
            return Err(Error::Protocol(format!(
                "{} answered as weight server {} of {}: the servers' addresses are out of order",
                self.url, info.index, info.count
            )));
        }
        if info.usage.len() > 64 << 10 {
            return Err(Error::Protocol(format!("{}: an oversized usage report", self.url)));
        }
        Ok(info)
    }

    /// Layer `layer`'s mask by output row (`None`: dense or tied), as the coordinator chose it: asked of server
    /// 0 by a SwarmX root that streams straight from the servers. Metered against `limits` (the layer's shape in
    /// the plan) as it arrives, and refused unless it is that layer's.
    pub fn mask(&self, layer: usize, limits: &Limits) -> Result<Option<SparsePattern>> {
        let mut client = self.client.clone();
        let (_, stream) = self.handle.block_on(async {
            let mut stream = client.mask(self.request(layer, 0)).await.map_err(|s| self.failed(s))?.into_inner();
            let mut assembler = LayerAssembler::default();
            while let Some(c) = stream.message().await.map_err(|s| self.failed(s))? {
                assembler.push(c, &self.job, limits)?;
            }
            assembler.finish()
        })?;
        if stream.layer != layer {
            return Err(Error::Protocol(format!("{}: layer {}'s mask sent for layer {layer}", self.url, stream.layer)));
        }
        match stream.weights {
            WeightPayload::Mask(pattern) => Ok(Some(Arc::unwrap_or_clone(pattern))),
            WeightPayload::Nothing => Ok(None),
            _ => Err(Error::Protocol(format!("{}: layer {layer}'s mask came with values", self.url))),
        }
    }

    fn failed(&self, s: tonic::Status) -> Error {
        from_status(s, &format!("{} at {}", self.slice, self.url))
    }

    /// Receives a stream of `count` tensors of a layer.
    fn receive(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<tonic::Streaming<TensorChunk>>, tonic::Status>>,
        count: usize,
    ) -> Result<(usize, u64, LayerTensors)> {
        self.handle.block_on(async {
            let mut stream = call.await.map_err(|s| self.failed(s))?.into_inner();
            let mut a = Assembler::new(&self.job, count, &self.lengths);
            while let Some(c) = stream.message().await.map_err(|s| self.failed(s))? {
                a.push(c)?;
            }
            a.finish()
        })
    }

    /// Sends a layer's `chunks` as a client stream to `call`, taken as the call takes them, at most
    /// [`IN_FLIGHT`] ahead: for a gradient's slices ([`copied_chunks`]) the coordinator scattering a layer to its
    /// servers at once holds a few megabytes per server beside the layer, not a copy of it.
    fn send<F, Fut>(&self, chunks: impl Iterator<Item = TensorChunk>, call: F) -> Result<()>
    where
        F: FnOnce(WeightsClient<Channel>, ReceiverStream<TensorChunk>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<crate::protocol::pb::Ack>, tonic::Status>>,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
        let feed = async move {
            for c in chunks {
                if tx.send(c).await.is_err() {
                    return; // The call ended early; its answer says why.
                }
            }
        };
        let (_, answer) =
            self.handle.block_on(async { tokio::join!(feed, call(self.client.clone(), ReceiverStream::new(rx))) });
        answer.map(|_| ()).map_err(|s| self.failed(s))
    }
}

impl WeightServer for RemoteServer {
    fn slice(&self) -> SliceId {
        self.slice
    }

    fn fetch(&self, layer: usize, step: u64) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut client = self.client.clone();
        let (_, _, t) = self.receive(client.fetch(self.request(layer, step)), 2)?;
        let [w, b, ..] = t;
        Ok((w, b))
    }

    fn fetch_into(&self, layer: usize, step: u64, weights: &mut [f32], bias: &mut [f32]) -> Result<()> {
        let want = self.lengths.get(layer).ok_or_else(|| Error::Protocol(format!("no layer {layer}")))?;
        check_room(self.slice, layer, (want[0], want[1]), weights, bias)?;
        let mut client = self.client.clone();
        self.handle.block_on(async {
            let mut stream = client.fetch(self.request(layer, step)).await.map_err(|s| self.failed(s))?.into_inner();
            let mut filler = Filler::new(&self.job, layer, step, weights, bias);
            while let Some(c) = stream.message().await.map_err(|s| self.failed(s))? {
                filler.push(c)?;
            }
            filler.finish()
        })
    }

    fn update(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()> {
        self.send(copied_chunks(&self.job, layer, step, [weights, bias]), |mut c, s| async move { c.update(s).await })
    }

    fn stage(&self, layer: usize, step: u64, weights: &[f32], bias: &[f32]) -> Result<()> {
        self.send(copied_chunks(&self.job, layer, step, [weights, bias]), |mut c, s| async move { c.stage(s).await })
    }

    fn commit(&self, step: u64) -> Result<()> {
        let mut client = self.client.clone();
        self.handle.block_on(client.commit(self.request(0, step))).map_err(|s| self.failed(s))?;
        Ok(())
    }

    fn step(&self) -> Result<u64> {
        Ok(self.hello()?.step)
    }

    fn usage(&self) -> Result<ServerUsage> {
        let info = self.hello()?;
        serde_json::from_str(&info.usage)
            .map_err(|e| Error::Protocol(format!("{}: its usage is unreadable: {e}", self.url)))
    }

    fn tensors(&self, layer: usize) -> Result<(u64, LayerTensors)> {
        let mut client = self.client.clone();
        let (_, step, t) = self.receive(client.tensors(self.request(layer, 0)), 6)?;
        Ok((step, t))
    }

    fn put(&self, layer: usize, step: u64, tensors: LayerTensors) -> Result<()> {
        self.send(chunks(&self.job, layer, step, tensors).into_iter(), |mut c, s| async move { c.put(s).await })
    }
}
