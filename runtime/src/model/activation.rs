//! Element-wise non-linearities and their derivatives. The engine keeps the pre-activation `z` from the
//! forward pass, so the backward pass needs no weights here.

use std::mem::MaybeUninit;

use crds::Activation;

use kernels::tensor::{Mat, PIECE, fill_beside, rows_per_piece, written_once, written_once_beside};
use kernels::tiles::{Acts, TILE, Tiles};
use multiversion::multiversion;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// `e^x` in plain float arithmetic (range reduction by ln 2, a degree-6 polynomial, the exponent written
/// into the bits), so loops over it vectorise instead of calling libm once per element; relative error
/// about 2e-7. Transformers spend a large share of their element-wise time here, in GELU and softmax.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding and subtracting it rounds to the nearest integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // The integer `n` sits in the low mantissa bits of `shifted` (|n| ≤ 127 < 2^22): reading it from the bits
    // keeps the whole function in integer and float lanes, where `n as i32` (a saturating conversion) would
    // stop the loops around it from vectorising.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    p * f32::from_bits((n_int.wrapping_add(127) << 23) as u32)
}

/// tanh-GELU's value and slope at `x`, from one `tanh`: the formulas every pass shares (a pass that needs only
/// one of them lets the compiler drop the other's arithmetic).
#[inline(always)]
fn gelu(x: f32) -> (f32, f32) {
    let t = tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
    (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
}

/// `tanh(x)` through [`exp`], for the same reason.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `f(z)` element-wise as a new vector, large arrays on all cores. Each element is written once: the output is
/// not zeroed first (at a transformer's MLP width that zeroing was a pass over 8 MB per block).
pub fn forward(kind: Activation, z: &[f32]) -> Vec<f32> {
    // SAFETY: `forward_slice` writes every slot of the piece it is given (one per input; it checks the lengths).
    unsafe { written_once(z.len(), PIECE, |start, out| forward_slice(kind, &z[start..start + out.len()], out)) }
}

/// `f(z)` as a new vector, with `z` overwritten by `f'(z)`: for a pre-activation kept only for its derivative
/// (the transformer's MLP), one pass computes each `tanh` once, and the backward pass is the multiply
/// [`scale_by_slope`] instead of a second pass of transcendentals. Bit for bit what [`forward`] and
/// [`backward`] give.
///
/// With a `row_bias` (one value per row of `z`, which then holds `row_bias.len()` rows), each row's bias is
/// added to its pre-activations first, in the same pass: the layer before leaves its bias to this pass
/// rather than writing it over its whole output before the product and reading it back.
pub fn forward_keeping_slope(kind: Activation, z: &mut [f32], row_bias: &[f32]) -> Vec<f32> {
    let cols = z.len().checked_div(row_bias.len()).unwrap_or(0);
    assert!(
        row_bias.is_empty() || cols * row_bias.len() == z.len(),
        "activation: {} values are not rows for {} biases",
        z.len(),
        row_bias.len()
    );
    // Pieces of whole rows, so each knows its rows' biases.
    let piece = if cols == 0 { PIECE } else { cols * rows_per_piece(cols) };
    let bias_of = |start: usize, len: usize| match (start.checked_div(cols), (start + len).checked_div(cols)) {
        (Some(first), Some(end)) => &row_bias[first..end],
        _ => &[][..],
    };
    // SAFETY: `forward_slope_slice` writes every slot of the piece it is given (one per input; it checks).
    unsafe { written_once_beside(z, piece, |start, out, z| forward_slope_slice(kind, z, out, bias_of(start, z.len()))) }
}

/// [`forward_keeping_slope`] over an activation in either layout, the output in the same layout: in tiles each
/// lane is a row of [`TILE`] values with its feature's bias, and the padding is cleared after (`f(0 + b)` is not
/// zero). Each value is computed exactly as in rows.
pub fn forward_keeping_slope_acts(kind: Activation, z: &mut Acts, row_bias: &[f32]) -> Acts {
    let t = match z {
        Acts::Rows(m) => {
            return Acts::Rows(Mat::from_vec(m.rows, m.cols, forward_keeping_slope(kind, &mut m.data, row_bias)));
        }
        Acts::Tiles(t) => t,
    };
    let (rows, tokens) = (t.rows(), t.tokens());
    assert!(row_bias.is_empty() || row_bias.len() == rows, "activation: {} biases for {rows} rows", row_bias.len());
    // A bias per lane, lane after lane as the tiles hold them: one value per feature per tile (a few KiB).
    let lane_bias: Vec<f32> = if row_bias.is_empty() { Vec::new() } else { row_bias.repeat(Tiles::count(tokens)) };
    let piece = TILE * rows_per_piece(TILE);
    let lane_bias_of = |start: usize, len: usize| match lane_bias.is_empty() {
        true => &[][..],
        false => &lane_bias[start / TILE..(start + len) / TILE],
    };
    let z_values = t.values_mut();
    // SAFETY: `forward_slope_slice` writes every slot of the piece it is given, and the pieces cover the whole
    // output (`fill_beside` hands out all of it).
    let a = unsafe {
        Tiles::written_once(rows, tokens, |out| {
            fill_beside(out, z_values, piece, |start, out, z| {
                forward_slope_slice(kind, z, out, lane_bias_of(start, z.len()))
            })
        })
    };
    // The output's padding is cleared by `written_once`; the slopes' here.
    t.clear_padding();
    Acts::Tiles(a)
}

/// `da *= slope` element-wise, large arrays on all cores: the backward pass through an activation whose slope
/// [`forward_keeping_slope`] kept.
pub fn scale_by_slope(slope: &[f32], da: &mut [f32]) {
    use rayon::prelude::*;
    assert_eq!(slope.len(), da.len(), "activation: one slope per gradient");
    da.par_chunks_mut(PIECE).zip(slope.par_chunks(PIECE)).for_each(|(d, s)| scale_slice(s, d));
}

/// Multiversioned like [`forward_slice`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn scale_slice(slope: &[f32], da: &mut [f32]) {
    for (d, &s) in da.iter_mut().zip(slope) {
        *d *= s;
    }
}

/// `a = f(z + b)` and `z ← f'(z + b)` over one piece, `b` each row's bias (none when `bias` is empty, else the
/// piece is `bias.len()` whole rows); the formulas are [`forward_slice`]'s and [`backward_slice`]'s.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn forward_slope_slice(kind: Activation, z: &mut [f32], a: &mut [MaybeUninit<f32>], bias: &[f32]) {
    assert_eq!(a.len(), z.len(), "activation: one output per input");
    if bias.is_empty() {
        return forward_slope_row(kind, z, a, None);
    }
    let cols = z.len() / bias.len();
    assert_eq!(cols * bias.len(), z.len(), "activation: a piece of whole rows");
    for ((z, a), &b) in z.chunks_exact_mut(cols).zip(a.chunks_exact_mut(cols)).zip(bias) {
        forward_slope_row(kind, z, a, Some(b));
    }
}

/// [`forward_slope_slice`] over one row (or a whole piece without a bias).
#[inline(always)]
fn forward_slope_row(kind: Activation, z: &mut [f32], a: &mut [MaybeUninit<f32>], bias: Option<f32>) {
    let (add, b) = (bias.is_some(), bias.unwrap_or(0.0));
    match kind {
        Activation::Relu => {
            for (o, x) in a.iter_mut().zip(z) {
                let v = if add { *x + b } else { *x };
                o.write(v.max(0.0));
                *x = if v <= 0.0 { 0.0 } else { 1.0 };
            }
        }
        Activation::Gelu => {
            for (o, x) in a.iter_mut().zip(z) {
                let (value, slope) = gelu(if add { *x + b } else { *x });
                o.write(value);
                *x = slope;
            }
        }
    }
}

/// `dz = f'(z) · da` element-wise, in place over `da`, large arrays on all cores.
pub fn backward(kind: Activation, z: &[f32], da: &mut [f32]) {
    use rayon::prelude::*;
    if z.len() < 2 * PIECE {
        return backward_slice(kind, z, da);
    }
    da.par_chunks_mut(PIECE).zip(z.par_chunks(PIECE)).for_each(|(da, z)| backward_slice(kind, z, da));
}

/// Compiled for AVX2+FMA as well as the baseline, picked at run time: the release build targets plain x86-64,
/// where these loops run four lanes wide without fused multiply-adds.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn forward_slice(kind: Activation, z: &[f32], a: &mut [MaybeUninit<f32>]) {
    assert_eq!(a.len(), z.len(), "activation: one output per input");
    match kind {
        Activation::Relu => {
            for (o, &x) in a.iter_mut().zip(z) {
                o.write(x.max(0.0));
            }
        }
        Activation::Gelu => {
            for (o, &x) in a.iter_mut().zip(z) {
                o.write(gelu(x).0);
            }
        }
    }
}

/// Multiversioned for the same reason as [`forward_slice`].
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn backward_slice(kind: Activation, z: &[f32], da: &mut [f32]) {
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
                *d *= gelu(x).1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_tanh_match_libm() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.04;
            let (e, t) = (exp(x), tanh(x));
            assert!(((e - x.exp()) / x.exp()).abs() < 1e-6, "exp({x}) = {e}, libm {}", x.exp());
            assert!((t - x.tanh()).abs() < 1e-6, "tanh({x}) = {t}, libm {}", x.tanh());
        }
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn derivatives_match_central_differences() {
        // Points away from ReLU's kink at 0, where the derivative is not defined.
        let z: Vec<f32> = vec![-2.5, -1.0, -0.3, 0.2, 0.7, 1.5, 3.0];
        for kind in [Activation::Relu, Activation::Gelu] {
            let mut g = vec![1.0; z.len()];
            backward(kind, &z, &mut g);
            for (i, &x) in z.iter().enumerate() {
                let h = 1e-3f32;
                let (hi, lo) = (forward(kind, &[x + h]), forward(kind, &[x - h]));
                let fd = (hi[0] - lo[0]) / (2.0 * h);
                assert!((fd - g[i]).abs() < 2e-3, "{kind:?} at {x}: analytic {} vs numeric {fd}", g[i]);
            }
        }
    }

    /// The slope kept by the forward pass gives what the backward pass computes from the pre-activation, bit for
    /// bit, over more values than one parallel piece.
    #[test]
    fn the_kept_slope_gives_the_backward_pass_bit_for_bit() {
        let n = 3 * PIECE + 17;
        let z: Vec<f32> = (0..n).map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 0.004).collect();
        let da: Vec<f32> = (0..n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 0.01).collect();
        for kind in [Activation::Relu, Activation::Gelu] {
            let mut slope = z.clone();
            let a = forward_keeping_slope(kind, &mut slope, &[]);
            assert_eq!(a, forward(kind, &z), "{kind:?}: activation");
            let (mut want, mut got) = (da.clone(), da.clone());
            backward(kind, &z, &mut want);
            scale_by_slope(&slope, &mut got);
            assert!(want.iter().zip(&got).all(|(w, g)| w == g), "{kind:?}: gradient");
        }
    }

    /// GELU over the MLP's hidden layer in tiles gives the rows' values bit for bit, slope included, with each
    /// feature's bias (over enough lanes for several pieces), and leaves zeros in the padding (where `f(0 + b)`
    /// would not be zero).
    #[test]
    fn tiles_give_the_rows_values_and_zero_padding() {
        use kernels::tiles::{Acts, TILE, Tiles};
        let (rows, tokens) = (300, TILE + 37);
        let z: Vec<f32> = (0..rows * tokens).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect();
        let bias: Vec<f32> = (0..rows).map(|r| 0.01 * r as f32 - 0.7).collect();
        let mut in_rows = Acts::Rows(Mat::from_vec(rows, tokens, z));
        let mut in_tiles = match &in_rows {
            Acts::Rows(m) => Acts::Tiles(Tiles::from_rows(m)),
            Acts::Tiles(_) => unreachable!(),
        };
        let a_rows = forward_keeping_slope_acts(Activation::Gelu, &mut in_rows, &bias);
        let a_tiles = forward_keeping_slope_acts(Activation::Gelu, &mut in_tiles, &bias);
        let Acts::Tiles(t) = &a_tiles else { panic!("tiles in, tiles out") };
        assert!(t.lanes()[t.lanes().len() - rows..].iter().all(|l| l.0[37..].iter().all(|&v| v == 0.0)), "padding");
        assert_eq!(a_tiles.into_rows(), a_rows.into_rows(), "values");
        assert_eq!(in_tiles.into_rows(), in_rows.into_rows(), "slopes");
    }

    /// A row bias added in the activation's pass is the bias added before it, over rows that split into
    /// several pieces and rows wider than one.
    #[test]
    fn a_row_bias_is_added_before_the_activation() {
        for (rows, cols) in [(7, 3 * PIECE / 2 + 5), (3 * PIECE / 100 + 1, 100)] {
            let z: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 0.004).collect();
            let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.37 - 1.0).collect();
            let biased: Vec<f32> = z.iter().enumerate().map(|(i, v)| v + bias[i / cols]).collect();
            for kind in [Activation::Relu, Activation::Gelu] {
                let (mut got_slope, mut want_slope) = (z.clone(), biased.clone());
                let got = forward_keeping_slope(kind, &mut got_slope, &bias);
                let want = forward_keeping_slope(kind, &mut want_slope, &[]);
                assert_eq!(got, want, "{kind:?} {rows}x{cols}: activation");
                assert_eq!(got_slope, want_slope, "{kind:?} {rows}x{cols}: slope");
            }
        }
    }
}
