//! Per-line non-zero counts of a seeded random mask, drawn without building the mask. A GPT-3-sized matrix has
//! 600 million entries; the cost model needs only how many non-zeros each line holds, and for a mask that keeps
//! each weight independently that count is binomial, so it can be drawn line by line.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Below this expected number of the rarer outcome per line, counts are drawn exactly (by skipping between
/// successes); above it the normal approximation is indistinguishable and far cheaper.
const EXACT_BELOW: f64 = 50.0;

/// Non-zeros in each of `lines` lines of length `len` when every entry is kept with probability `density`:
/// the same distribution as [`kernels::sparse::SparsePattern::random`]'s line counts.
pub fn line_counts(lines: usize, len: usize, density: f64, seed: u64) -> Vec<u32> {
    let p = density.clamp(0.0, 1.0);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..lines).map(|_| binomial(&mut rng, len, p)).collect()
}

fn binomial(rng: &mut ChaCha8Rng, n: usize, p: f64) -> u32 {
    if p <= 0.0 || n == 0 {
        return 0;
    }
    if p >= 1.0 {
        return n as u32;
    }
    // Draw the rarer outcome and mirror, so skipping stays short.
    let (q, mirrored) = if p <= 0.5 { (p, false) } else { (1.0 - p, true) };
    let mean = n as f64 * q;
    let k = if mean < EXACT_BELOW {
        skip_count(rng, n, q)
    } else {
        let sd = (mean * (1.0 - q)).sqrt();
        (mean + sd * standard_normal(rng)).round().clamp(0.0, n as f64) as usize
    };
    (if mirrored { n - k } else { k }) as u32
}

/// Exact binomial draw: jump from one success to the next with geometric gaps, so the cost is the number of
/// successes rather than the line length.
fn skip_count(rng: &mut ChaCha8Rng, n: usize, q: f64) -> usize {
    let log_miss = (1.0 - q).ln();
    let mut at = 0usize;
    let mut count = 0usize;
    loop {
        let u: f64 = rng.random::<f64>();
        // 1 − u lies in (0, 1], so the logarithm is finite.
        let gap = ((1.0 - u).ln() / log_miss).floor();
        if !gap.is_finite() || gap >= (n - at) as f64 {
            return count;
        }
        at += gap as usize;
        count += 1;
        at += 1;
        if at >= n {
            return count;
        }
    }
}

/// Box–Muller: one standard normal from two uniforms.
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_var(c: &[u32]) -> (f64, f64) {
        let n = c.len() as f64;
        let m = c.iter().map(|&x| x as f64).sum::<f64>() / n;
        let v = c.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n;
        (m, v)
    }

    #[test]
    fn counts_follow_the_binomial() {
        // Exact path, normal path and the mirrored side, each against n·p and n·p·(1 − p).
        for &(len, p) in &[(1000usize, 0.01f64), (1000, 0.3), (5000, 0.9), (200, 0.999)] {
            let c = line_counts(20_000, len, p, 42);
            let (m, v) = mean_var(&c);
            let (em, ev) = (len as f64 * p, len as f64 * p * (1.0 - p));
            assert!((m - em).abs() < 0.05 * em.max(1.0), "len {len} p {p}: mean {m} vs {em}");
            assert!((v - ev).abs() < 0.1 * ev.max(0.1), "len {len} p {p}: variance {v} vs {ev}");
            assert!(c.iter().all(|&x| x as usize <= len));
        }
        assert!(line_counts(10, 50, 0.0, 1).iter().all(|&x| x == 0));
        assert!(line_counts(10, 50, 1.0, 1).iter().all(|&x| x == 50));
        assert_eq!(line_counts(100, 300, 0.2, 9), line_counts(100, 300, 0.2, 9), "seeded");
    }
}
