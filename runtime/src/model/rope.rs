//! Rotary position embeddings, as Llama-family attention encodes positions: each query and key head's
//! features `i` and `i + head_dim/2` are rotated together by `position · θ^(−2i/head_dim)` (the "rotate half"
//! pairing of `transformers`). Rotations are orthogonal, so the backward pass is the same rotation by the
//! opposite angle. The angles are computed once per shape, as `transformers` computes them (single-precision
//! frequencies and products), so a pretrained model sees the positions it was trained with.

use rayon::prelude::*;

use kernels::tensor::Mat;

/// The cosines and sines of every (frequency, position) pair of one head size and context.
#[derive(Clone, Debug, Default)]
pub struct Rope {
    half: usize,
    context: usize,
    /// `half × context`, row = frequency.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// The table for heads of `head_dim` features (even) over sequences of `context` tokens, base `theta`.
    pub fn new(head_dim: usize, context: usize, theta: f64) -> Self {
        let half = head_dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(half * context), Vec::with_capacity(half * context));
        for i in 0..half {
            let inv_freq = (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32;
            for p in 0..context {
                let angle = (p as f32 * inv_freq) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rope { half, context, cos, sin }
    }

    /// Rotates the first `heads` heads of `m` (`features × tokens`, each head `2·half` rows, tokens in whole
    /// sequences) in place, by each token's position in its sequence; by the opposite angles when `inverse`
    /// (the backward pass).
    pub fn rotate(&self, m: &mut Mat, heads: usize, inverse: bool) {
        let (half, n, t) = (self.half, m.cols, self.context.max(1));
        if half == 0 || n == 0 {
            return;
        }
        let sign = if inverse { -1.0f32 } else { 1.0 };
        m.data[..heads * 2 * half * n].par_chunks_mut(2 * half * n).for_each(|head| {
            let (low, high) = head.split_at_mut(half * n);
            for i in 0..half {
                let (cos, sin) = (
                    &self.cos[i * self.context..(i + 1) * self.context],
                    &self.sin[i * self.context..(i + 1) * self.context],
                );
                let (a, b) = (&mut low[i * n..(i + 1) * n], &mut high[i * n..(i + 1) * n]);
                for (a, b) in a.chunks_mut(t).zip(b.chunks_mut(t)) {
                    for (j, (x1, x2)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
                        let (c, sn) = (cos[j], sign * sin[j]);
                        let (v1, v2) = (*x1, *x2);
                        *x1 = v1 * c - v2 * sn;
                        *x2 = v2 * c + v1 * sn;
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_undoes_the_rotation_and_position_zero_is_unrotated() {
        let (dh, context, seqs, heads) = (8, 5, 2, 3);
        let n = context * seqs;
        let rope = Rope::new(dh, context, 10_000.0);
        let m = Mat::from_vec(heads * dh, n, (0..heads * dh * n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect());
        let mut r = m.clone();
        rope.rotate(&mut r, heads, false);
        for row in 0..heads * dh {
            for s in 0..seqs {
                assert_eq!(
                    r.data[row * n + s * context],
                    m.data[row * n + s * context],
                    "position 0 of every sequence"
                );
            }
        }
        assert_ne!(r.data, m.data);
        rope.rotate(&mut r, heads, true);
        for (a, b) in r.data.iter().zip(&m.data) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    /// Relative positions: the dot product of a rotated query and key depends only on their distance.
    #[test]
    fn scores_depend_on_distance_only() {
        let (dh, context) = (4, 6);
        let rope = Rope::new(dh, context, 100.0);
        let q: Vec<f32> = vec![0.3, -0.2, 0.5, 0.1];
        let k: Vec<f32> = vec![-0.4, 0.25, 0.2, 0.6];
        let at = |v: &[f32]| {
            let mut m = Mat::from_vec(dh, context, (0..dh).flat_map(|r| std::iter::repeat_n(v[r], context)).collect());
            rope.rotate(&mut m, 1, false);
            m
        };
        let (qm, km) = (at(&q), at(&k));
        let score =
            |i: usize, j: usize| (0..dh).map(|r| qm.data[r * context + i] * km.data[r * context + j]).sum::<f32>();
        assert!((score(3, 1) - score(2, 0)).abs() < 1e-5);
        assert!((score(5, 2) - score(3, 0)).abs() < 1e-5);
    }
}
