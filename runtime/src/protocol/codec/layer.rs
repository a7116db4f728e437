//! The layer codec: a [`LayerStream`] cut into [`LayerChunk`]s and put back together, its mask's arrays, values
//! and bias each split across chunks so no message exceeds [`CHUNK_BYTES`].

use std::sync::Arc;

use bytes::Bytes;

use super::chunk::{CHUNK_BYTES, MAX_RESERVE, Recycled, Words, extend_words};
use crate::protocol::pb::{Encoding, LayerChunk, Pass as PbPass};
use crate::protocol::{LayerStream, Pass, WeightPayload};
use errors::{Error, Result};
use kernels::sparse::SparsePattern;
use plan::limits::Limits;

/// Where one of a chunk's byte arrays goes in its message.
type ChunkField = fn(&mut LayerChunk) -> &mut Bytes;

/// Cuts a layer stream into chunks for `job` and `step`, taking it over: every chunk's arrays are slices of the
/// stream's own buffers (the values and bias it owned, the mask it shares), so no byte of the layer is copied
/// before the transport writes it. The values' buffer goes back to [`Recycled::layers`] once the last chunk is
/// sent, for the next layer MemoryX gathers.
pub fn encode_layer(stream: LayerStream, job: &str, step: u64) -> Vec<LayerChunk> {
    let LayerStream { layer, pass, weights, bias } = stream;
    let (encoding, pattern, values) = match weights {
        WeightPayload::Dense(v) => (Encoding::Dense, None, v),
        WeightPayload::Sparse { pattern, values } => (Encoding::Sparse, Some(pattern), values),
        WeightPayload::Mask(pattern) => (Encoding::Mask, Some(pattern), Vec::new()),
        WeightPayload::Nothing => (Encoding::Nothing, None, Vec::new()),
    };
    let header = LayerChunk {
        job: job.to_string(),
        step,
        layer: layer as u32,
        pass: match pass {
            Pass::Forward => PbPass::Forward,
            Pass::Backward => PbPass::Backward,
        } as i32,
        encoding: encoding as i32,
        first: true,
        outer: pattern.as_ref().map_or(0, |p| p.outer() as u32),
        inner: pattern.as_ref().map_or(0, |p| p.inner() as u32),
        indices_len: pattern.as_ref().map_or(0, |p| p.idx().len() as u64),
        values_len: values.len() as u64,
        bias_len: bias.len() as u64,
        ..LayerChunk::default()
    };
    let mask = |part: MaskPart| pattern.clone().map_or_else(Bytes::new, |p| Bytes::from_owner(MaskWords(p, part)));
    let arrays: [(Bytes, ChunkField); 5] = [
        (mask(MaskPart::Order), |c| &mut c.order),
        (mask(MaskPart::Ptr), |c| &mut c.ptr),
        (mask(MaskPart::Indices), |c| &mut c.indices),
        (Recycled::layers().bytes(values), |c| &mut c.values),
        (Bytes::from_owner(Words(bias)), |c| &mut c.bias),
    ];
    let mut chunks = vec![header];
    let mut room = CHUNK_BYTES;
    // Each array gets at most one piece per chunk: a piece fills the chunk's room or ends the array.
    for (data, field) in arrays {
        let mut at = 0;
        while at < data.len() {
            if room == 0 {
                chunks.push(LayerChunk { job: job.to_string(), step, layer: layer as u32, ..LayerChunk::default() });
                room = CHUNK_BYTES;
            }
            let n = room.min(data.len() - at);
            if let Some(last) = chunks.last_mut() {
                *field(last) = data.slice(at..at + n);
            }
            at += n;
            room -= n;
        }
    }
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// Which of a mask's arrays a [`MaskWords`] lends.
#[derive(Clone, Copy)]
enum MaskPart {
    Order,
    Ptr,
    Indices,
}

/// One of a shared mask's arrays as message bytes, keeping the mask alive for as long as a chunk needs it.
struct MaskWords(Arc<SparsePattern>, MaskPart);

impl AsRef<[u8]> for MaskWords {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(match self.1 {
            MaskPart::Order => self.0.order(),
            MaskPart::Ptr => self.0.ptr(),
            MaskPart::Indices => self.0.idx(),
        })
    }
}

/// A layer stream's lengths, checked chunk by chunk before anything is kept: the header's announced lengths
/// against the layer's shape in the plan, and every array's running total against its header (the mask's
/// `order` and `ptr`, which the header does not announce, against the mask's line count). A SwarmX node meters
/// the chunks it relays with it; [`LayerAssembler`] meters what it assembles. A stream announcing `u64::MAX`
/// values, or one that keeps sending past what it announced, is refused at the first chunk that exceeds.
#[derive(Default)]
pub struct LayerMeter {
    header: Option<Announced>,
    /// Bytes received so far of order, ptr, indices, values and bias.
    have: [u64; 5],
    done: bool,
}

/// What a layer stream's header announced, once checked against the plan: its layer and step, and the most
/// words each array may hold.
#[derive(Clone, Copy)]
struct Announced {
    layer: u32,
    step: u64,
    most: [u64; 5],
}

/// The arrays of a layer chunk, in [`LayerMeter::have`]'s order.
const FIELDS: [&str; 5] = ["order", "ptr", "indices", "values", "bias"];

fn fields(c: &LayerChunk) -> [&Bytes; 5] {
    [&c.order, &c.ptr, &c.indices, &c.values, &c.bias]
}

impl LayerMeter {
    /// Checks the next chunk of the stream for `job` against `limits`, before the caller keeps it.
    pub fn check(&mut self, chunk: &LayerChunk, job: &str, limits: &Limits) -> Result<()> {
        if chunk.job != job {
            return Err(Error::Protocol(format!("a chunk for job '{}' reached a stage of job '{job}'", chunk.job)));
        }
        if self.done {
            return Err(Error::Protocol("a chunk arrived after the layer's last chunk".into()));
        }
        let announced = match self.header {
            None if !chunk.first => return Err(Error::Protocol("a layer stream must start with its header".into())),
            None => *self.header.insert(Self::announced(chunk, limits)?),
            Some(_) if chunk.first => return Err(Error::Protocol("a second header in one layer stream".into())),
            Some(h) if chunk.layer != h.layer || chunk.step != h.step => {
                return Err(Error::Protocol(format!(
                    "chunk of layer {} step {} inside the stream of layer {} step {}",
                    chunk.layer, chunk.step, h.layer, h.step
                )));
            }
            Some(h) => h,
        };
        for (i, data) in fields(chunk).into_iter().enumerate() {
            let have = self.have[i].saturating_add(data.len() as u64);
            let l = announced.layer;
            Error::check_limit(
                || format!("layer {l} stream's {} (values received, beyond what its header announced)", FIELDS[i]),
                have.div_ceil(4),
                announced.most[i],
            )?;
            self.have[i] = have;
        }
        self.done = chunk.last;
        Ok(())
    }

    /// The header's lengths, each checked against the layer's shape in the plan.
    fn announced(h: &LayerChunk, limits: &Limits) -> Result<Announced> {
        let shape = limits.layer(u64::from(h.layer))?;
        let l = h.layer;
        let (lines, weights, bias) =
            (Limits::mask_lines(&shape), Limits::weight_values(&shape), shape.vector_len() as u64);
        Error::check_limit(|| format!("layer {l} stream's outer (mask lines)"), u64::from(h.outer), lines)?;
        Error::check_limit(|| format!("layer {l} stream's inner (mask line length)"), u64::from(h.inner), lines)?;
        Error::check_limit(|| format!("layer {l} stream's indices_len"), h.indices_len, weights)?;
        Error::check_limit(|| format!("layer {l} stream's values_len"), h.values_len, weights)?;
        Error::check_limit(|| format!("layer {l} stream's bias_len"), h.bias_len, bias)?;
        let outer = u64::from(h.outer);
        Ok(Announced {
            layer: h.layer,
            step: h.step,
            most: [outer, outer + 1, h.indices_len, h.values_len, h.bias_len],
        })
    }
}

/// Puts a layer stream back together from its chunks, checking that it is for `job`, within the plan's
/// [`Limits`] (chunk by chunk, through a [`LayerMeter`], before anything is kept) and complete. Every chunk must
/// carry whole 4-byte words (as [`encode_layer`] cuts them); the words go straight into typed buffers sized from
/// the checked header.
#[derive(Default)]
pub struct LayerAssembler {
    meter: LayerMeter,
    header: Option<LayerChunk>,
    order: Vec<u32>,
    ptr: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
    bias: Vec<f32>,
    done: bool,
    /// Where the values buffer comes from, when the receiver recycles them.
    recycled: Option<Arc<Recycled>>,
}

impl LayerAssembler {
    /// An assembler that puts the values into a buffer from `recycled` (the receiver gives the stream's values
    /// back there when it is done with them: [`WeightPayload::into_values`]).
    pub fn recycling(recycled: Arc<Recycled>) -> Self {
        LayerAssembler { recycled: Some(recycled), ..LayerAssembler::default() }
    }

    fn append(&mut self, chunk: &LayerChunk) -> Result<()> {
        extend_words(&mut self.order, &chunk.order, "order")?;
        extend_words(&mut self.ptr, &chunk.ptr, "ptr")?;
        extend_words(&mut self.indices, &chunk.indices, "indices")?;
        extend_words(&mut self.values, &chunk.values, "values")?;
        extend_words(&mut self.bias, &chunk.bias, "bias")
    }

    /// Adds the next chunk, refusing it (before keeping any of it) when it breaks the stream's order or takes
    /// the layer beyond what `limits` allow.
    pub fn push(&mut self, mut chunk: LayerChunk, job: &str, limits: &Limits) -> Result<()> {
        self.meter.check(&chunk, job, limits)?;
        if self.header.is_none() {
            // The header's lengths are within the layer's shape: reserving them is bounded by the plan.
            let reserve = |n: u64| n.min(MAX_RESERVE) as usize;
            self.indices.reserve(reserve(chunk.indices_len));
            match &self.recycled {
                Some(r) => self.values = r.take(reserve(chunk.values_len)),
                None => self.values.reserve(reserve(chunk.values_len)),
            }
            self.bias.reserve(reserve(chunk.bias_len));
        }
        self.append(&chunk)?;
        self.done = chunk.last;
        if self.header.is_none() {
            for field in [&mut chunk.order, &mut chunk.ptr, &mut chunk.indices, &mut chunk.values, &mut chunk.bias] {
                *field = Bytes::new();
            }
            self.header = Some(chunk);
        }
        Ok(())
    }

    /// The whole stream with its step, or an error naming what is missing.
    pub fn finish(self) -> Result<(u64, LayerStream)> {
        let LayerAssembler { header, order, ptr, indices, values, bias, done, .. } = self;
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
                    return Err(Error::Protocol(format!(
                        "layer {layer}: {} values for {} non-zeros",
                        values.len(),
                        p.nnz()
                    )));
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
    use proptest::prelude::*;

    fn sparse_stream() -> LayerStream {
        let p = SparsePattern::random(700, 900, 0.9, 1);
        let values: Vec<f32> = (0..p.nnz()).map(|k| k as f32 * 0.5).collect();
        LayerStream {
            layer: 2,
            pass: Pass::Forward,
            weights: WeightPayload::Sparse { pattern: Arc::new(p), values },
            bias: vec![1.0; 700],
        }
    }

    /// Limits of a model whose layer 2 is the 700×900 layer of [`sparse_stream`].
    fn limits() -> Limits {
        let shape = plan::layout::LinearShape::new(900, 700, true);
        Limits { shard: 1, layers: vec![shape; 3], optimizer_values: 0 }
    }

    fn assemble(chunks: Vec<LayerChunk>, job: &str) -> Result<(u64, LayerStream)> {
        let mut a = LayerAssembler::default();
        for c in chunks {
            a.push(c, job, &limits())?;
        }
        a.finish()
    }

    /// Encoding copies nothing: every chunk's values and indices lie inside the stream's own buffers.
    #[test]
    fn chunks_are_slices_of_the_streams_own_buffers() {
        let s = sparse_stream();
        let WeightPayload::Sparse { pattern, values } = &s.weights else { unreachable!("a sparse stream") };
        let inside = |of: &[u8]| {
            let (start, len) = (of.as_ptr() as usize, of.len());
            move |b: &Bytes| {
                b.is_empty() || (b.as_ptr() as usize >= start && b.as_ptr() as usize + b.len() <= start + len)
            }
        };
        let (in_values, in_indices) =
            (inside(bytemuck::cast_slice(values)), inside(bytemuck::cast_slice(pattern.idx())));
        let chunks = encode_layer(s, "job-a", 1);
        assert!(chunks.iter().all(|c| in_values(&c.values) && in_indices(&c.indices)), "a chunk holds a copy");
        assert!(chunks.iter().filter(|c| !c.values.is_empty()).count() > 1, "the values span several chunks");
    }

    /// An assembler that recycles fills a buffer given back before, and the pool keeps a bounded number.
    #[test]
    fn a_recycling_assembler_reuses_a_buffer_given_back() {
        let recycled = Arc::new(Recycled::default());
        let mut first = LayerAssembler::recycling(recycled.clone());
        for c in encode_layer(sparse_stream(), "job-a", 1) {
            first.push(c, "job-a", &limits()).unwrap();
        }
        let (_, stream) = first.finish().unwrap();
        let buffer = stream.weights.into_values();
        let at = buffer.as_ptr();
        recycled.give(buffer);
        let mut second = LayerAssembler::recycling(recycled.clone());
        for c in encode_layer(sparse_stream(), "job-a", 2) {
            second.push(c, "job-a", &limits()).unwrap();
        }
        let (_, again) = second.finish().unwrap();
        assert!(
            matches!(&again.weights, WeightPayload::Sparse { values, .. } if values.as_ptr() == at),
            "the same buffer"
        );
        for n in 1..=10 {
            recycled.give(Vec::with_capacity(n));
        }
        assert_eq!(recycled.take(8).capacity(), 8, "the smallest kept buffer that fits");
        assert_eq!(recycled.take(11).capacity(), 11, "none fits: a new one; only the largest few were kept");
    }

    /// One way to change a layer stream's chunks on the wire.
    #[derive(Clone, Debug)]
    enum Change {
        /// Flips bits of one byte of one of a chunk's arrays.
        Flip {
            chunk: prop::sample::Index,
            array: usize,
            at: prop::sample::Index,
            bits: u8,
        },
        /// Sets one of the header's numbers (outer, inner, indices, values, bias, encoding, pass) to any value.
        Header {
            field: usize,
            value: u64,
        },
        /// Loses, repeats or swaps chunks.
        Drop(prop::sample::Index),
        Repeat(prop::sample::Index),
        Swap(prop::sample::Index, prop::sample::Index),
        /// Adds 1 to 3 bytes to one array of a chunk (no longer whole words).
        Ragged {
            chunk: prop::sample::Index,
            array: usize,
            extra: usize,
        },
        /// Another layer or step in a chunk after the header.
        Stray {
            chunk: prop::sample::Index,
            layer: u32,
            step: u64,
        },
    }

    fn change() -> impl Strategy<Value = Change> {
        let i = any::<prop::sample::Index>;
        prop_oneof![
            (i(), 0..5usize, i(), 1..=255u8).prop_map(|(chunk, array, at, bits)| Change::Flip {
                chunk,
                array,
                at,
                bits
            }),
            (0..7usize, prop_oneof![Just(u64::MAX), Just(0u64), 0..2_000u64])
                .prop_map(|(field, value)| Change::Header { field, value }),
            i().prop_map(Change::Drop),
            i().prop_map(Change::Repeat),
            (i(), i()).prop_map(|(a, b)| Change::Swap(a, b)),
            (i(), 0..5usize, 1..4usize).prop_map(|(chunk, array, extra)| Change::Ragged { chunk, array, extra }),
            (i(), 0..4u32, 0..3u64).prop_map(|(chunk, layer, step)| Change::Stray { chunk, layer, step }),
        ]
    }

    fn array(c: &mut LayerChunk, i: usize) -> &mut Bytes {
        [&mut c.order, &mut c.ptr, &mut c.indices, &mut c.values, &mut c.bias].into_iter().nth(i % 5).unwrap()
    }

    /// `chunks` (one stream) cut again: every array in pieces of `words` 4-byte words, one piece a chunk, the
    /// header first and alone: another chunking a sender may choose.
    fn rechunk(chunks: Vec<LayerChunk>, words: usize) -> Vec<LayerChunk> {
        let mut header = chunks[0].clone();
        let (job, step, layer) = (header.job.clone(), header.step, header.layer);
        let arrays: Vec<Vec<u8>> =
            (0..5).map(|i| chunks.iter().cloned().flat_map(|mut c| array(&mut c, i).to_vec()).collect()).collect();
        for i in 0..5 {
            *array(&mut header, i) = Bytes::new();
        }
        header.last = false;
        let mut out = vec![header];
        for (i, a) in arrays.iter().enumerate() {
            for piece in a.chunks(4 * words) {
                let mut c = LayerChunk { job: job.clone(), step, layer, ..LayerChunk::default() };
                *array(&mut c, i) = Bytes::copy_from_slice(piece);
                out.push(c);
            }
        }
        if let Some(last) = out.last_mut() {
            last.last = true;
        }
        out
    }

    fn apply(chunks: &mut Vec<LayerChunk>, change: &Change) {
        let n = chunks.len();
        if n == 0 {
            return; // Earlier changes removed every chunk: nothing left to change.
        }
        match change {
            Change::Flip { chunk, array: a, at, bits } => {
                let field = array(&mut chunks[chunk.index(n)], *a);
                if !field.is_empty() {
                    let mut bytes = field.to_vec();
                    let i = at.index(bytes.len());
                    bytes[i] ^= bits;
                    *field = bytes.into();
                }
            }
            Change::Header { field, value } => {
                let h = &mut chunks[0];
                let v32 = u32::try_from(*value).unwrap_or(u32::MAX);
                let i32v = i32::try_from(*value).unwrap_or(i32::MAX);
                match field {
                    0 => h.outer = v32,
                    1 => h.inner = v32,
                    2 => h.indices_len = *value,
                    3 => h.values_len = *value,
                    4 => h.bias_len = *value,
                    5 => h.encoding = i32v,
                    _ => h.pass = i32v,
                }
            }
            Change::Drop(i) => {
                chunks.remove(i.index(n));
            }
            Change::Repeat(i) => {
                let c = chunks[i.index(n)].clone();
                chunks.insert(i.index(n), c);
            }
            Change::Swap(a, b) => chunks.swap(a.index(n), b.index(n)),
            Change::Ragged { chunk, array: a, extra } => {
                let field = array(&mut chunks[chunk.index(n)], *a);
                let mut bytes = field.to_vec();
                bytes.extend(std::iter::repeat_n(7u8, *extra));
                *field = bytes.into();
            }
            Change::Stray { chunk, layer, step } => {
                let i = chunk.index(n).max(1).min(n - 1);
                (chunks[i].layer, chunks[i].step) = (*layer, *step);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// Fuzzing the layer codec (proptest): a stream in any chunking assembles to itself; changed on the way
        /// (bytes, header numbers, chunks lost, repeated or reordered, ragged arrays, stray layers or steps), it
        /// is refused with a reason or assembles to a layer consistent with itself and within the plan's shape,
        /// and nothing panics or reserves beyond the plan.
        #[test]
        fn a_layer_stream_in_any_chunking_or_changed_assembles_or_is_refused(
            rows in 1usize..60,
            cols in 1usize..60,
            density in 0.0f64..1.0,
            words in 1usize..300,
            changes in proptest::collection::vec(change(), 0..3),
        ) {
            let p = SparsePattern::random(rows, cols, density, 3);
            let values: Vec<f32> = (0..p.nnz()).map(|k| k as f32).collect();
            let s = LayerStream {
                layer: 1,
                pass: Pass::Forward,
                weights: WeightPayload::Sparse { pattern: Arc::new(p.clone()), values: values.clone() },
                bias: vec![0.25; rows],
            };
            let shape = plan::layout::LinearShape::new(cols, rows, true);
            let limits = Limits { shard: 1, layers: vec![shape; 2], optimizer_values: 0 };
            let mut chunks = rechunk(encode_layer(s, "job", 3), words);
            for c in &changes {
                apply(&mut chunks, c);
            }
            let mut a = LayerAssembler::default();
            let got = chunks.into_iter().try_for_each(|c| a.push(c, "job", &limits)).and_then(|()| a.finish());
            match got {
                Ok((_, back)) => {
                    if changes.is_empty() {
                        let same = matches!(&back.weights,
                            WeightPayload::Sparse { pattern, values: v } if **pattern == p && *v == values);
                        prop_assert!(same, "the unchanged stream assembled to another layer");
                        prop_assert_eq!(back.bias.len(), rows);
                    }
                    prop_assert!(back.bias.len() as u64 <= shape.vector_len() as u64);
                    let lines = Limits::mask_lines(&shape) as usize;
                    match &back.weights {
                        WeightPayload::Sparse { pattern, values } => {
                            prop_assert!(pattern.outer() <= lines && pattern.inner() <= lines);
                            prop_assert_eq!(values.len(), pattern.nnz());
                        }
                        WeightPayload::Mask(pattern) => prop_assert!(pattern.outer() <= lines && pattern.inner() <= lines),
                        // Its exact length the engine checks against the layer (`check_shape`); bounded here.
                        WeightPayload::Dense(values) => prop_assert!(values.len() as u64 <= Limits::weight_values(&shape)),
                        WeightPayload::Nothing => {}
                    }
                }
                Err(e) => prop_assert!(!changes.is_empty(), "the unchanged stream was refused: {e}"),
            }
        }
    }

    #[test]
    fn streams_round_trip_in_chunks_of_at_most_a_mebibyte() {
        let s = sparse_stream();
        let chunks = encode_layer(s.clone(), "job-a", 7);
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

    /// A layer larger than a core's cache is assembled with stores around it (`uncached`): its values come back
    /// bit for bit across every chunk boundary, NaN payloads included.
    #[test]
    fn a_layer_larger_than_the_cache_round_trips() {
        let (rows, cols) = (1100, 1024);
        assert!(rows * cols * 4 > super::super::uncached::MIN_BUFFER);
        let values: Vec<f32> = (0..rows * cols)
            .map(|k| if k % 4099 == 0 { f32::from_bits(0x7fc0_0000 | k as u32 & 0xffff) } else { k as f32 * 0.25 })
            .collect();
        let s =
            LayerStream { layer: 1, pass: Pass::Backward, weights: WeightPayload::Dense(values.clone()), bias: vec![] };
        let shape = plan::layout::LinearShape::new(cols, rows, false);
        let limits = Limits { shard: 1, layers: vec![shape; 2], optimizer_values: 0 };
        let mut a = LayerAssembler::default();
        for c in encode_layer(s, "job-a", 3) {
            a.push(c, "job-a", &limits).unwrap();
        }
        let (_, back) = a.finish().unwrap();
        let WeightPayload::Dense(got) = back.weights else { panic!("a dense stream came back {:?}", back.weights) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&values));
    }

    #[test]
    fn bad_streams_are_refused() {
        let chunks = encode_layer(sparse_stream(), "job-a", 1);
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

    #[test]
    fn streams_beyond_the_plan_are_refused_before_they_are_kept() {
        let chunks = encode_layer(sparse_stream(), "job-a", 1);
        let over = |e: Error| match e {
            Error::OverLimit { what, value, limit } => (what, value, limit),
            other => panic!("{other:?}"),
        };
        // A header announcing u64::MAX values: refused at the header, whatever follows.
        let mut huge = chunks.clone();
        huge[0].values_len = u64::MAX;
        let (what, value, limit) = over(assemble(huge, "job-a").unwrap_err());
        assert!(what.contains("layer 2 stream's values_len"), "{what}");
        assert_eq!((value, limit), (u64::MAX, 900 * 700));
        // A layer the model does not have.
        let mut missing = chunks.clone();
        missing.iter_mut().for_each(|c| c.layer = 7);
        assert!(assemble(missing, "job-a").unwrap_err().to_string().contains("layer 7"));
        // A mask of more lines than the layer has.
        let mut wide = chunks.clone();
        wide[0].outer = 100_000;
        assert!(over(assemble(wide, "job-a").unwrap_err()).0.contains("outer"));
        // A stream that keeps sending past its announced values: refused at the first chunk beyond them,
        // before that chunk is kept.
        let mut a = LayerAssembler::default();
        let mut pushed = 0;
        let mut refused = None;
        for c in chunks.iter().cloned().chain(std::iter::repeat(LayerChunk {
            job: "job-a".into(),
            step: 1,
            layer: 2,
            values: Bytes::from(vec![0u8; CHUNK_BYTES]),
            ..LayerChunk::default()
        })) {
            let mut c = c;
            c.last = false;
            if let Err(e) = a.push(c, "job-a", &limits()) {
                refused = Some(e);
                break;
            }
            pushed += 1;
            assert!(pushed < 1000, "an endless stream must be refused");
        }
        let (what, _, limit) = over(refused.expect("refused"));
        assert!(what.contains("values"), "{what}");
        assert_eq!(limit, chunks[0].values_len);
        // An unannounced mask array (ptr) longer than the mask's lines.
        let mut long_ptr = chunks;
        long_ptr[1].ptr = Bytes::from(vec![0u8; 4 * 800]);
        assert!(over(assemble(long_ptr, "job-a").unwrap_err()).0.contains("ptr"));
    }
}
