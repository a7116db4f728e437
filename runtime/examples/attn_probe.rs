#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed
use kernels::tensor::{Mat, Spare};
use runtime::model::attention::{self, Geometry};
use std::time::Instant;
fn main() {
    runtime::process::keep_allocator_warm();
    let d: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let (n, t, heads) = (2048usize, 128usize, d / 64);
    let m = |rows: usize, cols: usize| {
        Mat::from_vec(rows, cols, (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect())
    };
    let geo = Geometry { width: d, heads, kv_heads: heads, context: t };
    let qkv = m(3 * d, n);
    let mut spare = Spare::default();
    let reps = 100;
    let (mut f, mut b) = (0.0, 0.0);
    for _ in 0..reps {
        let s = Instant::now();
        let (o, probs) = attention::forward(geo, &qkv, &mut spare);
        f += s.elapsed().as_secs_f64();
        let s = Instant::now();
        let dq = attention::backward(geo, &qkv, &probs, &o, &mut spare);
        b += s.elapsed().as_secs_f64();
        spare.give(o.data);
        spare.give(probs);
        spare.give(dq.data);
    }
    println!("fwd {:.3} ms bwd {:.3} ms", f / reps as f64 * 1e3, b / reps as f64 * 1e3);
}
