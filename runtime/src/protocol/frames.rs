//! gRPC messages read straight from a request's HTTP/2 frames: a message's `bytes` fields come out as slices of
//! the frames they arrived in, where tonic's decoder first copies every frame into a buffer of its own.
//!
//! A message's length is checked against the service's limit from its 5-byte prefix, before its bytes are waited
//! for; what is held at once is one message and the frame it ends in.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;

/// The bytes of frames received and not yet read, in order. `copy_to_bytes` (what prost decodes a `bytes` field
/// with) hands out a slice of a frame when the bytes asked for lie in one, and copies only across frames.
#[derive(Default)]
pub(crate) struct Frames {
    frames: VecDeque<Bytes>,
    remaining: usize,
}

impl Frames {
    /// Appends a frame's bytes.
    pub(crate) fn push(&mut self, frame: Bytes) {
        if !frame.is_empty() {
            self.remaining += frame.len();
            self.frames.push_back(frame);
        }
    }

    /// The first `n` bytes (at most all there are), as frames of their own.
    fn split_to(&mut self, n: usize) -> Frames {
        let mut out = Frames::default();
        self.take_front(n, |piece| out.push(piece));
        out
    }

    /// Takes the first `n` bytes (at most all there are) off, handing each frame's share of them to `each`.
    fn take_front(&mut self, n: usize, mut each: impl FnMut(Bytes)) {
        let mut left = n.min(self.remaining);
        self.remaining -= left;
        while left > 0 {
            let Some(front) = self.frames.front_mut() else { break };
            if front.len() <= left {
                left -= front.len();
                each(self.frames.pop_front().unwrap_or_default());
            } else {
                each(front.split_to(left));
                left = 0;
            }
        }
    }
}

impl Buf for Frames {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.frames.front().map_or(&[], |f| f.as_ref())
    }

    /// Skips `cnt` bytes (at most all there are): prost calls it for every key and small field, so the bytes
    /// skipped are dropped as they are taken, not gathered first.
    fn advance(&mut self, cnt: usize) {
        self.take_front(cnt, drop);
    }

    /// The next `len` bytes (at most all there are): a slice of the first frame when they lie in it.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let len = len.min(self.remaining);
        match self.frames.front_mut() {
            Some(front) if front.len() >= len => {
                self.remaining -= len;
                let out = front.split_to(len);
                if front.is_empty() {
                    self.frames.pop_front();
                }
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put(self.split_to(len));
                out.freeze()
            }
        }
    }
}

/// The gRPC messages of a request body, read one at a time, each at most `max` bytes.
pub(crate) struct Messages<B> {
    body: B,
    frames: Frames,
    max: usize,
}

impl<B> Messages<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Reads `body`'s messages, refusing any over `max` bytes.
    pub(crate) fn new(body: B, max: usize) -> Self {
        Messages { body, frames: Frames::default(), max }
    }

    /// The next message, or `None` where the body ends between messages. A message over the limit is refused from
    /// its prefix; a compressed one, one cut off by the body's end or one that does not decode is an error.
    pub(crate) async fn next<M: Message + Default>(&mut self) -> Result<Option<M>, Status> {
        if !self.fill(5).await? {
            return match self.frames.remaining() {
                0 => Ok(None),
                n => Err(Status::internal(format!("the request ended inside a message's prefix ({n} of 5 bytes)"))),
            };
        }
        let compressed = self.frames.get_u8();
        let len = self.frames.get_u32() as usize;
        match compressed {
            0 => {}
            1 => return Err(Status::unimplemented("compressed messages are not taken here: send them uncompressed")),
            f => return Err(Status::internal(format!("a message prefix with the unknown flag {f}"))),
        }
        if len > self.max {
            return Err(Status::out_of_range(format!(
                "a message of {len} bytes is over this service's limit of {} bytes",
                self.max
            )));
        }
        if !self.fill(len).await? {
            return Err(Status::internal(format!(
                "the request ended inside a message: {} of its {len} bytes came",
                self.frames.remaining()
            )));
        }
        M::decode(self.frames.split_to(len))
            .map(Some)
            .map_err(|e| Status::internal(format!("a message that does not decode: {e}")))
    }

    /// Reads frames until `n` bytes are held; false if the body ends first.
    async fn fill(&mut self, n: usize) -> Result<bool, Status> {
        while self.frames.remaining() < n {
            match self.body.frame().await {
                None => return Ok(false),
                Some(Err(e)) => return Err(Status::from_error(e.into())),
                // Trailers, which a request's body may end with, carry no message bytes.
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.frames.push(data);
                    }
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pb::LayerChunk;
    use http_body::Frame;
    use proptest::prelude::*;

    fn framed(m: &impl Message) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
        out.extend_from_slice(&m.encode_to_vec());
        out
    }

    fn chunk(values: usize, seed: u8) -> LayerChunk {
        LayerChunk {
            job: "job-a".into(),
            layer: 3,
            values_len: values as u64,
            values: Bytes::from((0..values).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect::<Vec<_>>()),
            ..LayerChunk::default()
        }
    }

    /// A body of `bytes` cut into frames at `cuts`.
    fn body(bytes: &[u8], cuts: &[usize]) -> http_body_util::StreamBody<impl futures::Stream<Item = FrameResult>> {
        let mut at = 0;
        let mut frames = Vec::new();
        for &c in cuts.iter().chain([&bytes.len()]) {
            let c = c.clamp(at, bytes.len());
            frames.push(Ok(Frame::data(Bytes::copy_from_slice(&bytes[at..c]))));
            at = c;
        }
        http_body_util::StreamBody::new(futures::stream::iter(frames))
    }

    type FrameResult = Result<Frame<Bytes>, std::io::Error>;

    fn read_all(bytes: &[u8], cuts: &[usize], max: usize) -> Result<Vec<LayerChunk>, Status> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut m = Messages::new(body(bytes, cuts), max);
            let mut out = Vec::new();
            while let Some(c) = m.next::<LayerChunk>().await? {
                out.push(c);
            }
            Ok(out)
        })
    }

    proptest! {
        /// However the body is cut into frames, the messages read are those sent, in order.
        #[test]
        fn messages_read_are_those_sent_whatever_the_frames(
            sizes in proptest::collection::vec(0usize..3000, 1..4),
            cuts in proptest::collection::vec(0usize..12_000, 0..8),
        ) {
            let sent: Vec<LayerChunk> = sizes.iter().enumerate().map(|(i, &n)| chunk(n, i as u8)).collect();
            let bytes: Vec<u8> = sent.iter().flat_map(framed).collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            prop_assert_eq!(read_all(&bytes, &cuts, 1 << 20).unwrap(), sent);
        }
    }

    /// A `bytes` field lying in one frame is that frame's memory, not a copy.
    #[test]
    fn a_field_in_one_frame_is_a_slice_of_it() {
        let bytes = Bytes::from(framed(&chunk(4096, 1)));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let got = rt.block_on(async {
            let frames = futures::stream::iter([Ok::<_, std::io::Error>(Frame::data(bytes.clone()))]);
            Messages::new(http_body_util::StreamBody::new(frames), 1 << 20).next::<LayerChunk>().await
        });
        let values = got.unwrap().unwrap().values;
        let within = bytes.as_ptr_range();
        assert!(within.contains(&values.as_ptr()) && values.len() == 4096);
    }

    /// A message over the limit is refused from its prefix, before its bytes come.
    #[test]
    fn a_message_over_the_limit_is_refused_from_its_prefix() {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        let e = read_all(&bytes, &[], 8 << 20).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        assert!(e.message().contains("4294967295 bytes"), "{e}");
    }

    /// A cut-off prefix, a cut-off message, a compressed one and one that does not decode are each an error.
    #[test]
    fn broken_bodies_are_errors() {
        let whole = framed(&chunk(100, 0));
        let cases: [(&[u8], &str); 4] = [
            (&whole[..3], "inside a message's prefix"),
            (&whole[..50], "inside a message: 45 of its"),
            (&[1, 0, 0, 0, 1, 0], "compressed"),
            (&[0, 0, 0, 0, 2, 0xff, 0xff], "does not decode"),
        ];
        for (bytes, says) in cases {
            let e = read_all(bytes, &[], 1 << 20).unwrap_err();
            assert!(e.message().contains(says), "{says}: {e}");
        }
        assert!(read_all(&[], &[], 1 << 20).unwrap().is_empty(), "an empty body holds no message");
    }
}
