//! The SwiGLU gate of a Llama-family MLP: `silu(gate) ⊙ up`, where the gate and up projections arrive stacked
//! as one stream unit's output (gate rows first). Element-wise over feature-major rows.

use rayon::prelude::*;

use kernels::tensor::Mat;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `silu(gate) ⊙ up` (`hidden × tokens`) from the stacked projections `u` (`2·hidden × tokens`).
pub fn forward(u: &Mat) -> Mat {
    let (hidden, n) = (u.rows / 2, u.cols);
    let (gate, up) = u.data.split_at(hidden * n);
    let mut h = Mat::zeros(hidden, n);
    h.data.par_chunks_mut(n.max(1)).zip(gate.par_chunks(n.max(1))).zip(up.par_chunks(n.max(1))).for_each(
        |((h, g), up)| {
            for ((h, &g), &up) in h.iter_mut().zip(g).zip(up) {
                *h = g * sigmoid(g) * up;
            }
        },
    );
    h
}

/// The gradient of the stacked projections given `dh`, the gradient of the gate's output.
pub fn backward(u: &Mat, dh: &Mat) -> Mat {
    let (hidden, n) = (u.rows / 2, u.cols);
    assert_eq!((dh.rows, dh.cols), (hidden, n), "swiglu backward: the gradient must be {hidden}x{n}");
    let (gate, up) = u.data.split_at(hidden * n);
    let mut du = Mat::zeros(2 * hidden, n);
    let (dgate, dup) = du.data.split_at_mut(hidden * n);
    let w = n.max(1);
    dgate
        .par_chunks_mut(w)
        .zip(dup.par_chunks_mut(w))
        .zip(gate.par_chunks(w).zip(up.par_chunks(w)))
        .zip(dh.data.par_chunks(w))
        .for_each(|(((dg, du), (g, up)), dh)| {
            for j in 0..dg.len() {
                let s = sigmoid(g[j]);
                du[j] = dh[j] * g[j] * s;
                dg[j] = dh[j] * up[j] * s * (1.0 + g[j] * (1.0 - s));
            }
        });
    du
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gradcheck::{assert_central_differences, weighted_sum};

    #[test]
    fn backward_matches_central_differences() {
        let (hidden, n) = (3, 4);
        let u = Mat::from_vec(2 * hidden, n, (0..2 * hidden * n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.4).collect());
        let w = Mat::from_vec(hidden, n, (0..hidden * n).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.25).collect());
        let du = backward(&u, &w);
        assert_central_differences(&u, &du, (1e-2, 2e-3), "u", |u| weighted_sum(&forward(u), &w));
    }
}
