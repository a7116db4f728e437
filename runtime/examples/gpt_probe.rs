//! Times the pieces of one gpt-small training step at its real shapes (2048 tokens), to show where a step's
//! time goes: `cargo run --release -p runtime --example gpt_probe [width]`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::time::Instant;

use kernels::dense::{MatView, matmul};
use kernels::tensor::Mat;
use runtime::model::attention::{self, Geometry};
use runtime::model::{activation, linear, norm};

fn time<T>(what: &str, reps: usize, mut f: impl FnMut() -> T) -> f64 {
    f();
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    let s = start.elapsed().as_secs_f64() / reps as f64;
    println!("{what:40} {:8.3} ms", s * 1e3);
    s
}

fn main() {
    if std::env::var_os("PROBE_COLD_ALLOCATOR").is_none() {
        runtime::process::keep_allocator_warm();
    }
    let d: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let (n, t, heads) = (2048usize, 128usize, 4usize);
    let r = 4 * d;
    let m = |rows: usize, cols: usize| {
        Mat::from_vec(rows, cols, (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect())
    };
    let x = m(d, n);
    let w_qkv = m(3 * d, d).data;
    let w_up = m(r, d).data;
    let dy_qkv = m(3 * d, n);
    let u = m(r, n);
    let mut total = 0.0;
    for (name, outs, ins) in [("qkv", 3 * d, d), ("proj", d, d), ("up", r, d), ("down", d, r), ("head", 256, d)] {
        let w = m(outs, ins).data;
        let xin = m(ins, n);
        let dy = m(outs, n);
        let f = time(&format!("{name} fwd"), 5, || linear::forward(linear::Weights::Dense(&w), &[], &xin));
        let b = time(&format!("{name} dX"), 5, || linear::backward_input(linear::Weights::Dense(&w), ins, &dy));
        let g = time(&format!("{name} dW"), 5, || linear::weight_grad_dense(&dy, &xin));
        let flops = 2.0 * (outs * ins * n) as f64;
        println!("   {name}: {:.1} / {:.1} / {:.1} GFLOP/s", flops / f / 1e9, flops / b / 1e9, flops / g / 1e9);
        total += if name == "head" { f + b + g } else { 4.0 * (f + b + g) };
    }
    let mut sparse_total = 0.0;
    for (name, outs, ins) in [("qkv", 3 * d, d), ("proj", d, d), ("up", r, d), ("down", d, r)] {
        let p = kernels::sparse::SparsePattern::random(outs, ins, 0.1, 3);
        let values: Vec<f32> = (0..p.nnz()).map(|i| ((i * 31 % 17) as f32 - 8.0) * 1e-2).collect();
        let (pt, perm) = p.transpose();
        let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
        let xin = m(ins, n);
        let dy = m(outs, n);
        let f = time(&format!("{name} sparse fwd"), 5, || {
            linear::forward(linear::Weights::Sparse { pattern: &p, values: &values }, &[], &xin)
        });
        let b = time(&format!("{name} sparse dX"), 5, || {
            linear::backward_input(linear::Weights::Sparse { pattern: &pt, values: &tvalues }, ins, &dy)
        });
        let g = time(&format!("{name} sparse dW"), 5, || linear::weight_grad_sparse(&pt, (&xin).into(), (&dy).into()));
        sparse_total += 4.0 * (f + b + g);
    }
    println!("sparse block matrices per step: {:.1} ms", sparse_total * 1e3);
    let geo = Geometry { width: d, heads, kv_heads: heads, context: t };
    let qkv = m(3 * d, n);
    let (o, probs) = attention::forward(geo, &qkv, &mut Default::default());
    let af = time("attention fwd", 5, || attention::forward(geo, &qkv, &mut Default::default()));
    let ab = time("attention bwd", 5, || attention::backward(geo, &qkv, &probs, &o, &mut Default::default()));
    total += 4.0 * (af + ab);
    let gf = time("gelu fwd", 5, || activation::forward(crds::Activation::Gelu, &u.data));
    let mut du = u.clone();
    let gb = time("gelu bwd", 5, || activation::backward(crds::Activation::Gelu, &u.data, &mut du.data));
    let (xh, rstd) = norm::forward(&x);
    let nf = time("norm fwd", 5, || norm::forward(&x));
    let mut dx = Mat::zeros(d, n);
    let nb = time("norm bwd", 5, || norm::backward_add((&xh).into(), &rstd, &x, &mut dx));
    total += 4.0 * (gf + gb + 2.0 * (nf + nb));
    let _ = (w_qkv, w_up, dy_qkv);
    let _ = time("matmul 2048^3-ish check 512", 3, || {
        let a = m(512, 512);
        let mut c = vec![0.0; 512 * 512];
        matmul(&mut c, a.view(), MatView::new(&a.data, 512, 512), false);
        c
    });
    println!("sum of pieces per step: {:.1} ms -> {:.0} tokens/s", total * 1e3, n as f64 / total);
}
