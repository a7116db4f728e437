//! The gradient codec: a [`LayerGrad`] cut into [`GradChunk`]s that share its memory, several layers' chunks
//! in one stream, and the checked way back.

use bytes::Bytes;

use super::chunk::{extend_words, pieces, Words, MAX_RESERVE};
use crate::error::{Error, Result};
use crate::protocol::pb::GradChunk;
use crate::protocol::LayerGrad;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_round_trip_and_a_cut_stream_is_refused() {
        let g = LayerGrad { layer: 1, weights: (0..600_000).map(|i| i as f32).collect(), bias: vec![2.0; 5] };
        assert_eq!(decode_grad(encode_grad(&g)).unwrap(), g);
        // A gradient cut short.
        let mut g = encode_grad(&LayerGrad { layer: 0, weights: vec![1.0; 300_000], bias: vec![0.0; 3] });
        g.pop();
        assert!(decode_grad(g).is_err());
    }
}
