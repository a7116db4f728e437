//! The linear layer `Y = W·X + b`, dense through GEMM or sparse through the AXPY kernels. Activations are
//! feature-major (`features × tokens`), so `W` is used as stored (`outputs × inputs`, row-major).

use std::mem::MaybeUninit;

use kernels::tensor::{Mat, written_once};
use kernels::tiles::{Acts, ActsRef, Layout, TILE, Tiles};
use kernels::{dense, small, sparse, sparse::SparsePattern};

/// The weights of one layer as the engine receives them.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// All `outputs × inputs` values, row-major.
    Dense(&'a [f32]),
    /// The non-zeros of a mask in the pattern's storage order. In the forward pass the pattern is stored by
    /// output rows; in the backward pass by input columns, which is the order `dX = Wᵀ·dY` consumes them in.
    Sparse {
        /// Where the non-zeros are.
        pattern: &'a SparsePattern,
        /// Their values, in the pattern's order.
        values: &'a [f32],
    },
}

/// Forward: `W·X + b` for `X` of `inputs × tokens`.
pub fn forward(w: Weights<'_>, bias: &[f32], x: &Mat) -> Mat {
    let mut y = match w {
        Weights::Dense(values) => {
            let outputs = values.len() / x.rows.max(1);
            let w = dense::MatView::new(values, outputs, x.rows);
            if bias.len() == outputs && outputs > 0 && x.cols > 0 {
                // The bias is the product's starting value: one pass over the output instead of two.
                let mut data = broadcast_rows(bias, x.cols);
                dense::matmul(&mut data, w, x.view(), true);
                return Mat::from_vec(outputs, x.cols, data);
            }
            Mat::from_vec(outputs, x.cols, dense::product(w, x.view()))
        }
        Weights::Sparse { pattern, values } => sparse::gather(pattern, values, x),
    };
    add_row_bias(&mut y, bias);
    y
}

/// [`forward`] over an input in either layout, the output in rows: the sparse kernel reads tiles as they are,
/// dense weights read rows (unpacked from tiles if need be).
pub fn forward_from(w: Weights<'_>, bias: &[f32], x: ActsRef<'_>) -> Mat {
    match (w, x) {
        (Weights::Sparse { pattern, values }, ActsRef::Tiles(_)) => {
            // As `forward` does on rows: the gather, then the bias.
            let mut y = sparse::gather_as(pattern, values, x, Layout::Rows).into_rows();
            add_row_bias(&mut y, bias);
            y
        }
        _ => forward(w, bias, &x.to_rows()),
    }
}

/// Forward without a bias over an input in either layout, the output in `layout` when the sparse kernel
/// takes it (see [`Layout::Tiles`]); dense weights read rows, unpacked from tiles if need be.
pub fn forward_as(w: Weights<'_>, x: ActsRef<'_>, layout: Layout) -> Acts {
    match w {
        Weights::Dense(_) => Acts::Rows(forward(w, &[], &x.to_rows())),
        Weights::Sparse { pattern, values } => sparse::gather_as(pattern, values, x, layout),
    }
}

/// Adds `bias[r]` to every value of row `r` of `y` (rows on all cores); an empty bias adds nothing.
fn add_row_bias(y: &mut Mat, bias: &[f32]) {
    use rayon::prelude::*;
    if bias.is_empty() || y.cols == 0 {
        return;
    }
    assert_eq!(bias.len(), y.rows, "linear: {} biases for {} outputs", bias.len(), y.rows);
    y.data.par_chunks_mut(y.cols).zip(bias).with_min_len(16).for_each(|(row, &b)| row.iter_mut().for_each(|v| *v += b));
}

/// A `values.len() × cols` row-major matrix whose row `r` is `values[r]` throughout, written once and on all
/// cores: the starting value of a product with a bias.
fn broadcast_rows(values: &[f32], cols: usize) -> Vec<f32> {
    // SAFETY: each piece is one whole row (`cols` values, the last row too) and is filled.
    unsafe { written_once(values.len() * cols, cols, |start, row| row.fill(MaybeUninit::new(values[start / cols]))) }
}

/// Backward to the input: `dX = Wᵀ·dY`. Dense weights are row-major `outputs × inputs`; sparse weights come
/// stored by input column (see [`Weights::Sparse`]).
pub fn backward_input(w: Weights<'_>, inputs: usize, dy: &Mat) -> Mat {
    match w {
        Weights::Dense(values) => {
            let wt = dense::MatView::new(values, dy.rows, inputs).t();
            Mat::from_vec(inputs, dy.cols, dense::product(wt, dy.view()))
        }
        Weights::Sparse { pattern, values } => {
            assert_eq!(
                pattern.outer(),
                inputs,
                "backward_input: the pattern has {} columns, not {inputs}",
                pattern.outer()
            );
            sparse::gather(pattern, values, dy)
        }
    }
}

/// Dense weight gradient `dW = dY·Xᵀ`, row-major `outputs × inputs`.
///
/// Both operands come with the tokens (the product's depth) contiguous, so one of them has to be turned on its
/// side for the GEMM: `X` is transposed to token-major first, on all cores, and the GEMM reads it row by row.
/// Left to `gemm`'s own packing of the strided operand, the product ran at 75–165 GFLOP/s at gpt-small's shapes
/// (AMD EPYC, 2 cores), against 170–205 with the transpose counted (`runtime/examples/gpt_probe.rs`).
pub fn weight_grad_dense(dy: &Mat, x: &Mat) -> Vec<f32> {
    let xt = small::transpose(&x.data, x.rows, x.cols);
    dense::product(dy.view(), dense::MatView::new(&xt, x.cols, x.rows))
}

/// Both gradients of a dense layer whose input was `x`: `dW = dY·Xᵀ` and `dX = Wᵀ·dY`, started side by side,
/// each free to use every core: the thread that finishes its product first helps with the other's blocks,
/// where two one-thread products left a core idle for as long as they differ.
pub fn backward_dense(w: &[f32], x: &Mat, dy: &Mat) -> (Vec<f32>, Mat) {
    let wt = dense::MatView::new(w, dy.rows, x.rows).t();
    let (dw, dx) = rayon::join(|| weight_grad_dense(dy, x), || dense::product(wt, dy.view()));
    (dw, Mat::from_vec(x.rows, dy.cols, dx))
}

/// Both gradients of a sparse layer whose input was `x`, with weights stored by input column: the weight
/// gradient at the mask's positions and `dX = Wᵀ·dY` in `layout`, over operands in either layout (see
/// [`sparse::backward_as`]).
pub fn backward_sparse(
    by_column: &SparsePattern,
    values: &[f32],
    x: ActsRef<'_>,
    dy: ActsRef<'_>,
    layout: Layout,
) -> (Vec<f32>, Acts) {
    sparse::backward_as(by_column, values, x, dy, layout)
}

/// Sparse weight gradient at the mask's positions only, for a pattern stored by input column: one dot
/// product per existing weight, in the pattern's order.
pub fn weight_grad_sparse(by_column: &SparsePattern, x: ActsRef<'_>, dy: ActsRef<'_>) -> Vec<f32> {
    let mut g = vec![0.0; by_column.nnz()];
    sparse::sddmm_as(by_column, x, dy, &mut g);
    g
}

/// [`bias_grad`] of a delta in either layout, the same sums bit for bit.
pub fn bias_grad_as(dy: ActsRef<'_>) -> Vec<f32> {
    match dy {
        ActsRef::Rows(m) => bias_grad(m),
        ActsRef::Tiles(t) => tiles_row_sums(t),
    }
}

/// Each row's sum over its real tokens, from tiles, rows on all cores: the additions of [`row_sum`] over the
/// same row in the same order (a tile is whole runs of [`SUM_LANES`] tokens), so the bias gradient is the same
/// bit for bit in either layout.
fn tiles_row_sums(t: &Tiles) -> Vec<f32> {
    use rayon::prelude::*;
    let (rows, tokens) = (t.rows(), t.tokens());
    let whole = tokens / SUM_LANES * SUM_LANES;
    let lane = |tile: usize, r: usize| &t.lanes()[tile * rows + r].0;
    (0..rows)
        .into_par_iter()
        .with_min_len(16)
        .map(|r| {
            let mut acc = [0.0f32; SUM_LANES];
            for tile in 0..whole.div_ceil(TILE) {
                let full = (whole - tile * TILE).min(TILE);
                for c in lane(tile, r)[..full].chunks_exact(SUM_LANES) {
                    for (a, v) in acc.iter_mut().zip(c) {
                        *a += v;
                    }
                }
            }
            // The tokens past the last whole run lie in one lane; an empty tail is summed as `row_sum` sums its
            // empty remainder (`Sum` of no floats), so even its zero's sign agrees.
            let tail: f32 = match tokens - whole {
                0 => [0.0f32; 0].iter().sum(),
                _ => lane(whole / TILE, r)[whole % TILE..(tokens - 1) % TILE + 1].iter().sum(),
            };
            acc.iter().sum::<f32>() + tail
        })
        .collect()
}

/// Bias gradient: each output's delta summed over tokens, rows on all cores (each row's sum is the same
/// whichever core takes it).
pub fn bias_grad(dy: &Mat) -> Vec<f32> {
    use rayon::prelude::*;
    if dy.cols == 0 {
        return vec![0.0; dy.rows];
    }
    dy.data.par_chunks(dy.cols).with_min_len(16).map(row_sum).collect()
}

/// Running partial sums of a bias gradient's row (see [`row_sum`]).
const SUM_LANES: usize = 16;

/// The sum of a row over sixteen running partial sums: a plain `iter().sum()` must add in order, one value at a
/// time, which at a transformer's widths made the bias gradients cost more than some of their GEMMs.
fn row_sum(row: &[f32]) -> f32 {
    let mut acc = [0.0f32; SUM_LANES];
    let chunks = row.chunks_exact(SUM_LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the references are written as the plain loops of their formulas
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_vec(n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// Objective `L = Σ G ⊙ (W·X + b)` in f64, whose exact gradients are `G·Xᵀ`, `Wᵀ·G` and row sums of G.
    fn objective(w: &[f32], b: &[f32], x: &Mat, g: &Mat) -> f64 {
        let y = forward(Weights::Dense(w), b, x);
        y.data.iter().zip(&g.data).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    #[test]
    fn dense_and_sparse_backward_match_central_differences() {
        let (inputs, outputs, tokens) = (7, 5, 4);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x = Mat::from_vec(inputs, tokens, rand_vec(inputs * tokens, &mut rng));
        let g = Mat::from_vec(outputs, tokens, rand_vec(outputs * tokens, &mut rng));
        let b = rand_vec(outputs, &mut rng);
        let pattern = SparsePattern::random(outputs, inputs, 0.5, 2);
        let values = rand_vec(pattern.nnz(), &mut rng);
        let w = pattern.to_dense(&values).data;
        let h = 1e-2f32;
        let fd = |wp: &[f32], bp: &[f32], xp: &Mat, which: usize, i: usize| {
            let (mut w1, mut b1, mut x1) = (wp.to_vec(), bp.to_vec(), xp.clone());
            let (mut w2, mut b2, mut x2) = (wp.to_vec(), bp.to_vec(), xp.clone());
            match which {
                0 => (w1[i] += h, w2[i] -= h),
                1 => (b1[i] += h, b2[i] -= h),
                _ => (x1.data[i] += h, x2.data[i] -= h),
            };
            (objective(&w1, &b1, &x1, &g) - objective(&w2, &b2, &x2, &g)) / (2.0 * h as f64)
        };

        // Dense.
        let dw = weight_grad_dense(&g, &x);
        let dx = backward_input(Weights::Dense(&w), inputs, &g);
        let db = bias_grad(&g);
        for i in 0..w.len() {
            assert!((fd(&w, &b, &x, 0, i) - dw[i] as f64).abs() < 1e-3, "dW[{i}]");
        }
        for i in 0..b.len() {
            assert!((fd(&w, &b, &x, 1, i) - db[i] as f64).abs() < 1e-3, "db[{i}]");
        }
        for i in 0..x.data.len() {
            assert!((fd(&w, &b, &x, 2, i) - dx.data[i] as f64).abs() < 1e-3, "dX[{i}]");
        }

        // Sparse: forward agrees with the dense masked matrix, and gradients exist only on the mask.
        let ys = forward(Weights::Sparse { pattern: &pattern, values: &values }, &b, &x);
        let yd = forward(Weights::Dense(&w), &b, &x);
        for (a, c) in ys.data.iter().zip(&yd.data) {
            assert!((a - c).abs() < 1e-5);
        }
        let (by_col, perm) = pattern.transpose();
        let col_values: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
        let dxs = backward_input(Weights::Sparse { pattern: &by_col, values: &col_values }, inputs, &g);
        for i in 0..x.data.len() {
            assert!((fd(&w, &b, &x, 2, i) - dxs.data[i] as f64).abs() < 1e-3, "sparse dX[{i}]");
        }
        let gs = weight_grad_sparse(&by_col, (&x).into(), (&g).into());
        let dense_of_sparse = by_col.to_dense(&gs); // inputs × outputs
        for o in 0..outputs {
            for i in 0..inputs {
                let here = w[o * inputs + i] != 0.0;
                let got = dense_of_sparse.data[i * outputs + o];
                if here {
                    assert!((fd(&w, &b, &x, 0, o * inputs + i) - got as f64).abs() < 1e-3, "sparse dW[{o},{i}]");
                } else {
                    assert_eq!(got, 0.0, "no gradient off the mask");
                }
            }
        }
    }
}
