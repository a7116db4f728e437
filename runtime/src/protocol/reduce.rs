//! The reduction SwarmX performs: engines' gradients of the same layers summed, one layer or a whole step at a
//! time. Kept beside [`LayerGrad`] rather than in a codec, since a summed gradient is the same message whether it
//! came over the wire or from an engine in this process.

use super::LayerGrad;
use wire::error::{Error, Result};

impl LayerGrad {
    /// Adds another engine's gradients: the reduction SwarmX performs.
    pub fn add(&mut self, other: &LayerGrad) -> Result<(), String> {
        if other.layer != self.layer
            || other.weights.len() != self.weights.len()
            || other.bias.len() != self.bias.len()
        {
            return Err(format!(
                "cannot sum gradients of layer {} ({} + {} values) with layer {} ({} + {} values)",
                self.layer,
                self.weights.len(),
                self.bias.len(),
                other.layer,
                other.weights.len(),
                other.bias.len()
            ));
        }
        for (a, b) in self.weights.iter_mut().zip(&other.weights) {
            *a += b;
        }
        for (a, b) in self.bias.iter_mut().zip(&other.bias) {
            *a += b;
        }
        Ok(())
    }
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
