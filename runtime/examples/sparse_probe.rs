//! Times the sparse kernels at a GPT's block shapes (90% sparse, 2048 tokens, packing included) and measures
//! the ceiling of their inner step, to show how far they are from it and why:
//! `cargo run --release -p runtime --example sparse_probe [width]` (see `bench/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::time::Instant;

use kernels::sparse::{self, SparsePattern};
use kernels::tensor::Mat;
use multiversion::multiversion;

/// Tokens per lane, as the kernels' tiles hold them.
const TILE: usize = 128;

/// Seconds per call of `f`, over `reps` calls after one to warm up.
fn seconds<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    std::hint::black_box(f());
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    start.elapsed().as_secs_f64() / reps as f64
}

/// One 128-token lane of a packed source, aligned as the kernels align theirs.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Lane([f32; TILE]);

/// The gather's inner step alone: a line's sums in registers, one AXPY per non-zero over the lane its index
/// picks, runs of eight non-zeros (as the kernels' blocking makes them).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn axpy_runs(lanes: &[Lane], idx: &[u32], vals: &[f32]) -> f32 {
    let mut acc = [0.0f32; TILE];
    let mut out = 0.0;
    for (run_idx, run_vals) in idx.chunks(8).zip(vals.chunks(8)) {
        let mut sum = acc;
        for (&i, &v) in run_idx.iter().zip(run_vals) {
            let x = &lanes[i as usize].0;
            for j in 0..TILE {
                sum[j] = v.mul_add(x[j], sum[j]);
            }
        }
        acc = sum;
        out += acc[5];
    }
    out
}

fn main() {
    runtime::process::keep_allocator_warm();
    let d: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let n = 2048;
    let m = |rows: usize, cols: usize| {
        Mat::from_vec(rows, cols, (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect())
    };
    println!("width {d}, 90% sparse, {n} tokens, both cores; GFLOP/s of useful work (2 per non-zero per token)");
    for (name, outs, ins) in [("qkv", 3 * d, d), ("proj", d, d), ("up", 4 * d, d), ("down", d, 4 * d)] {
        let p = SparsePattern::random(outs, ins, 0.1, 3);
        let values: Vec<f32> = (0..p.nnz()).map(|i| ((i * 31 % 17) as f32 - 8.0) * 1e-2).collect();
        let (by_column, perm) = p.transpose();
        let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
        let (x, dy) = (m(ins, n), m(outs, n));
        let mut dw = vec![0.0; p.nnz()];
        let fwd = seconds(20, || sparse::gather(&p, &values, &x));
        let dx = seconds(20, || sparse::gather(&by_column, &tvalues, &dy));
        let wgrad = seconds(20, || sparse::sddmm(&by_column, &x, &dy, &mut dw));
        let both = seconds(20, || sparse::backward(&by_column, &tvalues, &x, &dy));
        let gflops = |s: f64, products: f64| products * 2.0 * p.nnz() as f64 * n as f64 / s / 1e9;
        println!(
            "{name:5} {outs:5}x{ins:<5} forward {:6.2} ms {:5.0} | dX {:6.2} ms {:5.0} | dW (SDDMM) {:6.2} ms {:5.0} | backward (both) {:6.2} ms {:5.0}",
            fwd * 1e3,
            gflops(fwd, 1.0),
            dx * 1e3,
            gflops(dx, 1.0),
            wgrad * 1e3,
            gflops(wgrad, 1.0),
            both * 1e3,
            gflops(both, 2.0)
        );
    }
    println!("the inner step alone, one core, lanes picked at random from a pool of:");
    let picks = 1 << 16;
    for lanes_in_pool in [16usize, 80, 256, 768, 3072] {
        let lanes = vec![Lane([1.0e-3; TILE]); lanes_in_pool];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let idx: Vec<u32> = (0..picks)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % lanes_in_pool as u64) as u32
            })
            .collect();
        let vals = vec![0.5f32; picks];
        let s = seconds(50, || axpy_runs(&lanes, &idx, &vals));
        println!(
            "  {lanes_in_pool:5} lanes ({:5} KB): {:6.1} GFLOP/s",
            lanes_in_pool * TILE * 4 / 1024,
            2.0 * (picks * TILE) as f64 / s / 1e9
        );
    }
}
