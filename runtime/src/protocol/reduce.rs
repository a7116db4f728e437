//! The reduction SwarmX performs: engines' gradients of the same layers summed, one layer or a whole step at a
//! time. Kept beside [`LayerGrad`] rather than in a codec, since a summed gradient is the same message whether it
//! came over the wire or from an engine in this process.
//!
//! Every sum is *pairwise* ([`Pairwise`]): parts are added as the leaves of a balanced binary tree, in order. A
//! step's batch is cut into equal micro-batches (the full job's shards), each computed alone; an engine sums its
//! micro-batches and SwarmX sums its children the same way, so whenever the counts are powers of two the
//! additions happen in the same grouping however the micro-batches are spread over engines and SwarmX nodes.
//! That is what keeps a job that continues on fewer CS-2s on the curve of the full job, bit for bit.

use super::LayerGrad;
use crate::model::loss::LossSum;
use errors::{Error, Result};

impl LayerGrad {
    /// Adds another engine's gradients: the reduction SwarmX performs.
    pub fn add(&mut self, other: &LayerGrad) -> Result<(), String> {
        if other.layer != self.layer || other.weights.len() != self.weights.len() || other.bias.len() != self.bias.len()
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

/// Something SwarmX sums: one layer's gradient, or a whole step's.
pub trait Summable: Sized {
    /// Adds `other` into `self` (`self` is the earlier part).
    fn add_part(&mut self, other: Self) -> Result<()>;
}

impl Summable for LayerGrad {
    fn add_part(&mut self, other: Self) -> Result<()> {
        self.add(&other).map_err(Error::Protocol)
    }
}

impl Summable for LossSum {
    fn add_part(&mut self, other: Self) -> Result<()> {
        self.add(&other);
        Ok(())
    }
}

impl Summable for Vec<LayerGrad> {
    fn add_part(&mut self, other: Self) -> Result<()> {
        if self.len() != other.len() {
            return Err(Error::Protocol(format!(
                "gradients of {} layers cannot be summed with {}",
                other.len(),
                self.len()
            )));
        }
        for (a, b) in self.iter_mut().zip(&other) {
            a.add(b).map_err(Error::Protocol)?;
        }
        Ok(())
    }
}

/// A running pairwise sum of parts pushed in order: part `i` is a leaf of a balanced binary tree and two
/// subtrees are added as soon as they are of equal size, so at most `log2(parts) + 1` partial sums are held.
/// For `2^k` parts the result is `((p0 + p1) + (p2 + p3)) + …` whoever computed which subtree.
pub struct Pairwise<T> {
    /// Partial sums with the number of parts each covers, largest first.
    stack: Vec<(T, usize)>,
}

impl<T> Default for Pairwise<T> {
    fn default() -> Self {
        Pairwise { stack: Vec::new() }
    }
}

impl<T: Summable> Pairwise<T> {
    /// Adds the next part.
    pub fn push(&mut self, part: T) -> Result<()> {
        let mut top = (part, 1);
        while let Some((_, size)) = self.stack.last() {
            if *size != top.1 {
                break;
            }
            let (mut left, size) = self.stack.pop().ok_or_else(|| Error::Protocol("pairwise sum underflow".into()))?;
            left.add_part(top.0)?;
            top = (left, size * 2);
        }
        self.stack.push(top);
        Ok(())
    }

    /// The sum of every part pushed (the smaller trailing subtrees added right to left), or `None` when there
    /// was none.
    pub fn finish(mut self) -> Result<Option<T>> {
        let Some((mut sum, _)) = self.stack.pop() else { return Ok(None) };
        while let Some((mut left, _)) = self.stack.pop() {
            left.add_part(sum)?;
            sum = left;
        }
        Ok(Some(sum))
    }

    /// The pairwise sum of `parts`, in order.
    pub fn of(parts: impl IntoIterator<Item = T>) -> Result<Option<T>> {
        let mut sum = Pairwise::default();
        for p in parts {
            sum.push(p)?;
        }
        sum.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grad(v: f32) -> LayerGrad {
        LayerGrad { layer: 0, weights: vec![v], bias: vec![] }
    }

    fn sum(parts: &[f32]) -> f32 {
        Pairwise::of(parts.iter().map(|&v| grad(v))).unwrap().unwrap().weights[0]
    }

    /// Values chosen so that every grouping of the four gives a different f32 sum: the test fails unless the
    /// grouping is the balanced tree, however the parts were first combined.
    #[test]
    fn four_parts_sum_as_a_balanced_tree_whoever_combined_the_halves() {
        let p = [1.0e8_f32, 3.0, -1.0e8, 5.0];
        let tree = (p[0] + p[1]) + (p[2] + p[3]);
        assert_ne!(tree, ((p[0] + p[1]) + p[2]) + p[3], "the values must tell the groupings apart");
        assert_eq!(sum(&p), tree);
        // Two engines with two micro-batches each, then SwarmX over the two: the same bits.
        let halves = [sum(&p[..2]), sum(&p[2..])];
        assert_eq!(sum(&halves), tree);
        // Eight parts as four pairs, or as two halves of four.
        let q = [1.0e8_f32, 3.0, -1.0e8, 5.0, 7.0e7, -2.0, 1.5, -7.0e7];
        let pairs: Vec<f32> = q.chunks(2).map(sum).collect();
        let halves: Vec<f32> = q.chunks(4).map(sum).collect();
        assert_eq!(sum(&q), sum(&pairs));
        assert_eq!(sum(&q), sum(&halves));
    }

    #[test]
    fn odd_counts_and_mismatches() {
        assert_eq!(sum(&[1.0, 2.0, 4.0]), (1.0 + 2.0) + 4.0);
        assert!(Pairwise::<LayerGrad>::of([]).unwrap().is_none());
        let bad = Pairwise::of([grad(1.0), LayerGrad { layer: 1, weights: vec![1.0], bias: vec![] }]);
        assert!(bad.is_err(), "gradients of different layers are refused");
    }
}
