//! A `Stage` service whose layer calls skip tonic's codec on both sides: `Forward` and `Backward` read their
//! chunks straight from the request's HTTP/2 frames ([`Messages`]), and `Backward`'s gradient chunks are
//! answered from their own buffers ([`pieces`]). Every other method is the generated service's.
//!
//! A client cannot tell the two apart: the same messages, limits, statuses and trailers.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use wire::status::to_status;

use crate::protocol::LayerStream;
use crate::protocol::codec::layer::LayerAssembler;
use crate::protocol::frames::Messages;
use crate::protocol::pb::stage_server::{Stage, StageServer};
use crate::protocol::pb::{Ack, GradChunk, LayerChunk};
use crate::protocol::zero_copy::{BACKWARD, FORWARD, Payloads, pieces};
use plan::limits::Limits;

/// The chunks of a layer call, as a stage reads them: from tonic's `Streaming` or from the frames.
pub type Chunks = Pin<Box<dyn Stream<Item = Result<LayerChunk, Status>> + Send>>;

/// A stage whose layer calls take their chunks from any [`Chunks`]: its `Stage::forward` and `Stage::backward`
/// are these over tonic's stream.
pub trait LayerCalls: Stage {
    /// A `Forward` call's layer, taken whole.
    fn forward_layer(&self, chunks: Chunks) -> impl Future<Output = Result<(), Status>> + Send;
    /// A `Backward` call's layer: its gradient, in chunks.
    fn backward_layer(&self, chunks: Chunks) -> impl Future<Output = Result<Vec<GradChunk>, Status>> + Send;
}

/// The layer `chunks` carry, put together by `asm`: every chunk checked against `job` and `limits` before it is
/// kept (what an engine, or a sink that stands for one, does with a layer call).
pub async fn assemble(
    mut chunks: Chunks,
    mut asm: LayerAssembler,
    job: &str,
    limits: &Limits,
) -> Result<(u64, LayerStream), Status> {
    while let Some(chunk) = chunks.next().await {
        asm.push(chunk?, job, limits).map_err(to_status)?;
    }
    asm.finish().map_err(to_status)
}

/// The chunks of a request body, read from its frames, each message at most `max` bytes.
fn chunks_of(body: Body, max: usize) -> Chunks {
    Box::pin(futures::stream::unfold(Some(Messages::new(body, max)), |reader| async move {
        let mut reader = reader?;
        match reader.next::<LayerChunk>().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(reader))),
            Ok(None) => None,
            // The error ends the stream.
            Err(status) => Some((Err(status), None)),
        }
    }))
}

/// The response of a call that answered `messages`, each from its own buffers, and ended well; or its status.
fn respond<M: Payloads>(answer: Result<Vec<M>, Status>) -> http::Response<Body> {
    let frames = answer.and_then(|messages| {
        let mut frames = Vec::with_capacity(2 * messages.len() + 1);
        for m in messages {
            frames.extend(pieces(m)?.into_iter().map(|p| Ok::<_, Status>(Frame::data(p))));
        }
        let mut trailers = http::HeaderMap::new();
        Status::ok("").add_header(&mut trailers)?;
        frames.push(Ok(Frame::trailers(trailers)));
        Ok(frames)
    });
    match frames {
        Ok(frames) => {
            let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)));
            let mut response = http::Response::new(body);
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            response
        }
        // Trailers only: the call ended before any reply.
        Err(status) => status.into_http(),
    }
}

/// `S`'s `Stage` service with its layer calls read from the frames and answered from their buffers.
pub struct DirectStage<S> {
    stage: Arc<S>,
    generated: StageServer<S>,
    /// The largest message taken, as the generated service is configured.
    max: usize,
}

impl<S> Clone for DirectStage<S> {
    fn clone(&self) -> Self {
        DirectStage { stage: self.stage.clone(), generated: self.generated.clone(), max: self.max }
    }
}

impl<S: LayerCalls> DirectStage<S> {
    /// `stage` served with messages of at most `max` bytes: `generated` must be its service with that limit.
    pub fn new(stage: Arc<S>, generated: StageServer<S>, max: usize) -> Self {
        DirectStage { stage, generated, max }
    }
}

impl<S> NamedService for DirectStage<S> {
    const NAME: &'static str = <StageServer<S> as NamedService>::NAME;
}

impl<S: LayerCalls> Service<http::Request<Body>> for DirectStage<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (stage, max) = (self.stage.clone(), self.max);
        match request.uri().path() {
            FORWARD => Box::pin(async move {
                let chunks = chunks_of(request.into_body(), max);
                Ok(respond(stage.forward_layer(chunks).await.map(|()| vec![Ack {}])))
            }),
            BACKWARD => Box::pin(async move {
                let chunks = chunks_of(request.into_body(), max);
                Ok(respond(stage.backward_layer(chunks).await))
            }),
            _ => self.generated.call(request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pb::{InfoReply, InfoRequest};
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use tonic::{Request, Response, Streaming};

    /// A stage that keeps the values of every layer it takes and answers a gradient of its first chunk's values.
    #[derive(Default)]
    struct Keeper {
        taken: std::sync::Mutex<Vec<Bytes>>,
    }

    impl Keeper {
        async fn take(&self, mut chunks: Chunks) -> Result<Vec<Bytes>, Status> {
            let mut values = Vec::new();
            while let Some(c) = chunks.next().await {
                let c = c?;
                if c.job != "job-a" {
                    return Err(Status::permission_denied(format!("job '{}'", c.job)));
                }
                values.push(c.values);
            }
            self.taken.lock().unwrap().extend(values.iter().cloned());
            Ok(values)
        }
    }

    impl LayerCalls for Keeper {
        async fn forward_layer(&self, chunks: Chunks) -> Result<(), Status> {
            self.take(chunks).await.map(drop)
        }

        async fn backward_layer(&self, chunks: Chunks) -> Result<Vec<GradChunk>, Status> {
            let values = self.take(chunks).await?;
            Ok(values.into_iter().map(|v| GradChunk { layer: 1, weights: v, ..GradChunk::default() }).collect())
        }
    }

    #[tonic::async_trait]
    impl Stage for Keeper {
        async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
            Ok(Response::new(InfoReply { job: "job-a".into(), engines: 7, sram_bytes: 0 }))
        }
        async fn begin_step(&self, _: Request<crate::protocol::pb::BeginStepRequest>) -> Result<Response<Ack>, Status> {
            Err(Status::unimplemented("test"))
        }
        async fn forward(&self, r: Request<Streaming<LayerChunk>>) -> Result<Response<Ack>, Status> {
            self.forward_layer(Box::pin(r.into_inner())).await.map(|()| Response::new(Ack {}))
        }
        async fn loss(
            &self,
            _: Request<crate::protocol::pb::LossRequest>,
        ) -> Result<Response<crate::protocol::pb::LossReply>, Status> {
            Err(Status::unimplemented("test"))
        }
        type BackwardStream = Chunked<GradChunk>;
        async fn backward(&self, r: Request<Streaming<LayerChunk>>) -> Result<Response<Self::BackwardStream>, Status> {
            let grads = self.backward_layer(Box::pin(r.into_inner())).await?;
            Ok(Response::new(Box::pin(futures::stream::iter(grads.into_iter().map(Ok)))))
        }
        async fn stats(
            &self,
            _: Request<crate::protocol::pb::StatsRequest>,
        ) -> Result<Response<crate::protocol::pb::StatsReply>, Status> {
            Err(Status::unimplemented("test"))
        }
        async fn prime(&self, _: Request<Streaming<crate::protocol::pb::StateChunk>>) -> Result<Response<Ack>, Status> {
            Err(Status::unimplemented("test"))
        }
        type SnapshotStream = Chunked<crate::protocol::pb::StateChunk>;
        async fn snapshot(
            &self,
            _: Request<crate::protocol::pb::SnapshotRequest>,
        ) -> Result<Response<Self::SnapshotStream>, Status> {
            Err(Status::unimplemented("test"))
        }
        type StepStream = Chunked<crate::protocol::pb::StepChunk>;
        async fn step(
            &self,
            _: Request<crate::protocol::pb::ResidentStepRequest>,
        ) -> Result<Response<Self::StepStream>, Status> {
            Err(Status::unimplemented("test"))
        }
        async fn apply(&self, _: Request<Streaming<GradChunk>>) -> Result<Response<Ack>, Status> {
            Err(Status::unimplemented("test"))
        }
    }

    type Chunked<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

    /// `a` is `b`'s memory, not a copy of it.
    fn same_memory(a: &Bytes, b: &Bytes) -> bool {
        a.as_ptr() == b.as_ptr() && a.len() == b.len()
    }

    fn service(keeper: Arc<Keeper>) -> DirectStage<Keeper> {
        DirectStage::new(keeper.clone(), StageServer::from_arc(keeper).max_decoding_message_size(1 << 20), 1 << 20)
    }

    fn call_of(path: &str, chunks: Vec<LayerChunk>) -> http::Request<Body> {
        let frames: Vec<Result<Frame<Bytes>, Status>> =
            chunks.into_iter().flat_map(|c| pieces(c).unwrap()).map(|p| Ok(Frame::data(p))).collect();
        let mut request = http::Request::new(Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames))));
        *request.uri_mut() = path.parse().unwrap();
        request
    }

    fn chunk(job: &str, values: &[u8]) -> LayerChunk {
        LayerChunk { job: job.into(), values: Bytes::copy_from_slice(values), ..LayerChunk::default() }
    }

    /// The reply's messages (decoded from its data) and its trailers' status.
    async fn reply<M: prost::Message + Default>(response: http::Response<Body>) -> (Vec<M>, Status) {
        if let Some(status) = Status::from_header_map(response.headers()) {
            return (Vec::new(), status);
        }
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let mut data = collected.to_bytes();
        let mut out = Vec::new();
        while !data.is_empty() {
            let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
            out.push(M::decode(&data[5..5 + len]).unwrap());
            data = data.slice(5 + len..);
        }
        (out, Status::from_header_map(&trailers).unwrap())
    }

    /// `Forward` takes the layer's chunks as they were sent and replies `Ack` with an OK status; `Backward`
    /// answers the stage's gradient chunks, each from its own buffer.
    #[tokio::test]
    async fn layer_calls_read_the_frames_and_answer_as_grpc_does() {
        let keeper = Arc::new(Keeper::default());
        let sent = vec![chunk("job-a", &[1, 2, 3, 4]), chunk("job-a", &[5; 4000])];
        let (acks, status) =
            reply::<Ack>(service(keeper.clone()).call(call_of(FORWARD, sent.clone())).await.unwrap()).await;
        assert_eq!((acks.len(), status.code()), (1, tonic::Code::Ok), "{status}");
        let taken: Vec<Bytes> = keeper.taken.lock().unwrap().clone();
        assert_eq!(taken, sent.iter().map(|c| c.values.clone()).collect::<Vec<_>>());

        let (grads, status) =
            reply::<GradChunk>(service(keeper.clone()).call(call_of(BACKWARD, sent.clone())).await.unwrap()).await;
        assert_eq!(status.code(), tonic::Code::Ok, "{status}");
        assert_eq!(grads.iter().map(|g| g.weights.clone()).collect::<Vec<_>>(), taken);
    }

    /// A stage's refusal reaches the caller as its status, trailers only; an oversized message as OutOfRange.
    #[tokio::test]
    async fn refusals_keep_their_status() {
        let keeper = Arc::new(Keeper::default());
        let response = service(keeper.clone()).call(call_of(FORWARD, vec![chunk("job-b", &[1])])).await.unwrap();
        let (_, status) = reply::<Ack>(response).await;
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
        let big = chunk("job-a", &vec![0u8; (1 << 20) + 1]);
        let (_, status) = reply::<Ack>(service(keeper.clone()).call(call_of(BACKWARD, vec![big])).await.unwrap()).await;
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
        assert!(keeper.taken.lock().unwrap().is_empty());
    }

    /// Other methods are the generated service's.
    #[tokio::test]
    async fn other_methods_are_the_generated_services() {
        let keeper = Arc::new(Keeper::default());
        let mut body = vec![0u8, 0, 0, 0, 0];
        body[1..5].copy_from_slice(&0u32.to_be_bytes());
        let mut request = http::Request::new(Body::new(http_body_util::Full::new(Bytes::from(body))));
        *request.uri_mut() = "/weightstream.v1alpha1.Stage/Info".parse().unwrap();
        *request.method_mut() = http::Method::POST;
        request.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
        let (replies, status) = reply::<InfoReply>(service(keeper).call(request).await.unwrap()).await;
        assert_eq!(status.code(), tonic::Code::Ok, "{status}");
        assert_eq!(replies[0].engines, 7);
    }

    /// The gradient answered is sent from the chunk's own buffer.
    #[test]
    fn an_answer_is_sent_from_its_own_buffer() {
        let weights = Bytes::from(vec![9u8; 4096]);
        let response = respond(Ok(vec![GradChunk { weights: weights.clone(), ..GradChunk::default() }]));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut body = response.into_body();
        let frames: Vec<Bytes> = rt.block_on(async {
            let mut out = Vec::new();
            while let Some(Ok(f)) = body.frame().await {
                if let Ok(d) = f.into_data() {
                    out.push(d);
                }
            }
            out
        });
        assert!(frames.iter().any(|f| same_memory(f, &weights)));
    }
}
