//! Dense matrix multiply through the `gemm` crate (the kernel behind faer): a well-kept, vectorised and
//! threaded GEMM, so the dense path is as fast as this machine allows and the sparse kernels are measured
//! against a fair baseline.

use gemm::Parallelism;

/// A borrowed matrix with explicit strides, so a transpose is a view rather than a copy.
#[derive(Clone, Copy, Debug)]
pub struct MatView<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatView<'a> {
    /// A row-major `rows × cols` view of `data`.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert!(data.len() >= rows * cols, "MatView::new: {rows}x{cols} needs {} values", rows * cols);
        MatView { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// A `rows × cols` block inside a larger row-major matrix whose rows are `row_stride` apart; `data`
    /// starts at the block's first element. Attention reads one head of one sequence this way, in place.
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        let needed = if rows == 0 || cols == 0 { 0 } else { (rows - 1) * row_stride + cols };
        assert!(cols <= row_stride || rows <= 1, "MatView::strided: {cols} columns overlap rows {row_stride} apart");
        assert!(data.len() >= needed, "MatView::strided: {rows}x{cols} every {row_stride} needs {needed} values");
        MatView { data, rows, cols, row_stride, col_stride: 1 }
    }

    /// The transpose, without moving data.
    pub fn t(self) -> Self {
        MatView { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Rows of the (possibly transposed) view.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the (possibly transposed) view.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(r, c)`, for reference code and tests.
    pub fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.row_stride + c * self.col_stride]
    }
}

/// `a · b` as a new row-major `a.rows × b.cols` vector. The product writes every element before anything reads
/// it, so the vector is not zeroed first: at a transformer's shapes, zeroing outputs that are overwritten anyway
/// was a twentieth of a training step.
pub fn product(a: MatView<'_>, b: MatView<'_>) -> Vec<f32> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "product: inner dimensions differ ({}x{} · {}x{})", a.rows, a.cols, b.rows, b.cols);
    // Degenerate and tiny shapes take the zeroed path: `gemm` sends some of them to special cases, and the
    // saving is nil there.
    if m < UNINIT_MIN || n < UNINIT_MIN || k < UNINIT_MIN {
        let mut dst = vec![0.0; m * n];
        matmul(&mut dst, a, b, false);
        return dst;
    }
    let mut dst: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: `dst` has room for exactly m*n values and the views were checked as `gemm_into` requires. With
    // `read_dst` false, `gemm` sets alpha to zero, and its blocked path stores the first depth block's products
    // without loading the destination (later blocks add to what the first stored), so every element is written
    // before it is read and all m*n are written by the time it returns: only then is the length set.
    unsafe {
        gemm_into(dst.as_mut_ptr(), a, b, false, parallelism(m, n, k));
        dst.set_len(m * n);
    }
    dst
}

/// The one call into `gemm`: `dst = a · b` (or `+=` when `read_dst`), `dst` row-major `a.rows × b.cols`.
///
/// # Safety
/// `dst` must be valid for writes (and, with `read_dst`, reads) of `a.rows * b.cols` values and must not
/// overlap `a` or `b`; `a.cols == b.rows`. The views address only elements inside their slices: their
/// constructors check it.
unsafe fn gemm_into(dst: *mut f32, a: MatView<'_>, b: MatView<'_>, read_dst: bool, parallelism: Parallelism) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    // SAFETY: the caller's contract above is `gemm`'s.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            read_dst,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The smallest side for which [`product`] skips zeroing its output.
const UNINIT_MIN: usize = 16;

/// Threads for an `m × k · k × n` product: all of them when the work pays for the fork.
fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m * n * k >= crate::PARALLEL_MIN_FLOPS { Parallelism::Rayon(0) } else { Parallelism::None }
}

/// `dst = a · b`, or `dst += a · b` when `accumulate`; `dst` is row-major `a.rows × b.cols`.
///
/// Shapes are checked here so the `unsafe` call below only ever sees in-bounds strides.
pub fn matmul(dst: &mut [f32], a: MatView<'_>, b: MatView<'_>, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "matmul: inner dimensions differ ({}x{} · {}x{})", a.rows, a.cols, b.rows, b.cols);
    assert_eq!(dst.len(), m * n, "matmul: destination holds {} values, {m}x{n} needed", dst.len());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    // SAFETY: every view was built from a slice at least `rows*cols` long with strides that address only
    // elements inside it (row-major or its transpose), `dst` holds exactly m*n values, and the three slices
    // do not alias because `dst` is borrowed mutably.
    unsafe { gemm_into(dst.as_mut_ptr(), a, b, accumulate, parallelism(m, n, k)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::tensor::Mat;

    fn mat(rows: usize, cols: usize, seed: usize) -> Mat {
        Mat::from_vec(
            rows,
            cols,
            (0..rows * cols).map(|i| (((i + seed) * 7919 % 1013) as f32 - 506.0) * 1e-3).collect(),
        )
    }

    fn close(got: &[f32], want: &[f32]) {
        reference::assert_close(got, want, 1e-3);
    }

    /// The products that skip zeroing their output (every side at least 16) and those that do not agree with
    /// the reference, on plain and transposed operands.
    #[test]
    fn products_match_the_reference() {
        for &(m, k, n) in &[(3, 5, 7), (16, 16, 16), (40, 17, 300), (300, 64, 33), (20, 0, 20)] {
            let (a, b) = (mat(m, k, 1), mat(k, n, 2));
            let want = reference::matmul(&a, &b);
            close(&product(a.view(), b.view()), &want.data);
            // The same product from stored transposes: aᵀᵀ · bᵀᵀ.
            let (at, bt) = (reference::transpose(&a), reference::transpose(&b));
            close(&product(at.view().t(), bt.view().t()), &want.data);
        }
    }
}
