//! Layer streams sent without a copy: a `Stage.Forward` or `Stage.Backward` call whose chunks' arrays reach
//! HTTP/2 as the very `Bytes` they are, where tonic's codec would first encode each chunk into a buffer of its own.
//!
//! A protobuf message is its fields in any order, so a chunk is sent as the gRPC prefix and its small fields
//! (encoded by prost), then each array after its key and length. HTTP/2 chains a large `Bytes` into its write
//! without copying it, and the TLS record layer seals it from where it lies: a layer's bytes are copied once on
//! the sending side, into the sealed record. The replies are decoded by tonic as any call's are, and the server
//! side is the generated `Stage` service or [`super::direct`]'s, so a receiver cannot tell these calls from the
//! generated client's.

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http_body::Frame;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::client::GrpcService;
use tonic::codec::{Codec, Streaming};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::protocol::pb::{Ack, GradChunk, LayerChunk};

/// The method paths, as the generated `Stage` service routes them.
pub(crate) const FORWARD: &str = "/weightstream.v1alpha1.Stage/Forward";
pub(crate) const BACKWARD: &str = "/weightstream.v1alpha1.Stage/Backward";

/// A message whose `bytes` fields are payloads: sent as they are, after the rest of the message.
pub trait Payloads: Message + Default + Send + 'static {
    /// Takes the non-empty payload fields out (leaving them empty), each with its field number.
    fn take_payloads(&mut self) -> Vec<(u32, Bytes)>;
}

/// The non-empty ones of a message's payload `fields` (field number, field), taken out with their numbers.
fn non_empty<const N: usize>(fields: [(u32, &mut Bytes); N]) -> Vec<(u32, Bytes)> {
    fields.into_iter().filter(|(_, b)| !b.is_empty()).map(|(tag, b)| (tag, std::mem::take(b))).collect()
}

impl Payloads for LayerChunk {
    fn take_payloads(&mut self) -> Vec<(u32, Bytes)> {
        non_empty([
            (13, &mut self.order),
            (14, &mut self.ptr),
            (15, &mut self.indices),
            (16, &mut self.values),
            (17, &mut self.bias),
        ])
    }
}

impl Payloads for GradChunk {
    fn take_payloads(&mut self) -> Vec<(u32, Bytes)> {
        non_empty([(6, &mut self.weights), (7, &mut self.bias)])
    }
}

impl Payloads for Ack {
    fn take_payloads(&mut self) -> Vec<(u32, Bytes)> {
        Vec::new()
    }
}

/// `message` as gRPC frames it, in pieces: the 5-byte prefix with the small fields, then each payload after its
/// key and length, the payload itself not copied.
pub(crate) fn pieces<M: Payloads>(mut message: M) -> Result<Vec<Bytes>, Status> {
    let payloads = message.take_payloads();
    let framed = |(tag, b): &(u32, Bytes)| key_len(*tag) + encoded_len_varint(b.len() as u64) + b.len();
    let len = message.encoded_len() + payloads.iter().map(framed).sum::<usize>();
    let len = u32::try_from(len).map_err(|_| Status::internal(format!("a {len}-byte message is too long for gRPC")))?;
    let mut head = BytesMut::with_capacity(5 + message.encoded_len() + 12 * payloads.len());
    head.put_u8(0);
    head.put_u32(len);
    message.encode(&mut head).map_err(|e| Status::internal(format!("encoding a message: {e}")))?;
    let mut out = Vec::with_capacity(1 + 2 * payloads.len());
    for (tag, payload) in payloads {
        encode_key(tag, WireType::LengthDelimited, &mut head);
        encode_varint(payload.len() as u64, &mut head);
        out.push(head.split().freeze());
        out.push(payload);
    }
    if !head.is_empty() {
        out.push(head.freeze());
    }
    Ok(out)
}

/// Calls the streaming method at `path` on `channel` with `messages`, their payloads sent as they are; the
/// replies are decoded as the generated client decodes them. Fails with the call's status, as it would.
async fn call<M, R, S>(mut channel: Channel, path: &'static str, messages: S) -> Result<Streaming<R>, Status>
where
    M: Payloads,
    R: Message + Default + Send + Sync + 'static,
    S: futures::Stream<Item = M> + Send + 'static,
{
    let frames = messages
        .map(|m| futures::stream::iter(pieces(m).map_or_else(|e| vec![Err(e)], |p| p.into_iter().map(Ok).collect())))
        .flatten()
        .map(|piece| piece.map(Frame::data));
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(path)
        .header(http::header::TE, "trailers")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(tonic::body::Body::new(http_body_util::StreamBody::new(frames)))
        .map_err(|e| Status::internal(format!("building a call of {path}: {e}")))?;
    futures::future::poll_fn(|cx| GrpcService::poll_ready(&mut channel, cx))
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let response = GrpcService::call(&mut channel, request).await.map_err(|e| Status::from_error(e.into()))?;
    let decoder = ProstCodec::<M, R>::default().decoder();
    let code = response.status();
    match Status::from_header_map(response.headers()) {
        // Trailers only: the call ended before any reply.
        Some(status) if status.code() != Code::Ok => Err(status),
        Some(_) => Ok(Streaming::new_empty(decoder, response.into_body())),
        None => {
            Ok(Streaming::new_response(decoder, response.into_body(), code, None, Some(super::STAGE_MESSAGE_BYTES)))
        }
    }
}

/// `Stage.Forward` with `chunks` on `channel`: done when the stage has taken the whole layer.
pub async fn forward<S>(channel: Channel, chunks: S) -> Result<(), Status>
where
    S: futures::Stream<Item = LayerChunk> + Send + 'static,
{
    let mut replies = call::<LayerChunk, Ack, _>(channel, FORWARD, chunks).await?;
    replies.message().await?.ok_or_else(|| Status::internal("the stage ended the call without its reply"))?;
    replies.trailers().await?;
    Ok(())
}

/// `Stage.Backward` with `chunks` on `channel`: the stage's gradient, as a stream of chunks.
pub async fn backward<S>(channel: Channel, chunks: S) -> Result<Streaming<GradChunk>, Status>
where
    S: futures::Stream<Item = LayerChunk> + Send + 'static,
{
    call(channel, BACKWARD, chunks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(values: usize, bias: usize) -> LayerChunk {
        let bytes =
            |n: usize, seed: u8| Bytes::from((0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect::<Vec<_>>());
        LayerChunk {
            job: "job-a".into(),
            step: 7,
            layer: 3,
            first: true,
            values_len: values as u64,
            bias_len: bias as u64,
            order: bytes(12, 1),
            ptr: bytes(20, 2),
            indices: bytes(300, 3),
            values: bytes(values, 4),
            bias: bytes(bias, 5),
            ..LayerChunk::default()
        }
    }

    /// The pieces joined are what tonic's codec sends: the prefix with the length, and a message that decodes to
    /// the chunk, every field in place.
    #[test]
    fn the_pieces_frame_a_message_that_decodes_to_the_chunk() {
        for (values, bias) in [(1_000_000, 64), (0, 0), (5, 0), (0, 9)] {
            let sent = chunk(values, bias);
            let pieces = pieces(sent.clone()).unwrap();
            assert!(pieces.iter().any(|p| p.len() == values) || values == 0, "the values travel as one piece");
            let joined: Vec<u8> = pieces.concat();
            assert_eq!(joined[0], 0, "not compressed");
            let len = u32::from_be_bytes(joined[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, joined.len() - 5);
            assert_eq!(LayerChunk::decode(&joined[5..]).unwrap(), sent);
        }
    }

    /// The values' piece is the chunk's own buffer, not a copy of it.
    #[test]
    fn a_payload_is_sent_from_its_own_buffer() {
        let sent = chunk(4096, 0);
        let at = sent.values.as_ptr();
        assert!(pieces(sent).unwrap().iter().any(|p| p.as_ptr() == at && p.len() == 4096));
    }
}
