//! The gradient codec: a [`LayerGrad`] cut into [`GradChunk`]s that share its memory, several layers' chunks
//! in one stream, and the checked way back.

use bytes::Bytes;

use super::chunk::{MAX_RESERVE, Recycled, Words, extend_words, pieces};
use crate::protocol::LayerGrad;
use crate::protocol::pb::GradChunk;
use errors::{Error, Result};
use plan::limits::Limits;

/// Cuts a gradient into chunks, taking it over so the chunks share its memory instead of copying it.
pub fn encode_grad_owned(grad: LayerGrad) -> Vec<GradChunk> {
    let (layer, weights_len, bias_len) = (grad.layer as u32, grad.weights.len() as u64, grad.bias.len() as u64);
    let mut chunks: Vec<GradChunk> = pieces(Bytes::from_owner(Words(grad.weights)))
        .map(|w| GradChunk { layer, weights: w, ..GradChunk::default() })
        .chain(pieces(Bytes::from_owner(Words(grad.bias))).map(|b| GradChunk {
            layer,
            bias: b,
            ..GradChunk::default()
        }))
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

/// A gradient stream's lengths, checked chunk by chunk before anything is kept: each layer's header against the
/// layer's shape in the plan, each layer's running totals against its header, and the layers against the model
/// (each at most once). A stream of one layer (`Backward`) and one of a whole step (`Apply`, `Step`) are metered
/// alike, so neither an announced `u64::MAX` nor an endless stream makes a stage hold more than the model's
/// gradients.
pub struct GradMeter {
    /// Layers whose gradient has started.
    seen: Vec<bool>,
    /// The layer in progress: its number, announced weights and bias, and the bytes of each received so far.
    current: Option<(u32, [u64; 2], [u64; 2])>,
}

impl GradMeter {
    /// A meter for gradients of the model `limits` describes.
    pub fn new(limits: &Limits) -> Self {
        GradMeter { seen: vec![false; limits.layers.len()], current: None }
    }

    /// Checks the next chunk against `limits`, before the caller keeps it.
    pub fn check(&mut self, c: &GradChunk, limits: &Limits) -> Result<()> {
        let (layer, most, mut have) = match self.current {
            _ if c.first => {
                let shape = limits.layer(u64::from(c.layer))?;
                let l = c.layer;
                Error::check_limit(
                    || format!("layer {l} gradient's weights_len"),
                    c.weights_len,
                    Limits::weight_values(&shape),
                )?;
                Error::check_limit(|| format!("layer {l} gradient's bias_len"), c.bias_len, shape.vector_len() as u64)?;
                if self.seen.get_mut(l as usize).is_some_and(|seen| std::mem::replace(seen, true)) {
                    return Err(Error::Protocol(format!("layer {l}'s gradient arrived twice in one stream")));
                }
                (c.layer, [c.weights_len, c.bias_len], [0, 0])
            }
            None => return Err(Error::Protocol("a gradient stream must start with its header".into())),
            Some((layer, _, _)) if c.layer != layer => {
                return Err(Error::Protocol("gradient chunks of two layers are mixed".into()));
            }
            Some(current) => current,
        };
        for (i, (data, name)) in [(&c.weights, "weights"), (&c.bias, "bias")].into_iter().enumerate() {
            have[i] = have[i].saturating_add(data.len() as u64);
            Error::check_limit(
                || format!("layer {layer} gradient's {name} (values received, beyond what its header announced)"),
                have[i].div_ceil(4),
                most[i],
            )?;
        }
        self.current = Some((layer, most, have));
        Ok(())
    }
}

/// Puts a gradient back together, checking it against `limits` chunk by chunk (before anything is kept) and
/// that it is complete; the words go straight into typed buffers sized from the checked header.
pub fn decode_grad(chunks: impl IntoIterator<Item = GradChunk>, limits: &Limits) -> Result<LayerGrad> {
    let mut meter = GradMeter::new(limits);
    let mut header: Option<GradChunk> = None;
    let (mut weights, mut bias) = (Vec::<f32>::new(), Vec::<f32>::new());
    let mut done = false;
    for c in chunks {
        if done {
            return Err(Error::Protocol("a gradient chunk arrived after the last one".into()));
        }
        if header.is_some() && c.first {
            return Err(Error::Protocol("gradient chunks of two layers are mixed".into()));
        }
        meter.check(&c, limits)?;
        done = c.last;
        if header.is_none() {
            weights = Recycled::layers().take(c.weights_len.min(MAX_RESERVE) as usize);
            bias.reserve(c.bias_len.min(MAX_RESERVE) as usize);
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

/// Splits a stream of several layers' gradients at each layer's first chunk and decodes every layer.
pub fn decode_grads(chunks: impl IntoIterator<Item = GradChunk>, limits: &Limits) -> Result<Vec<LayerGrad>> {
    let mut meter = GradMeter::new(limits);
    let mut layers: Vec<Vec<GradChunk>> = Vec::new();
    for c in chunks {
        meter.check(&c, limits)?;
        match layers.last_mut() {
            Some(current) if !c.first => current.push(c),
            _ => layers.push(vec![c]),
        }
    }
    layers.into_iter().map(|chunks| decode_grad(chunks, limits)).collect()
}

/// Receives an `Apply` stream: the step's summed gradients, whose first chunk names the job and the step. A
/// stream of another job is refused before anything is applied, and every chunk is metered against the plan's
/// `limits` before it is kept, so an `Apply` can never make a stage hold more than the model's gradients.
pub async fn receive_grads(
    mut stream: tonic::Streaming<GradChunk>,
    job: &str,
    limits: &Limits,
) -> Result<Vec<GradChunk>, tonic::Status> {
    let mut meter = GradMeter::new(limits);
    let mut chunks = Vec::new();
    while let Some(c) = stream.message().await? {
        if chunks.is_empty() && c.job != job {
            return Err(tonic::Status::failed_precondition(format!(
                "gradients of job '{}' reached a stage of job '{job}'",
                c.job
            )));
        }
        meter.check(&c, limits).map_err(wire::status::to_status)?;
        chunks.push(c);
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `grads` as a stream whose every layer's weights and bias are cut into pieces of `words` 4-byte words, one
    /// piece a chunk after a header chunk of its own: another chunking a sender may choose.
    fn rechunked(grads: &[LayerGrad], words: usize) -> Vec<GradChunk> {
        let mut out = Vec::new();
        for g in grads {
            let layer = g.layer as u32;
            out.push(GradChunk {
                layer,
                first: true,
                weights_len: g.weights.len() as u64,
                bias_len: g.bias.len() as u64,
                ..GradChunk::default()
            });
            let (w, b): (Vec<u8>, Vec<u8>) = (
                g.weights.iter().flat_map(|x| x.to_le_bytes()).collect(),
                g.bias.iter().flat_map(|x| x.to_le_bytes()).collect(),
            );
            for piece in w.chunks(4 * words) {
                out.push(GradChunk { layer, weights: Bytes::copy_from_slice(piece), ..GradChunk::default() });
            }
            for piece in b.chunks(4 * words) {
                out.push(GradChunk { layer, bias: Bytes::copy_from_slice(piece), ..GradChunk::default() });
            }
            if let Some(last) = out.last_mut() {
                last.last = true;
            }
        }
        out
    }

    /// One change of a gradient stream on the wire: a byte, a header number, a flag, a chunk lost, repeated or
    /// moved, or an array no longer whole words.
    fn change(chunks: &mut Vec<GradChunk>, kind: u8, i: prop::sample::Index, j: prop::sample::Index, value: u64) {
        let n = chunks.len();
        if n == 0 {
            return; // Earlier changes removed every chunk: nothing left to change.
        }
        let (a, b) = (i.index(n), j.index(n));
        let c = &mut chunks[a];
        match kind % 8 {
            0 if !c.weights.is_empty() => {
                let mut bytes = c.weights.to_vec();
                let at = j.index(bytes.len());
                bytes[at] ^= 0x5a;
                c.weights = bytes.into();
            }
            1 => c.weights_len = value,
            2 => c.bias_len = value,
            3 => c.layer = u32::try_from(value).unwrap_or(u32::MAX),
            4 => (c.first, c.last) = (!c.first, value.is_multiple_of(2)),
            5 => {
                chunks.remove(a);
            }
            6 => {
                let copy = chunks[a].clone();
                chunks.insert(b, copy);
            }
            _ => {
                let mut bytes = c.bias.to_vec();
                bytes.push(value as u8);
                c.bias = bytes.into();
                chunks.swap(a, b);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// Fuzzing the gradient codec (proptest): a step's gradients in any chunking decode to themselves;
        /// changed on the way, they are refused with a reason or decode to gradients within the plan's shapes,
        /// each layer at most once; nothing panics.
        #[test]
        fn gradients_in_any_chunking_or_changed_decode_or_are_refused(
            lens in proptest::collection::vec((0usize..=40, 0usize..=5), 1..=3),
            words in 1usize..50,
            changes in proptest::collection::vec(
                (any::<u8>(), any::<prop::sample::Index>(), any::<prop::sample::Index>(),
                 prop_oneof![Just(u64::MAX), 0u64..50]),
                0..3,
            ),
        ) {
            let shape = plan::layout::LinearShape::new(8, 5, true);
            let limits = Limits { shard: 1, layers: vec![shape; 3], optimizer_values: 0 };
            let grads: Vec<LayerGrad> = lens
                .iter()
                .enumerate()
                .map(|(layer, &(w, b))| LayerGrad {
                    layer,
                    weights: (0..w).map(|i| i as f32 + layer as f32 / 8.0).collect(),
                    bias: vec![layer as f32; b],
                })
                .collect();
            let mut chunks = rechunked(&grads, words);
            for &(kind, i, j, value) in &changes {
                change(&mut chunks, kind, i, j, value);
            }
            match decode_grads(chunks, &limits) {
                Ok(back) if changes.is_empty() => prop_assert_eq!(back, grads),
                Ok(back) => {
                    let mut layers: Vec<usize> = back.iter().map(|g| g.layer).collect();
                    layers.sort_unstable();
                    layers.dedup();
                    prop_assert_eq!(layers.len(), back.len(), "a layer decoded twice");
                    for g in &back {
                        prop_assert!(g.layer < limits.layers.len());
                        prop_assert!(g.weights.len() as u64 <= Limits::weight_values(&shape));
                        prop_assert!(g.bias.len() <= shape.vector_len());
                    }
                }
                Err(e) => prop_assert!(!changes.is_empty(), "the unchanged stream was refused: {e}"),
            }
        }
    }

    /// Two layers of 600,000 weights and 5 outputs.
    fn limits() -> Limits {
        Limits { shard: 1, layers: vec![plan::layout::LinearShape::new(120_000, 5, false); 2], optimizer_values: 0 }
    }

    #[test]
    fn gradients_round_trip_and_a_cut_stream_is_refused() {
        let g = LayerGrad { layer: 1, weights: (0..600_000).map(|i| i as f32).collect(), bias: vec![2.0; 5] };
        assert_eq!(decode_grad(encode_grad_owned(g.clone()), &limits()).unwrap(), g);
        // A gradient cut short.
        let mut g = encode_grad_owned(LayerGrad { layer: 0, weights: vec![1.0; 300_000], bias: vec![0.0; 3] });
        g.pop();
        assert!(decode_grad(g, &limits()).is_err());
    }

    #[test]
    fn gradients_beyond_the_plan_are_refused() {
        let over = |e: Error| match e {
            Error::OverLimit { what, value, limit } => (what, value, limit),
            other => panic!("{other:?}"),
        };
        let g = LayerGrad { layer: 1, weights: vec![1.0; 600_000], bias: vec![2.0; 5] };
        // A header announcing u64::MAX weights.
        let mut huge = encode_grad_owned(g.clone());
        huge[0].weights_len = u64::MAX;
        let (what, value, limit) = over(decode_grad(huge, &limits()).unwrap_err());
        assert!(what.contains("layer 1 gradient's weights_len"), "{what}");
        assert_eq!((value, limit), (u64::MAX, 600_000));
        // A stream that keeps going past what it announced.
        let mut long = encode_grad_owned(g.clone());
        let extra = long[1].clone();
        if let Some(c) = long.last_mut() {
            c.last = false;
        }
        long.push(GradChunk { first: false, ..extra });
        assert!(over(decode_grad(long, &limits()).unwrap_err()).0.contains("weights"));
        // A whole step's stream naming one layer twice, and one naming a layer the model lacks.
        let twice = encode_grads(vec![g.clone(), g.clone()]);
        assert!(decode_grads(twice, &limits()).unwrap_err().to_string().contains("twice"));
        let other = encode_grads(vec![LayerGrad { layer: 9, ..g }]);
        assert!(decode_grads(other, &limits()).unwrap_err().to_string().contains("layer 9"));
    }
}
