//! The layer codec: a [`LayerStream`] cut into [`LayerChunk`]s and put back together, its mask's arrays, values
//! and bias each split across chunks so no message exceeds [`CHUNK_BYTES`].

use std::sync::Arc;

use bytes::Bytes;

use super::chunk::{extend_words, CHUNK_BYTES, MAX_RESERVE};
use crate::error::{Error, Result};
use crate::kernels::sparse::SparsePattern;
use crate::protocol::pb::{Encoding, LayerChunk, Pass as PbPass};
use crate::protocol::{LayerStream, Pass, WeightPayload};

/// Cuts a layer stream into chunks for `job` and `step`.
pub fn encode_layer(stream: &LayerStream, job: &str, step: u64) -> Vec<LayerChunk> {
    let (encoding, pattern, values): (Encoding, Option<&SparsePattern>, &[f32]) = match &stream.weights {
        WeightPayload::Dense(v) => (Encoding::Dense, None, v),
        WeightPayload::Sparse { pattern, values } => (Encoding::Sparse, Some(pattern), values),
        WeightPayload::Mask(pattern) => (Encoding::Mask, Some(pattern), &[]),
        WeightPayload::Nothing => (Encoding::Nothing, None, &[]),
    };
    let empty: &[u32] = &[];
    let (order, ptr, indices) = pattern.map_or((empty, empty, empty), |p| (p.order(), p.ptr(), p.idx()));
    let header = LayerChunk {
        job: job.to_string(),
        step,
        layer: stream.layer as u32,
        pass: match stream.pass {
            Pass::Forward => PbPass::Forward,
            Pass::Backward => PbPass::Backward,
        } as i32,
        encoding: encoding as i32,
        first: true,
        outer: pattern.map_or(0, |p| p.outer() as u32),
        inner: pattern.map_or(0, |p| p.inner() as u32),
        indices_len: indices.len() as u64,
        values_len: values.len() as u64,
        bias_len: stream.bias.len() as u64,
        ..LayerChunk::default()
    };
    let mut chunks = vec![header];
    let mut room = CHUNK_BYTES;
    // Each field gets at most one piece per chunk: a piece fills the chunk's room or ends the array.
    let mut take = |chunks: &mut Vec<LayerChunk>, mut data: &[u8], field: fn(&mut LayerChunk) -> &mut Bytes| {
        while !data.is_empty() {
            if room == 0 {
                chunks.push(LayerChunk { job: job.to_string(), step, layer: stream.layer as u32, ..LayerChunk::default() });
                room = CHUNK_BYTES;
            }
            let n = room.min(data.len());
            if let Some(last) = chunks.last_mut() {
                *field(last) = Bytes::copy_from_slice(&data[..n]);
            }
            data = &data[n..];
            room -= n;
        }
    };
    take(&mut chunks, bytemuck::cast_slice(order), |c| &mut c.order);
    take(&mut chunks, bytemuck::cast_slice(ptr), |c| &mut c.ptr);
    take(&mut chunks, bytemuck::cast_slice(indices), |c| &mut c.indices);
    take(&mut chunks, bytemuck::cast_slice(values), |c| &mut c.values);
    take(&mut chunks, bytemuck::cast_slice(&stream.bias), |c| &mut c.bias);
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// Puts a layer stream back together from its chunks, checking that it is for `job` and complete. Every chunk
/// must carry whole 4-byte words (as [`encode_layer`] cuts them); the words go straight into typed buffers
/// sized from the header.
#[derive(Default)]
pub struct LayerAssembler {
    header: Option<LayerChunk>,
    order: Vec<u32>,
    ptr: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
    bias: Vec<f32>,
    done: bool,
}

impl LayerAssembler {
    fn append(&mut self, chunk: &LayerChunk) -> Result<()> {
        extend_words(&mut self.order, &chunk.order, "order")?;
        extend_words(&mut self.ptr, &chunk.ptr, "ptr")?;
        extend_words(&mut self.indices, &chunk.indices, "indices")?;
        extend_words(&mut self.values, &chunk.values, "values")?;
        extend_words(&mut self.bias, &chunk.bias, "bias")
    }

    /// Adds the next chunk.
    pub fn push(&mut self, mut chunk: LayerChunk, job: &str) -> Result<()> {
        if chunk.job != job {
            return Err(Error::Protocol(format!("a chunk for job '{}' reached a stage of job '{job}'", chunk.job)));
        }
        if self.done {
            return Err(Error::Protocol("a chunk arrived after the layer's last chunk".into()));
        }
        match &self.header {
            None if !chunk.first => return Err(Error::Protocol("a layer stream must start with its header".into())),
            None => {
                let reserve = |n: u64| n.min(MAX_RESERVE) as usize;
                self.indices.reserve(reserve(chunk.indices_len));
                self.values.reserve(reserve(chunk.values_len));
                self.bias.reserve(reserve(chunk.bias_len));
                self.append(&chunk)?;
                self.done = chunk.last;
                for field in [&mut chunk.order, &mut chunk.ptr, &mut chunk.indices, &mut chunk.values, &mut chunk.bias] {
                    *field = Bytes::new();
                }
                self.header = Some(chunk);
            }
            Some(_) if chunk.first => return Err(Error::Protocol("a second header in one layer stream".into())),
            Some(h) => {
                if chunk.layer != h.layer || chunk.step != h.step {
                    return Err(Error::Protocol(format!(
                        "chunk of layer {} step {} inside the stream of layer {} step {}",
                        chunk.layer, chunk.step, h.layer, h.step
                    )));
                }
                self.append(&chunk)?;
                self.done = chunk.last;
            }
        }
        if let Some(h) = &self.header {
            let too_long = self.indices.len() as u64 > h.indices_len
                || self.values.len() as u64 > h.values_len
                || self.bias.len() as u64 > h.bias_len;
            if too_long {
                return Err(Error::Protocol(format!("layer {} stream is longer than its header says", h.layer)));
            }
        }
        Ok(())
    }

    /// The whole stream with its step, or an error naming what is missing.
    pub fn finish(self) -> Result<(u64, LayerStream)> {
        let LayerAssembler { header, order, ptr, indices, values, bias, done } = self;
        let h = header.ok_or_else(|| Error::Protocol("an empty layer stream".into()))?;
        if !done {
            return Err(Error::Protocol(format!("layer {} stream was cut off before its last chunk", h.layer)));
        }
        let lengths_ok = indices.len() as u64 == h.indices_len
            && values.len() as u64 == h.values_len
            && bias.len() as u64 == h.bias_len;
        if !lengths_ok {
            return Err(Error::Protocol(format!(
                "layer {} stream is truncated: {} of {} indices, {} of {} values, {} of {} bias values",
                h.layer,
                indices.len(),
                h.indices_len,
                values.len(),
                h.values_len,
                bias.len(),
                h.bias_len
            )));
        }
        let (layer, step) = (h.layer as usize, h.step);
        let pattern = |order, ptr, indices| -> Result<Arc<SparsePattern>> {
            SparsePattern::from_parts(h.outer as usize, h.inner as usize, order, ptr, indices)
                .map(Arc::new)
                .map_err(|e| Error::Protocol(format!("layer {layer} mask: {e}")))
        };
        let pass = match PbPass::try_from(h.pass) {
            Ok(PbPass::Forward) => Pass::Forward,
            Ok(PbPass::Backward) => Pass::Backward,
            Err(_) => return Err(Error::Protocol(format!("unknown pass {}", h.pass))),
        };
        let weights = match Encoding::try_from(h.encoding) {
            Ok(Encoding::Dense) => WeightPayload::Dense(values),
            Ok(Encoding::Sparse) => {
                let p = pattern(order, ptr, indices)?;
                if values.len() != p.nnz() {
                    return Err(Error::Protocol(format!("layer {layer}: {} values for {} non-zeros", values.len(), p.nnz())));
                }
                WeightPayload::Sparse { pattern: p, values }
            }
            Ok(Encoding::Mask) => WeightPayload::Mask(pattern(order, ptr, indices)?),
            Ok(Encoding::Nothing) => WeightPayload::Nothing,
            Err(_) => return Err(Error::Protocol(format!("unknown encoding {}", h.encoding))),
        };
        Ok((step, LayerStream { layer, pass, weights, bias }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse_stream() -> LayerStream {
        let p = SparsePattern::random(700, 900, 0.9, 1);
        let values: Vec<f32> = (0..p.nnz()).map(|k| k as f32 * 0.5).collect();
        LayerStream { layer: 2, pass: Pass::Forward, weights: WeightPayload::Sparse { pattern: Arc::new(p), values }, bias: vec![1.0; 700] }
    }

    fn assemble(chunks: Vec<LayerChunk>, job: &str) -> Result<(u64, LayerStream)> {
        let mut a = LayerAssembler::default();
        for c in chunks {
            a.push(c, job)?;
        }
        a.finish()
    }

    #[test]
    fn streams_round_trip_in_chunks_of_at_most_a_mebibyte() {
        let s = sparse_stream();
        let chunks = encode_layer(&s, "job-a", 7);
        assert!(chunks.len() > 4, "a 567k-non-zero layer takes several chunks");
        for c in &chunks {
            let bytes = c.order.len() + c.ptr.len() + c.indices.len() + c.values.len() + c.bias.len();
            assert!(bytes <= 1 << 20);
            assert!(prost::Message::encoded_len(c) <= 1 << 20);
        }
        let (step, back) = assemble(chunks, "job-a").unwrap();
        assert_eq!(step, 7);
        assert_eq!(back.layer, 2);
        match (&back.weights, &s.weights) {
            (WeightPayload::Sparse { pattern: a, values: va }, WeightPayload::Sparse { pattern: b, values: vb }) => {
                assert_eq!(a, b);
                assert_eq!(va, vb);
            }
            _ => panic!("encoding changed"),
        }
        assert_eq!(back.bias, s.bias);
    }

    #[test]
    fn bad_streams_are_refused() {
        let chunks = encode_layer(&sparse_stream(), "job-a", 1);
        // Another job.
        assert!(assemble(chunks.clone(), "job-b").unwrap_err().to_string().contains("job 'job-a'"));
        // Truncated: the last chunk never arrives.
        let mut cut = chunks.clone();
        cut.pop();
        assert!(assemble(cut, "job-a").unwrap_err().to_string().contains("cut off"));
        // A wrong shape: an index outside the layer.
        let mut bad = chunks.clone();
        if let Some(c) = bad.iter_mut().find(|c| !c.indices.is_empty()) {
            let mut bytes = c.indices.to_vec();
            bytes[..4].copy_from_slice(&5000u32.to_le_bytes());
            c.indices = bytes.into();
        }
        assert!(assemble(bad, "job-a").unwrap_err().to_string().contains("outside"));
        // Values missing although the header promised them.
        let mut short = chunks;
        if let Some(c) = short.iter_mut().rev().find(|c| !c.values.is_empty()) {
            c.values.truncate(c.values.len() - 4);
        }
        assert!(assemble(short, "job-a").unwrap_err().to_string().contains("truncated"));
    }
}
