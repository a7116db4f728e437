//! Layer streams and gradients on the wire: cut into chunks of at most 1 MiB and put back together with every
//! length and index checked, so a truncated stream, a wrong shape or a bad index is refused before it reaches a
//! kernel or MemoryX's state.

use std::sync::Arc;

use bytes::Bytes;

use super::pb::{Encoding, GradChunk, LayerChunk, LossReply, Pass as PbPass, StateChunk, StepChunk};
use super::{LayerGrad, LayerStream, Pass, WeightPayload};
use crate::error::{Error, Result};
use crate::kernels::sparse::SparsePattern;

/// Payload bytes per chunk: just under 1 MiB, leaving room for the header and framing.
pub const CHUNK_BYTES: usize = 1_000_000;

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

/// Appends the little-endian words in `bytes` to `out`: one copy from the message into the typed buffer the
/// kernels read, with no intermediate byte buffer.
fn extend_words<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8], what: &str) -> Result<()> {
    if bytes.len() % 4 != 0 {
        return Err(Error::Protocol(format!("{what} holds {} bytes, not a whole number of 4-byte values", bytes.len())));
    }
    let start = out.len();
    out.resize(start + bytes.len() / 4, T::zeroed());
    bytemuck::cast_slice_mut::<T, u8>(&mut out[start..]).copy_from_slice(bytes);
    Ok(())
}

/// Most values a header may make the assembler reserve room for up front (64 Mi words, 256 MiB); a longer
/// stream still arrives, growing as it comes, so a bad header cannot make a stage allocate at will.
const MAX_RESERVE: u64 = 64 << 20;

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

/// Little-endian words owned by a [`Bytes`] without copying them: the platform is little-endian (checked at
/// compile time below), so a `Vec<f32>` already is its wire form.
struct Words(Vec<f32>);

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("the wire format sends words in the machine's order, which must be little-endian");

/// Pieces of at most [`CHUNK_BYTES`] of `data`, sharing its buffer.
fn pieces(data: Bytes) -> impl Iterator<Item = Bytes> {
    (0..data.len()).step_by(CHUNK_BYTES).map(move |at| data.slice(at..(at + CHUNK_BYTES).min(data.len())))
}

/// Cuts a gradient into chunks, taking it over so the chunks share its memory instead of copying it.
pub fn encode_grad_owned(grad: LayerGrad) -> Vec<GradChunk> {
    let (layer, weights_len, bias_len) = (grad.layer as u32, grad.weights.len() as u64, grad.bias.len() as u64);
    let mut chunks: Vec<GradChunk> = pieces(Bytes::from_owner(Words(grad.weights)))
        .map(|w| GradChunk { layer, weights: w, ..GradChunk::default() })
        .chain(pieces(Bytes::from_owner(Words(grad.bias))).map(|b| GradChunk { layer, bias: b, ..GradChunk::default() }))
        .collect();
    if chunks.is_empty() {
        chunks.push(GradChunk { layer, ..GradChunk::default() });
    }
    chunks[0].first = true;
    chunks[0].weights_len = weights_len;
    chunks[0].bias_len = bias_len;
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// Cuts a gradient into chunks (a copy of it; see [`encode_grad_owned`]).
pub fn encode_grad(grad: &LayerGrad) -> Vec<GradChunk> {
    encode_grad_owned(grad.clone())
}


/// Puts a gradient back together, checking it is complete; the words go straight into typed buffers sized
/// from the header.
pub fn decode_grad(chunks: impl IntoIterator<Item = GradChunk>) -> Result<LayerGrad> {
    let mut header: Option<GradChunk> = None;
    let (mut weights, mut bias) = (Vec::<f32>::new(), Vec::<f32>::new());
    let mut done = false;
    for c in chunks {
        if done {
            return Err(Error::Protocol("a gradient chunk arrived after the last one".into()));
        }
        done = c.last;
        match &header {
            None if !c.first => return Err(Error::Protocol("a gradient stream must start with its header".into())),
            None => {
                weights.reserve(c.weights_len.min(MAX_RESERVE) as usize);
                bias.reserve(c.bias_len.min(MAX_RESERVE) as usize);
            }
            Some(h) if c.first || c.layer != h.layer => {
                return Err(Error::Protocol("gradient chunks of two layers are mixed".into()));
            }
            Some(_) => {}
        }
        extend_words(&mut weights, &c.weights, "weights")?;
        extend_words(&mut bias, &c.bias, "bias")?;
        if header.is_none() {
            header = Some(GradChunk { weights: Bytes::new(), bias: Bytes::new(), ..c });
        }
    }
    let h = header.ok_or_else(|| Error::Protocol("an empty gradient stream".into()))?;
    if !done || weights.len() as u64 != h.weights_len || bias.len() as u64 != h.bias_len {
        return Err(Error::Protocol(format!(
            "layer {} gradient is truncated: {} of {} weights, {} of {} bias values",
            h.layer,
            weights.len(),
            h.weights_len,
            bias.len(),
            h.bias_len
        )));
    }
    Ok(LayerGrad { layer: h.layer as usize, weights, bias })
}

/// Several layers' gradients as one stream: each layer's chunks in turn, in the order given.
pub fn encode_grads(grads: Vec<LayerGrad>) -> Vec<GradChunk> {
    grads.into_iter().flat_map(encode_grad_owned).collect()
}

/// A pipelined step's reply: the loss first, then the gradients (none when the stage applied them itself).
pub fn encode_step(loss: LossReply, grads: Vec<LayerGrad>) -> Vec<StepChunk> {
    std::iter::once(StepChunk { loss: Some(loss), grad: None })
        .chain(encode_grads(grads).into_iter().map(|g| StepChunk { loss: None, grad: Some(g) }))
        .collect()
}

/// Splits a stream of several layers' gradients at each layer's first chunk and decodes every layer.
pub fn decode_grads(chunks: impl IntoIterator<Item = GradChunk>) -> Result<Vec<LayerGrad>> {
    let mut layers: Vec<Vec<GradChunk>> = Vec::new();
    for c in chunks {
        match layers.last_mut() {
            Some(current) if !c.first => current.push(c),
            _ => layers.push(vec![c]),
        }
    }
    layers.into_iter().map(decode_grad).collect()
}

/// Adds one stage's gradients of a whole step to the running sum, layer by layer.
pub fn add_grads(sum: &mut Option<Vec<LayerGrad>>, more: Vec<LayerGrad>) -> Result<()> {
    match sum {
        None => *sum = Some(more),
        Some(s) if s.len() != more.len() => {
            return Err(Error::Protocol(format!("gradients of {} layers cannot be summed with {}", more.len(), s.len())));
        }
        Some(s) => {
            for (a, b) in s.iter_mut().zip(&more) {
                a.add(b).map_err(Error::Protocol)?;
            }
        }
    }
    Ok(())
}

/// A replica's state (the bytes of a checkpoint file) cut into chunks for `job`, sharing its buffer.
pub fn encode_state(bytes: Bytes, job: &str) -> Vec<StateChunk> {
    let mut chunks: Vec<StateChunk> =
        pieces(bytes).map(|d| StateChunk { job: job.to_string(), data: d, last: false }).collect();
    if chunks.is_empty() {
        chunks.push(StateChunk { job: job.to_string(), ..StateChunk::default() });
    }
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// Puts a replica's state back together, refusing chunks of another job and a stream cut short.
pub fn decode_state(chunks: impl IntoIterator<Item = StateChunk>, job: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut done = false;
    for c in chunks {
        if c.job != job {
            return Err(Error::Protocol(format!("a replica of job '{}' was sent to job '{job}'", c.job)));
        }
        if done {
            return Err(Error::Protocol("a replica chunk arrived after the last one".into()));
        }
        done = c.last;
        bytes.extend_from_slice(&c.data);
    }
    if !done {
        return Err(Error::Protocol("the replica's state is truncated: its last chunk never came".into()));
    }
    Ok(bytes)
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

        let g = LayerGrad { layer: 1, weights: (0..600_000).map(|i| i as f32).collect(), bias: vec![2.0; 5] };
        assert_eq!(decode_grad(encode_grad(&g)).unwrap(), g);
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
        // A gradient cut short.
        let mut g = encode_grad(&LayerGrad { layer: 0, weights: vec![1.0; 300_000], bias: vec![0.0; 3] });
        g.pop();
        assert!(decode_grad(g).is_err());
    }
}
