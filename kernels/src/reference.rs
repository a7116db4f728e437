//! Plain, obviously-correct versions of every kernel: triple loops in `f64` over dense matrices. They are
//! slow on purpose; the tests hold the fast kernels to them.

use crate::sparse::SparsePattern;
use crate::tensor::Mat;

/// `a · b` by the textbook triple loop.
pub fn matmul(a: &Mat, b: &Mat) -> Mat {
    assert_eq!(a.cols, b.rows, "reference::matmul: inner dimensions differ");
    let mut c = Mat::zeros(a.rows, b.cols);
    for i in 0..a.rows {
        for j in 0..b.cols {
            let mut acc = 0.0f64;
            for k in 0..a.cols {
                acc += a.data[i * a.cols + k] as f64 * b.data[k * b.cols + j] as f64;
            }
            c.data[i * b.cols + j] = acc as f32;
        }
    }
    c
}

/// The transpose, by copying.
pub fn transpose(a: &Mat) -> Mat {
    let mut t = Mat::zeros(a.cols, a.rows);
    for i in 0..a.rows {
        for j in 0..a.cols {
            t.data[j * a.rows + i] = a.data[i * a.cols + j];
        }
    }
    t
}

/// The full product `a · bᵀ`, read off at the mask's non-zeros in the pattern's storage order.
pub fn sddmm(p: &SparsePattern, a: &Mat, b: &Mat) -> Vec<f32> {
    let full = matmul(a, &transpose(b));
    let mut out = Vec::with_capacity(p.nnz());
    for (s, &line) in p.order().iter().enumerate() {
        for k in p.ptr()[s] as usize..p.ptr()[s + 1] as usize {
            out.push(full.data[line as usize * full.cols + p.idx()[k] as usize]);
        }
    }
    out
}

/// Asserts that a kernel's result equals the reference's within a relative tolerance `tol`, naming the first
/// element that does not: the one comparison every kernel test makes.
#[cfg(test)]
pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: {g} against {w}");
    }
}
