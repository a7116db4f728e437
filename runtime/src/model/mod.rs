//! The layers a model is built from, and the layout of a model as the appliance sees it: a sequence of
//! weight layers, each one *stream unit* that MemoryX sends and the engine computes in turn.

pub mod activation;
pub mod attention;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod program;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

#[cfg(test)]
pub(crate) mod gradcheck {
    //! The check every layer's backward pass is held to: its analytic gradient against central differences.

    use kernels::tensor::Mat;

    /// `Σ y·w` in f64: a scalar objective whose gradient with respect to `y` is `w`, so a layer's backward pass
    /// given `w` as its output gradient must produce the objective's gradient.
    pub(crate) fn weighted_sum(y: &Mat, w: &Mat) -> f64 {
        y.data.iter().zip(&w.data).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    /// Asserts that `analytic` is the gradient of `objective` at `at`, value by value, within `tol` of central
    /// differences of step `h`; `what` names the input in a failure.
    pub(crate) fn assert_central_differences(
        at: &Mat,
        analytic: &Mat,
        (h, tol): (f32, f64),
        what: &str,
        objective: impl Fn(&Mat) -> f64,
    ) {
        for i in 0..at.data.len() {
            let (mut up, mut down) = (at.clone(), at.clone());
            up.data[i] += h;
            down.data[i] -= h;
            let fd = (objective(&up) - objective(&down)) / (2.0 * h as f64);
            assert!(
                (fd - analytic.data[i] as f64).abs() < tol,
                "{what}[{i}]: analytic {} vs numeric {fd}",
                analytic.data[i]
            );
        }
    }
}
