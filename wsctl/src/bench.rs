//! `wsctl bench`: measurements that put the runtime's speed in context. `kernels` times the dense GEMM of the
//! `gemm` crate against our sparse forward, backward and weight-gradient kernels on one weight shape over a
//! range of sparsities; `machine` measures the ceilings those kernels live under (peak GEMM FLOP/s, memory
//! bandwidth); `transport` compares streaming a layer over the gRPC protocol with a raw TCP copy.
//! `bench/run.sh` runs all three beside PyTorch.

mod machine;
mod transport;

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Subcommand;
use kernels::tensor::Mat;
use kernels::{dense, sparse};
use serde::Serialize;

/// What to measure.
#[derive(Subcommand)]
pub enum Bench {
    /// Dense GEMM vs the sparse kernels.
    Kernels {
        /// Output and input features of the square weight matrix.
        #[arg(long, default_value_t = 4096)]
        features: usize,
        /// Tokens (batch columns) per product.
        #[arg(long, default_value_t = 512)]
        tokens: usize,
        /// Timed repetitions per kernel; the median is reported.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Sparsities to measure.
        #[arg(long, value_delimiter = ',', default_value = "0,0.5,0.8,0.9,0.95,0.99")]
        sparsity: Vec<f64>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The machine's ceilings: peak dense GEMM FLOP/s and STREAM-like triad bandwidth, on 1 and 2 threads.
    Machine(machine::MachineArgs),
    /// Bytes/s of streaming a layer over loopback gRPC (the runtime's protocol) against a raw TCP socket.
    Transport(transport::TransportArgs),
}

#[derive(Serialize)]
struct Row {
    sparsity: f64,
    dense_s: f64,
    sparse_fwd_s: f64,
    sparse_bwd_s: f64,
    sparse_wgrad_s: f64,
    speedup_fwd: f64,
}

#[derive(Serialize)]
struct Report {
    features: usize,
    tokens: usize,
    threads: usize,
    rows: Vec<Row>,
}

/// Median wall time of each of `kernels` over `repeats` rounds, after one warm-up round. The kernels run
/// interleaved, round after round, so a machine that gets busier or quieter during the benchmark affects all of
/// them alike and their ratios stay meaningful.
fn time_interleaved(repeats: usize, kernels: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for k in kernels.iter_mut() {
        k();
    }
    let mut times = vec![Vec::new(); kernels.len()];
    for _ in 0..repeats.max(1) {
        for (k, t) in kernels.iter_mut().zip(&mut times) {
            let start = Instant::now();
            k();
            t.push(start.elapsed().as_secs_f64());
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}

fn filled(rows: usize, cols: usize, seed: u32) -> Mat {
    // A cheap deterministic fill; the kernels' speed does not depend on the values.
    let data = (0..rows * cols)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect();
    Mat::from_vec(rows, cols, data)
}

/// Runs the requested benchmark and prints its report.
pub fn bench(what: Bench) -> Result<()> {
    let (features, tokens, repeats, sparsity, json) = match what {
        Bench::Kernels { features, tokens, repeats, sparsity, json } => (features, tokens, repeats, sparsity, json),
        Bench::Machine(args) => return machine::machine(args),
        Bench::Transport(args) => return transport::transport(args),
    };
    if features == 0 || tokens == 0 {
        bail!("--features and --tokens must be at least 1");
    }
    if let Some(bad) = sparsity.iter().find(|s| !(0.0..=0.99).contains(*s)) {
        bail!("--sparsity {bad} is outside [0, 0.99]");
    }
    let n = features;
    let x = filled(n, tokens, 1);
    let dy = filled(n, tokens, 2);
    let w = filled(n, n, 3);
    let mut rows = Vec::new();
    for &s in &sparsity {
        let p = sparse::SparsePattern::random(n, n, 1.0 - s, 7);
        let values: Vec<f32> = (0..p.nnz()).map(|k| (k % 97) as f32 / 97.0 - 0.5).collect();
        let (t, perm) = p.transpose();
        let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
        let mut g = vec![0.0; t.nnz()];
        let times = time_interleaved(
            repeats,
            &mut [
                // Each product returns a new matrix, as the engine's layers do.
                &mut || drop(std::hint::black_box(dense::product(w.view(), x.view()))),
                &mut || drop(std::hint::black_box(sparse::gather(&p, &values, &x))),
                &mut || drop(std::hint::black_box(sparse::gather(&t, &tvalues, &dy))),
                &mut || sparse::sddmm(&t, &x, &dy, &mut g),
            ],
        );
        rows.push(Row {
            sparsity: s,
            dense_s: times[0],
            sparse_fwd_s: times[1],
            sparse_bwd_s: times[2],
            sparse_wgrad_s: times[3],
            speedup_fwd: times[0] / times[1],
        });
    }
    let report = Report { features, tokens, threads: rayon::current_num_threads(), rows };
    if json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("weight {n}x{n}, {tokens} tokens, {} threads; median of {repeats}", report.threads);
    println!("sparsity  dense GEMM   sparse fwd   sparse bwd  sparse wgrad  fwd speed-up");
    for r in &report.rows {
        println!(
            "{:>8.2}  {:>9.2}ms  {:>9.2}ms  {:>9.2}ms  {:>10.2}ms  {:>11.2}x",
            r.sparsity,
            1e3 * r.dense_s,
            1e3 * r.sparse_fwd_s,
            1e3 * r.sparse_bwd_s,
            1e3 * r.sparse_wgrad_s,
            r.speedup_fwd
        );
    }
    Ok(())
}
