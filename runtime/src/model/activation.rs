//! Element-wise non-linearities and their derivatives. The engine keeps the pre-activation `z` from the
//! forward pass, so the backward pass needs no weights here.

use crds::Activation;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// `a = f(z)` element-wise.
pub fn forward(kind: Activation, z: &[f32], a: &mut [f32]) {
    match kind {
        Activation::Relu => {
            for (o, &x) in a.iter_mut().zip(z) {
                *o = x.max(0.0);
            }
        }
        Activation::Gelu => {
            for (o, &x) in a.iter_mut().zip(z) {
                let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
                *o = 0.5 * x * (1.0 + u.tanh());
            }
        }
    }
}

/// `dz = f'(z) · da` element-wise, in place over `da`.
pub fn backward(kind: Activation, z: &[f32], da: &mut [f32]) {
    match kind {
        Activation::Relu => {
            for (d, &x) in da.iter_mut().zip(z) {
                if x <= 0.0 {
                    *d = 0.0;
                }
            }
        }
        Activation::Gelu => {
            for (d, &x) in da.iter_mut().zip(z) {
                let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
                let t = u.tanh();
                let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
                *d *= 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_match_central_differences() {
        // Points away from ReLU's kink at 0, where the derivative is not defined.
        let z: Vec<f32> = vec![-2.5, -1.0, -0.3, 0.2, 0.7, 1.5, 3.0];
        for kind in [Activation::Relu, Activation::Gelu] {
            let mut g = vec![1.0; z.len()];
            backward(kind, &z, &mut g);
            for (i, &x) in z.iter().enumerate() {
                let h = 1e-3f32;
                let (mut hi, mut lo) = ([0.0f32], [0.0f32]);
                forward(kind, &[x + h], &mut hi);
                forward(kind, &[x - h], &mut lo);
                let fd = (hi[0] - lo[0]) / (2.0 * h);
                assert!((fd - g[i]).abs() < 2e-3, "{kind:?} at {x}: analytic {} vs numeric {fd}", g[i]);
            }
        }
    }
}
