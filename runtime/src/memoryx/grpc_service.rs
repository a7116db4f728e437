//! The `Weights` gRPC service of a weight server: its [`LocalSlice`] behind mutual TLS (the coordinator's too, when
//! the SwarmX root streams straight from the servers, and then with the masks it chose). Every request must name
//! the server's job; every tensor that arrives is metered against the slice's lengths (which the server derives
//! from the job it loaded, never from the sender) before it is kept.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::slice::{LayerLengths, LayerTensors};
use super::weight_server::{LocalSlice, WeightServer};
use crate::protocol::codec::chunk::{CHUNK_BYTES, Recycled, extend_words, pieces};
use crate::protocol::codec::layer::encode_layer;
use crate::protocol::pb::weights_server::Weights;
use crate::protocol::pb::{Ack, LayerChunk, TensorChunk, WeightsInfo, WeightsRequest};
use crate::protocol::{LayerStream, Pass, WeightPayload};
use errors::{Error, Result};
use kernels::sparse::SparsePattern;
use wire::grpc::JobGuard;
use wire::status::to_status;

type ChunkStream = Pin<Box<dyn Stream<Item = Result<TensorChunk, Status>> + Send>>;
type LayerChunks = Pin<Box<dyn Stream<Item = Result<LayerChunk, Status>> + Send>>;

/// Tensor `k` of a layer as chunks carrying `pieces` of its bytes, or one empty chunk when the tensor is empty
/// (`empty`), so an empty one is seen too: the one framing [`chunks`] and [`copied_chunks`] share.
fn tagged<'a>(
    job: &'a str,
    layer: usize,
    step: u64,
    k: usize,
    empty: bool,
    pieces: impl Iterator<Item = bytes::Bytes> + 'a,
) -> impl Iterator<Item = TensorChunk> + 'a {
    let chunk = move |data| TensorChunk { job: job.to_string(), layer: layer as u64, step, tensor: k as u32, data };
    empty.then(bytes::Bytes::new).into_iter().chain(pieces).map(chunk)
}

/// The chunks of `tensors`, each cut to at most [`CHUNK_BYTES`] as slices of the tensor's own buffer (no copy),
/// which goes back to [`Recycled::layers`] once sent; every tensor sends at least one chunk, so an empty one is
/// seen too.
pub(super) fn chunks(
    job: &str,
    layer: usize,
    step: u64,
    tensors: impl IntoIterator<Item = Vec<f32>>,
) -> Vec<TensorChunk> {
    let mut out = Vec::new();
    for (k, t) in tensors.into_iter().enumerate() {
        out.extend(tagged(job, layer, step, k, t.is_empty(), pieces(Recycled::layers().bytes(t))));
    }
    out
}

/// The same chunks as [`chunks`] of tensors the caller keeps: each piece copied as it is taken, so a sender that
/// takes them as it sends holds a few pieces at once, never a copy of the whole tensor (the coordinator scatters
/// a layer's gradient to its servers from the one buffer it arrived in).
pub(super) fn copied_chunks<'a>(
    job: &'a str,
    layer: usize,
    step: u64,
    tensors: [&'a [f32]; 2],
) -> impl Iterator<Item = TensorChunk> + 'a {
    tensors.into_iter().enumerate().flat_map(move |(k, t)| {
        let bytes: &[u8] = bytemuck::cast_slice(t);
        tagged(job, layer, step, k, bytes.is_empty(), bytes.chunks(CHUNK_BYTES).map(bytes::Bytes::copy_from_slice))
    })
}

/// Puts the first `count` tensors of a layer back together from its chunks, refusing another job's, a chunk
/// of another layer or step, and any tensor that grows past `lengths` (the slice's, from the plan) before it is
/// kept; each must end exactly at its length. Returns the layer, the step and the tensors.
pub(super) struct Assembler<'a> {
    job: &'a str,
    count: usize,
    lengths: &'a [LayerLengths],
    head: Option<(usize, u64, LayerLengths)>,
    tensors: LayerTensors,
}

impl<'a> Assembler<'a> {
    /// Expects `count` tensors of a layer of job `job`, whose slices have `lengths` (per layer).
    pub(super) fn new(job: &'a str, count: usize, lengths: &'a [LayerLengths]) -> Self {
        Assembler { job, count, lengths, head: None, tensors: Default::default() }
    }

    /// Takes one chunk.
    pub(super) fn push(&mut self, c: TensorChunk) -> Result<()> {
        let layer = usize::try_from(c.layer).unwrap_or(usize::MAX);
        let (at, step, want) = match self.head {
            Some(h) => h,
            None => {
                if c.job != self.job {
                    return Err(Error::Protocol(format!(
                        "tensors of job '{}' reached a weight server of job '{}'",
                        c.job, self.job
                    )));
                }
                let want = self.lengths.get(layer).copied().ok_or_else(|| {
                    Error::Protocol(format!("tensors for layer {layer}, which the model does not have"))
                })?;
                *self.head.insert((layer, c.step, want))
            }
        };
        if layer != at || c.step != step {
            return Err(Error::Protocol(format!(
                "a stream of layer {at}, step {step} carried a chunk of layer {layer}, step {}",
                c.step
            )));
        }
        let k = c.tensor as usize;
        if k >= self.count {
            return Err(Error::Protocol(format!("tensor {k} of a stream of {} tensors", self.count)));
        }
        if !c.data.len().is_multiple_of(4) {
            return Err(Error::Protocol(format!("a chunk of {} bytes is not whole 4-byte values", c.data.len())));
        }
        let have = self.tensors[k].len() + c.data.len() / 4;
        Error::check_limit(|| format!("tensor {k} of layer {layer}'s slice (values)"), have as u64, want[k] as u64)?;
        if self.tensors[k].capacity() == 0 {
            self.tensors[k] = Recycled::layers().take(want[k]);
        }
        extend_words(&mut self.tensors[k], &c.data, "a tensor chunk")
    }

    /// The layer, its step and its tensors, once every tensor is complete.
    pub(super) fn finish(self) -> Result<(usize, u64, LayerTensors)> {
        let (layer, step, want) = self.head.ok_or_else(|| Error::Protocol("an empty tensor stream".into()))?;
        for (k, (got, want)) in self.tensors.iter().zip(&want).take(self.count).enumerate() {
            if got.len() != *want {
                return Err(Error::Protocol(format!(
                    "tensor {k} of layer {layer}'s slice ended after {} values; {want} expected",
                    got.len()
                )));
            }
        }
        Ok((layer, step, self.tensors))
    }
}

/// Puts a layer's weights and bias, as a server streams them for a fetch, straight into the caller's buffers
/// (the coordinator's whole layer, at this slice's place) instead of a buffer of its own that would be copied
/// again: the same checks as [`Assembler`] (the job, the layer and step asked for, nothing past a buffer's end,
/// each buffer filled exactly).
pub(super) struct Filler<'a> {
    job: &'a str,
    layer: u64,
    step: u64,
    into: [&'a mut [f32]; 2],
    filled: [usize; 2],
}

impl<'a> Filler<'a> {
    /// Expects layer `layer` at step `step` of job `job`, its weights into `weights` and bias into `bias`.
    pub(super) fn new(job: &'a str, layer: usize, step: u64, weights: &'a mut [f32], bias: &'a mut [f32]) -> Self {
        Filler { job, layer: layer as u64, step, into: [weights, bias], filled: [0; 2] }
    }

    /// Takes one chunk.
    pub(super) fn push(&mut self, c: TensorChunk) -> Result<()> {
        if c.job != self.job {
            return Err(Error::Protocol(format!(
                "tensors of job '{}' reached a coordinator of job '{}'",
                c.job, self.job
            )));
        }
        if (c.layer, c.step) != (self.layer, self.step) {
            return Err(Error::Protocol(format!(
                "a fetch of layer {}, step {} carried a chunk of layer {}, step {}",
                self.layer, self.step, c.layer, c.step
            )));
        }
        let k = c.tensor as usize;
        let (Some(into), Some(filled)) = (self.into.get_mut(k), self.filled.get_mut(k)) else {
            return Err(Error::Protocol(format!("tensor {k} of a fetch, which carries weights and bias only")));
        };
        if !c.data.len().is_multiple_of(4) {
            return Err(Error::Protocol(format!("a chunk of {} bytes is not whole 4-byte values", c.data.len())));
        }
        let end = *filled + c.data.len() / 4;
        Error::check_limit(
            || format!("tensor {k} of layer {}'s slice (values)", self.layer),
            end as u64,
            into.len() as u64,
        )?;
        bytemuck::cast_slice_mut::<f32, u8>(&mut into[*filled..end]).copy_from_slice(&c.data);
        *filled = end;
        Ok(())
    }

    /// Succeeds once both buffers are full.
    pub(super) fn finish(self) -> Result<()> {
        for (k, (into, filled)) in self.into.iter().zip(self.filled).enumerate() {
            if filled != into.len() {
                return Err(Error::Protocol(format!(
                    "tensor {k} of layer {}'s slice ended after {filled} values; {} expected",
                    self.layer,
                    into.len()
                )));
            }
        }
        Ok(())
    }
}

/// The `Weights` service of one weight server.
pub struct WeightsService {
    job: JobGuard,
    shard: Arc<LocalSlice>,
    lengths: Vec<LayerLengths>,
    /// Each layer's mask by output row (`None`: dense or tied), on the coordinator only.
    masks: Option<Vec<Option<Arc<SparsePattern>>>>,
}

impl WeightsService {
    /// Serves `shard` (whose slice lengths are `lengths`) for `job`.
    pub fn new(job: String, shard: Arc<LocalSlice>, lengths: Vec<LayerLengths>) -> WeightsService {
        WeightsService { job: JobGuard::new(job, "a weight server"), shard, lengths, masks: None }
    }

    /// The coordinator's service: it also answers `Mask` with the `masks` it chose, one per layer.
    pub fn with_masks(self, masks: Vec<Option<Arc<SparsePattern>>>) -> WeightsService {
        WeightsService { masks: Some(masks), ..self }
    }

    /// Runs blocking work (the optimizer, the disk tier, a checkpoint) off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&LocalSlice) -> Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let shard = self.shard.clone();
        tokio::task::spawn_blocking(move || f(&shard))
            .await
            .map_err(|e| Status::internal(format!("a weight server task failed: {e}")))?
            .map_err(to_status)
    }

    async fn receive(
        &self,
        mut stream: Streaming<TensorChunk>,
        count: usize,
    ) -> Result<(usize, u64, LayerTensors), Status> {
        let mut a = Assembler::new(self.job.job(), count, &self.lengths);
        while let Some(c) = stream.message().await? {
            a.push(c).map_err(to_status)?;
        }
        a.finish().map_err(to_status)
    }

    fn send(&self, layer: usize, step: u64, tensors: impl IntoIterator<Item = Vec<f32>>) -> Response<ChunkStream> {
        let items: Vec<Result<TensorChunk, Status>> =
            chunks(self.job.job(), layer, step, tensors).into_iter().map(Ok).collect();
        Response::new(Box::pin(futures::stream::iter(items)))
    }
}

fn layer_of(r: &WeightsRequest) -> usize {
    usize::try_from(r.layer).unwrap_or(usize::MAX)
}

#[tonic::async_trait]
impl Weights for WeightsService {
    async fn hello(&self, request: Request<WeightsRequest>) -> Result<Response<WeightsInfo>, Status> {
        self.job.check(&request.get_ref().job)?;
        let slice = self.shard.slice();
        let step = self.shard.step().map_err(to_status)?;
        let usage = self.shard.usage().map_err(to_status)?;
        let usage = serde_json::to_string(&usage).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(WeightsInfo { index: slice.index, count: slice.count, step, usage }))
    }

    type FetchStream = ChunkStream;

    async fn fetch(&self, request: Request<WeightsRequest>) -> Result<Response<ChunkStream>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let (layer, step) = (layer_of(&r), r.step);
        let (w, b) = self.blocking(move |s| s.fetch(layer, step)).await?;
        Ok(self.send(layer, step, [w, b]))
    }

    async fn update(&self, request: Request<Streaming<TensorChunk>>) -> Result<Response<Ack>, Status> {
        let (layer, step, t) = self.receive(request.into_inner(), 2).await?;
        let [w, b, ..] = t;
        self.blocking(move |s| s.update(layer, step, &w, &b).map(|()| Recycled::layers().give(w))).await?;
        Ok(Response::new(Ack {}))
    }

    async fn stage(&self, request: Request<Streaming<TensorChunk>>) -> Result<Response<Ack>, Status> {
        let (layer, step, t) = self.receive(request.into_inner(), 2).await?;
        let [w, b, ..] = t;
        self.blocking(move |s| s.stage_owned(layer, step, w, b)).await?;
        Ok(Response::new(Ack {}))
    }

    async fn commit(&self, request: Request<WeightsRequest>) -> Result<Response<Ack>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        self.blocking(move |s| s.commit(r.step)).await?;
        Ok(Response::new(Ack {}))
    }

    type TensorsStream = ChunkStream;

    async fn tensors(&self, request: Request<WeightsRequest>) -> Result<Response<ChunkStream>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let layer = layer_of(&r);
        let (step, t) = self.blocking(move |s| s.tensors(layer)).await?;
        Ok(self.send(layer, step, t))
    }

    async fn put(&self, request: Request<Streaming<TensorChunk>>) -> Result<Response<Ack>, Status> {
        let (layer, step, t) = self.receive(request.into_inner(), 6).await?;
        self.blocking(move |s| s.put(layer, step, t)).await?;
        Ok(Response::new(Ack {}))
    }

    type MaskStream = LayerChunks;

    async fn mask(&self, request: Request<WeightsRequest>) -> Result<Response<LayerChunks>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        let masks = self.masks.as_ref().ok_or_else(|| {
            Status::failed_precondition("only the coordinator (weight server 0) holds the masks: ask it")
        })?;
        let layer = layer_of(&r);
        let mask = masks.get(layer).ok_or_else(|| {
            to_status(Error::Protocol(format!("a mask of layer {layer} asked; the model has {}", masks.len())))
        })?;
        let weights = mask.clone().map_or(WeightPayload::Nothing, WeightPayload::Mask);
        let stream = LayerStream { layer, pass: Pass::Forward, weights, bias: Vec::new() };
        let items: Vec<Result<LayerChunk, Status>> =
            encode_layer(stream, self.job.job(), 0).into_iter().map(Ok).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }
}

/// The `Weights` service of `service` for the network: each message is a chunk of at most 1 MiB.
pub fn weights_service(
    service: Arc<WeightsService>,
) -> crate::protocol::pb::weights_server::WeightsServer<WeightsService> {
    crate::protocol::pb::weights_server::WeightsServer::from_arc(service)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> [Vec<f32>; 2] {
        [(0..600_000).map(|i| i as f32 * 0.5).collect(), vec![1.0, -2.0, 3.0]]
    }

    #[test]
    fn copied_chunks_are_the_chunks_of_the_same_tensors() {
        let [w, b] = layer();
        let whole = chunks("job", 3, 7, [w.clone(), b.clone()]);
        let copied: Vec<_> = copied_chunks("job", 3, 7, [&w, &b]).collect();
        assert_eq!(copied, whole);
        let empty: Vec<_> = copied_chunks("job", 3, 7, [&w, &[]]).collect();
        assert_eq!(
            empty.last().map(|c| (c.tensor, c.data.len())),
            Some((1, 0)),
            "an empty tensor sends one empty chunk"
        );
    }

    #[test]
    fn chunks_are_cut_from_the_tensors_and_filled_back_in_place() {
        let [w, b] = layer();
        let sent = chunks("job", 3, 7, [w.clone(), b.clone(), Vec::new()]);
        assert!(sent.len() >= 4, "600,000 weights take more than one chunk, and an empty tensor sends one");
        assert!(sent.iter().any(|c| c.tensor == 2 && c.data.is_empty()));
        let (mut gw, mut gb) = (vec![0.0; w.len()], vec![0.0; b.len()]);
        let mut filler = Filler::new("job", 3, 7, &mut gw, &mut gb);
        for c in sent.into_iter().filter(|c| c.tensor < 2) {
            filler.push(c).unwrap();
        }
        filler.finish().unwrap();
        assert_eq!((gw, gb), (w, b));
    }

    #[test]
    fn a_filler_refuses_another_job_layer_or_step_and_any_overflow_or_shortfall() {
        let [w, b] = layer();
        let good = || chunks("job", 3, 7, [w.clone(), b.clone()]);
        let (mut gw, mut gb) = (vec![0.0; w.len()], vec![0.0; b.len()]);
        for (job, layer, step) in [("other", 3, 7), ("job", 4, 7), ("job", 3, 8)] {
            let c = chunks(job, layer, step, [w.clone()]).remove(0);
            assert!(Filler::new("job", 3, 7, &mut gw, &mut gb).push(c).is_err(), "{job} {layer} {step}");
        }
        // Room for one value fewer than sent: refused before anything is written past it.
        let mut short = vec![0.0; b.len() - 1];
        let mut filler = Filler::new("job", 3, 7, &mut gw, &mut short);
        let over = good().into_iter().find(|c| c.tensor == 1).unwrap();
        assert!(matches!(filler.push(over), Err(Error::OverLimit { .. })));
        // A stream that stops early leaves a buffer unfilled: refused.
        let mut filler = Filler::new("job", 3, 7, &mut gw, &mut gb);
        filler.push(good().remove(0)).unwrap();
        assert!(filler.finish().is_err());
        // A third tensor, or bytes that are not whole values.
        let mut filler = Filler::new("job", 3, 7, &mut gw, &mut gb);
        let mut third = good().remove(0);
        third.tensor = 2;
        assert!(filler.push(third).is_err());
        let mut ragged = good().remove(0);
        ragged.data = ragged.data.slice(0..5);
        assert!(filler.push(ragged).is_err());
    }
}
