//! Analytic cases of the cost model: each checks a figure derived by hand from the seeds' description.

use kernels::sparse::SparsePattern;
use runtime::engine::hw::{EngineHw, Work};

use super::*;
use crate::SimWse;
use plan::preset::{TINY, WSE2};

/// FLOPs / (cores × FLOPs per core per cycle), the dense figure the seeds' peak implies.
fn flops_over_peak(engine: &EngineModel, m: usize, n: usize, k: usize) -> u64 {
    (2 * m * n * k) as u64 / (engine.cores * engine.flops_per_core_cycle())
}

#[test]
fn dense_layer_costs_flops_over_the_wafer_plus_partial_sums() {
    // Shapes that divide the mesh: features a multiple of its rows, tokens a multiple of its columns times
    // the FMA width, so no core is left with a ragged share.
    for &(engine, m, n, k) in &[(TINY, 100, 272, 250), (TINY, 7, 34 * 4 * 3, 25 * 6), (WSE2, 1000, 8000, 8500)] {
        let c = dense_gemm(&engine, m, n, k);
        assert_eq!(c.axpy, flops_over_peak(&engine, m, n, k), "{} {m}x{k}x{n}", engine.name);
        assert_eq!(c.partial_sums, m as u64 * 4, "one 4-cycle partial sum per output feature");
        assert_eq!(c.total(), flops_over_peak(&engine, m, n, k) + 4 * m as u64);
        assert_eq!(work_cycles(&engine, &Work::Gemm { m, n, k }), c.total());
    }
    // A ragged shape can only cost more than the ideal.
    let ragged = dense_gemm(&TINY, 100, 273, 251);
    assert!(ragged.axpy > flops_over_peak(&TINY, 100, 273, 251));
}

#[test]
fn a_full_mask_costs_what_the_dense_layer_costs() {
    let full = SparsePattern::random(100, 250, 1.0, 1);
    assert_eq!(full.nnz(), 25_000);
    let sparse = work_cycles(&TINY, &Work::SparseAxpy { pattern: &full, tokens: 272 });
    assert_eq!(sparse, dense_gemm(&TINY, 100, 272, 250).total());
}

#[test]
fn an_empty_mask_costs_only_the_partial_sums() {
    let empty = SparsePattern::from_lines(40, 30, vec![Vec::new(); 40]);
    let c = sparse_gemm(&TINY, empty.outer(), &feature_counts(&empty), 500);
    assert_eq!((c.axpy, c.partial_sums), (0, 40 * TINY.partial_sum_cycles));
}

/// A mask whose input features follow a power law: feature `i` feeds `⌈top / (i + 1)^1.2⌉` outputs, the heavy
/// ones all at low indices. Built by input feature (as the backward pattern is stored) and transposed, so the
/// forward pattern is what MemoryX would stream.
fn power_law_forward(outputs: usize, inputs: usize) -> (SparsePattern, SparsePattern) {
    let lines: Vec<Vec<u32>> = (0..inputs)
        .map(|i| {
            let count = ((outputs as f64) / ((i + 1) as f64).powf(1.2)).ceil().max(1.0) as usize;
            // Spread each feature's outputs with a stride so they are not all the first ones.
            (0..count)
                .map(|j| ((j * 7919 + i) % outputs) as u32)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect()
        })
        .collect();
    let by_input = SparsePattern::from_lines(inputs, outputs, lines);
    let (forward, _) = by_input.transpose();
    (forward, by_input)
}

#[test]
fn row_balancing_lowers_the_maximum_row_load_on_a_power_law_mask() {
    let (forward, by_input) = power_law_forward(2000, 1000);
    let counts = feature_counts(&forward);
    assert_eq!(counts, by_input.line_counts(), "the forward product's rows see the per-input line counts");
    let rows = 25;
    let naive = row_loads(&counts, rows, Dealing::Contiguous);
    let dealt = row_loads(&counts, rows, Dealing::SortedRoundRobin);
    assert_eq!(naive.iter().sum::<u64>(), dealt.iter().sum::<u64>(), "every non-zero is placed once");
    let (naive_max, dealt_max) = (naive.iter().max().copied().unwrap_or(0), dealt.iter().max().copied().unwrap_or(0));
    let mean = dealt.iter().sum::<u64>() as f64 / rows as f64;
    assert!(dealt_max < naive_max, "sorted round-robin {dealt_max} vs contiguous {naive_max}");
    assert!(naive_max as f64 > 2.0 * mean, "the power law really is lopsided: {naive_max} vs mean {mean}");
    // Round-robin over sorted counts can exceed the mean by at most the heaviest line.
    assert!(dealt_max as f64 <= mean + counts[0] as f64, "{dealt_max} vs mean {mean}");
    // The cost model uses the balanced layout: its slowest row is the dealt maximum.
    let c = sparse_gemm(&TINY, forward.outer(), &counts, 34 * 4);
    let map = Mapping::new(&TINY, forward.inner(), 34 * 4);
    assert_eq!(map.rows as usize, rows);
    assert_eq!(c.axpy, map.axpy_cycles(&TINY, dealt_max));
    assert!(c.axpy as f64 > c.mean_axpy, "the tail worker is slower than the average row");
}

#[test]
fn the_slowest_row_sets_the_time_not_the_average() {
    // Same non-zero count, one mask uniform, one with a single very heavy feature: the heavy one is slower.
    let uniform = SparsePattern::from_lines(50, 50, (0..50).map(|l| vec![l as u32, ((l + 1) % 50) as u32]).collect());
    let mut lines: Vec<Vec<u32>> = vec![vec![0]; 50];
    for (l, line) in lines.iter_mut().enumerate().take(50) {
        if l % 2 == 0 {
            line.push(1 + (l as u32 % 49));
        }
        line.sort_unstable();
        line.dedup();
    }
    let skewed = SparsePattern::from_lines(50, 50, lines);
    let (u, s) = (feature_counts(&uniform), feature_counts(&skewed));
    assert_eq!(u.iter().sum::<u32>(), 100);
    assert_eq!(s.iter().sum::<u32>(), 75);
    let cu = sparse_gemm(&TINY, 50, &u, 1000);
    let cs = sparse_gemm(&TINY, 50, &s, 1000);
    assert!(cs.axpy > cu.axpy, "feature 0 carries 50 non-zeros alone: {} vs {}", cs.axpy, cu.axpy);
}

#[test]
fn simulated_time_grows_with_nonzeros() {
    let mut last_cycles = 0;
    let mut last_time = 0.0;
    for density in [0.0, 0.01, 0.05, 0.1, 0.3, 0.6, 1.0] {
        let p = SparsePattern::random(300, 400, density, 5);
        let cycles = work_cycles(&TINY, &Work::SparseAxpy { pattern: &p, tokens: 512 });
        let mut hw = SimWse::new(TINY, TINY.sram_bytes);
        hw.record(&Work::SparseAxpy { pattern: &p, tokens: 512 });
        let t = hw.counters().simulated_s;
        if density > 0.0 {
            assert!(cycles > last_cycles, "density {density}: {cycles} ≤ {last_cycles}");
            assert!(t > last_time);
        }
        assert!((t - cycles as f64 / TINY.clock_hz).abs() < 1e-15);
        last_cycles = cycles;
        last_time = t;
    }
}

#[test]
fn streaming_overlaps_compute_layer_by_layer() {
    let mut hw = SimWse::new(WSE2, WSE2.sram_bytes);
    let compute = dense_gemm(&WSE2, 1000, 8000, 8500).total() as f64 / WSE2.clock_hz;
    // A layer whose stream is far longer than its computation costs the stream alone.
    let big = 40_000_000_000u64;
    hw.record(&Work::Received { bytes: big });
    hw.record(&Work::Gemm { m: 1000, n: 8000, k: 8500 });
    let stream = big as f64 / plan::preset::MEMORYX_BANDWIDTH;
    assert!(stream > compute);
    assert!((hw.counters().simulated_s - stream).abs() < 1e-12);
    // The next layer's small stream hides behind its computation.
    hw.record(&Work::Received { bytes: 1000 });
    hw.record(&Work::Gemm { m: 1000, n: 8000, k: 8500 });
    hw.record(&Work::Elementwise { ops: 8_000_000 });
    hw.record(&Work::Sent { bytes: 1000 });
    let second = compute + elementwise_cycles(&WSE2, 8_000_000) as f64 / WSE2.clock_hz;
    assert!((hw.counters().simulated_s - (stream + second)).abs() < 1e-12);
    let c = hw.counters();
    assert_eq!((c.bytes_received, c.bytes_sent), (big + 1000, 1000), "the shared counters still count");
}

#[test]
fn few_tokens_fold_onto_more_rows() {
    // 64 tokens on a 1,000-column mesh: the spare columns carry more features instead of idling.
    let m = Mapping::new(&WSE2, 784, 64);
    assert_eq!((m.rows, m.cols, m.tokens_per_core), (784, 64, 1));
    let m = Mapping::new(&WSE2, 10, 1_000_000);
    assert_eq!(m.rows, 10);
    assert!(m.cores() <= WSE2.cores && m.cols == 85_000);
    let m = Mapping::new(&WSE2, 12288, 3_200_000);
    assert_eq!((m.rows, m.cols, m.tokens_per_core), (850, 1000, 3200));
}

#[test]
fn a_gpt3_sized_matrix_reproduces_the_seeds_figures() {
    // GPT-3 175B's MLP matrix: 12,288 input features × 49,152 outputs, about 600 million weights, with the
    // 3.2M-token batch on one WSE-2.
    let (inputs, outputs, tokens) = (12_288usize, 49_152usize, 3_200_000usize);
    assert!((inputs * outputs) as f64 > 6.0e8);
    // At 90% sparsity each mesh row receives over 70 thousand non-zeros on average. The slowest row is set by
    // the whole features it holds (15 where the average is 12,288 / 850 ≈ 14.5): the law of large numbers and
    // sorted round-robin dealing add less than half a percent of randomness on top.
    let counts = sample::line_counts(inputs, outputs, 0.1, 11);
    let rows = Mapping::new(&WSE2, inputs, tokens).rows as usize;
    assert_eq!(rows, 850);
    let loads = row_loads(&counts, rows, Dealing::SortedRoundRobin);
    let max = loads.iter().copied().max().unwrap_or(0) as f64;
    let mean = loads.iter().sum::<u64>() as f64 / rows as f64;
    assert!(mean > 70_000.0, "non-zeros per row: {mean}");
    let features_ratio = inputs.div_ceil(rows) as f64 / (inputs as f64 / rows as f64);
    assert!(max <= mean * features_ratio * 1.005, "slowest row {max}, mean {mean}, feature ratio {features_ratio}");
    let naive = row_loads(&counts, rows, Dealing::Contiguous);
    assert!(naive.iter().copied().max().unwrap_or(0) as f64 >= max, "contiguous blocks are no better");
    // Amdahl's ceiling: with every AXPY skipped only the partial sums remain, about 3,000× below dense.
    let dense = dense_gemm(&WSE2, outputs, tokens, inputs).total();
    let empty = sparse_gemm(&WSE2, outputs, &vec![0; inputs], tokens).total();
    let ceiling = dense as f64 / empty as f64;
    assert!((2_500.0..3_500.0).contains(&ceiling), "sparsity saturates at {ceiling}×");
}
