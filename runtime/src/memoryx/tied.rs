//! Tied weights: a layer that reads another layer's first values (a GPT's head reads the token embedding)
//! stores nothing of its own, so its weight gradient must be added to the target's before the target's
//! optimizer step. The two gradients of a step arrive as separate `apply` calls, the tied layer's first (the
//! backward pass runs from the head down), so the tied one is held here until its target's arrives.

use std::borrow::Cow;
use std::sync::Mutex;

use crate::protocol::LayerGrad;
use errors::{Error, Result};

/// A tied layer's weight gradient waiting for its target layer's.
#[derive(Debug)]
struct Held {
    /// The step it belongs to.
    step: u64,
    /// The layer whose weights the tied layer reads.
    target: usize,
    /// The gradient of the target's first values.
    weights: Vec<f32>,
}

/// The one tied gradient in flight. A mutex rather than a field of a layer's lock, since the tied layer and its
/// target are applied under different layers' locks.
#[derive(Debug, Default)]
pub(super) struct TiedGrad(Mutex<Option<Held>>);

impl TiedGrad {
    /// Hands over `grad` of `step` and takes back what it waits for. When its layer is tied to `tied_to`, its
    /// weight gradient is held for that target; when a held gradient targets `grad`'s layer, it is added to
    /// `weights` (the layer's own weight gradient, in stored order; copied only then), refused if it is of another
    /// step or longer than the layer.
    pub(super) fn exchange(
        &self,
        grad: &LayerGrad,
        tied_to: Option<usize>,
        step: u64,
        weights: &mut Cow<'_, [f32]>,
    ) -> Result<()> {
        let mut held = self.0.lock().map_err(|_| Error::Protocol("tied gradient lock poisoned".into()))?;
        if let Some(target) = tied_to {
            *held = Some(Held { step, target, weights: grad.weights.clone() });
        }
        if let Some(Held { step: at, weights: extra, .. }) = held.take_if(|h| h.target == grad.layer) {
            if at != step || extra.len() > weights.len() {
                return Err(Error::Protocol(format!(
                    "the tied gradient held for layer {} is of step {at}, not {step}, or too long",
                    grad.layer
                )));
            }
            for (g, e) in weights.to_mut().iter_mut().zip(&extra) {
                *g += e;
            }
        }
        Ok(())
    }
}
