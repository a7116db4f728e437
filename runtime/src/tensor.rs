//! The one tensor type the engine needs: a row-major matrix. Activations are stored feature-major (a row per
//! feature, a column per token/sample), as the seeds lay them over the wafer, so that every AXPY of the sparse
//! kernels runs over one contiguous row.

/// A dense row-major `rows × cols` matrix of `f32`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Mat {
    /// Number of rows (features, for activations).
    pub rows: usize,
    /// Number of columns (tokens or samples, for activations).
    pub cols: usize,
    /// `rows * cols` values, row after row.
    pub data: Vec<f32>,
}

impl Mat {
    /// A matrix of zeros, the starting point of every accumulation.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// Wraps existing values; the length must match the shape, which callers guarantee by construction.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "Mat::from_vec: {rows}x{cols} needs {} values", rows * cols);
        Mat { rows, cols, data }
    }

    /// Row `r` as a slice: one feature across all tokens.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`, mutable.
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The bytes this matrix occupies in engine SRAM.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * std::mem::size_of::<f32>()) as u64
    }

    /// A view of the whole matrix for the GEMM wrapper.
    pub fn view(&self) -> crate::kernels::dense::MatView<'_> {
        crate::kernels::dense::MatView::new(&self.data, self.rows, self.cols)
    }
}
