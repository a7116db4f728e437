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
    let parallelism =
        if m * n * k >= super::PARALLEL_MIN_FLOPS { Parallelism::Rayon(0) } else { Parallelism::None };
    // SAFETY: every view was built from a slice at least `rows*cols` long with strides that address only
    // elements inside it (row-major or its transpose), `dst` holds exactly m*n values, and the three slices
    // do not alias because `dst` is borrowed mutably.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
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
