//! Small dense products on packed, contiguous operands, with a *band* in the inner dimension: what causal
//! attention needs. Every product of attention is `C = A · B` over one (sequence, head) pair — a few hundred
//! KiB that stay in L2 — where a triangle of `A` is known to be zero, so each block of rows of `C` only
//! sums over the part of the inner dimension that can be non-zero, and (for the scores) only computes the
//! columns left of the diagonal. A general GEMM call would pack the operands again and do the whole square.
//!
//! The kernel is a register tile of sums: 8 rows × 32 columns (sixteen AVX-512 registers) where the CPU has
//! AVX-512, else 4 rows × 16 columns (eight AVX registers). Each block of rows of `A` is first packed into a
//! panel, the rows' values of one inner index side by side; per inner index the tile loads a row of `B`,
//! broadcasts one panel value per row and does one fused multiply-add per register of sums. Sixteen
//! independent sums keep both FMA units busy with room to spare for their latency.
//! [`matmul_banded_reference`] is the same product by the textbook loop; the tests hold the tile to it.

use multiversion::multiversion;

/// Rows of `C` per register tile where the CPU has AVX-512 (two registers of sums per row).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MR_WIDE: usize = 8;
/// Rows of `C` per register tile elsewhere (two AVX registers of sums per row).
const MR: usize = 4;
/// Columns of `C` per register tile.
const NR: usize = 16;

/// Which inner indices a tile of `C` sums over, and which of its columns are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Band {
    /// The full product.
    Full,
    /// `A` is lower triangular (`A[i][k] = 0` for `k > i`): row `i` sums over `k ≤ i` only.
    LowerA,
    /// `A` is upper triangular (`A[i][k] = 0` for `k < i`): row `i` sums over `k ≥ i` only.
    UpperA,
    /// `B` is lower triangular (`B[k][j] = 0` for `k > j`): column `j` sums over `k ≤ j` only. A tile sums
    /// whole rows of its columns, so the zeros must be stored, up to 31 columns past the diagonal.
    LowerB,
    /// `B` is upper triangular (`B[k][j] = 0` for `k < j`): column `j` sums over `k ≥ j` only. As with
    /// `LowerB`, the zeros must be stored.
    UpperB,
    /// Only the lower triangle of `C` is wanted (`j ≤ i`); columns right of the diagonal are left unspecified
    /// up to the next tile boundary and untouched beyond it. The caller masks them.
    LowerC,
}

/// Shapes of one banded product `C (m × n) = A (m × k) · B (k × n)`. `A` is read through two strides, so a
/// feature-major activation serves as `A` or as `Aᵀ` in place; `B` and `C` are row-major with leading
/// dimensions, so they too can be blocks of a larger matrix.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// `A[i][k]` is at `i · a_row + k · a_col`.
    pub a_row: usize,
    /// See `a_row`.
    pub a_col: usize,
    /// Leading dimension of `B`.
    pub ldb: usize,
    /// Leading dimension of `C`.
    pub ldc: usize,
}

impl Dims {
    /// Plain row-major `A`, `B` and `C`, each its own contiguous matrix.
    pub fn packed(m: usize, n: usize, k: usize) -> Self {
        Dims { m, n, k, a_row: k, a_col: 1, ldb: n, ldc: n }
    }

    /// Checks the shapes against the slices, in arithmetic that cannot wrap: the tiles read without bounds
    /// checks on the strength of these (and their own) assertions.
    fn check(&self, a: &[f32], b: &[f32], c: &[f32]) {
        let need = |rows: usize, cols: usize, ld: usize| {
            if rows == 0 || cols == 0 { Some(0) } else { (rows - 1).checked_mul(ld)?.checked_add(cols) }
        };
        let a_need = if self.m == 0 || self.k == 0 {
            Some(0)
        } else {
            (self.m - 1)
                .checked_mul(self.a_row)
                .zip((self.k - 1).checked_mul(self.a_col))
                .and_then(|(r, k)| r.checked_add(k)?.checked_add(1))
        };
        assert!(self.ldb >= self.n && self.ldc >= self.n, "matmul_banded: leading dimensions");
        assert!(a_need.is_some_and(|need| a.len() >= need), "matmul_banded: A is short");
        assert!(need(self.k, self.n, self.ldb).is_some_and(|need| b.len() >= need), "matmul_banded: B is short");
        assert!(need(self.m, self.n, self.ldc).is_some_and(|need| c.len() >= need), "matmul_banded: C is short");
    }

    /// The inner range a tile of rows `i0..i1` and columns `j0..j1` of `C` sums over under `band`.
    fn inner(&self, band: Band, (i0, i1): (usize, usize), (j0, j1): (usize, usize)) -> (usize, usize) {
        let (lo, hi) = match band {
            Band::Full | Band::LowerC => (0, self.k),
            Band::LowerA => (0, i1),
            Band::UpperA => (i0, self.k),
            Band::LowerB => (0, j1),
            Band::UpperB => (j0, self.k),
        };
        (lo.min(self.k), hi.min(self.k))
    }

    /// The columns rows `..i1` of `C` compute under `band`.
    fn cols(&self, band: Band, i1: usize) -> usize {
        match band {
            // Up to the tile boundary past the diagonal: a few extra sums in whole tiles cost less than a
            // scalar edge on every block of rows.
            Band::LowerC => i1.next_multiple_of(NR).min(self.n),
            _ => self.n,
        }
    }
}

/// `C = A · B` (overwriting `C`) under `band`. Columns of `C` outside the band's are not written.
///
/// Compiled for AVX2+FMA as well as the baseline and picked at run time; the tile's `mul_add` is one
/// instruction there (the baseline version, for CPUs without FMA, is correct but slow).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
pub fn matmul_banded(c: &mut [f32], a: &[f32], b: &[f32], d: Dims, band: Band) {
    d.check(a, b, c);
    // The tile's height is fixed per compiled version: sixteen registers of sums would spill on AVX2.
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx512f") {
        return banded::<MR_WIDE>(c, a, b, d, band, true);
    }
    banded::<MR>(c, a, b, d, band, false)
}

/// [`matmul_banded`] with tiles of `H` rows, compiled into each of its versions.
///
/// Each block of `H` rows of `A` is first copied into a *panel*, the `H` values of one inner index side by
/// side: the tile then reads them at fixed offsets from one pointer, whatever strides `A` has (in place, a
/// feature-major operand puts its rows 8 KiB apart, and the tile spent more instructions on addresses than
/// on sums).
#[inline(always)]
fn banded<const H: usize>(c: &mut [f32], a: &[f32], b: &[f32], d: Dims, band: Band, avx512: bool) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx512;
    let mut panel = vec![0.0f32; H * d.k];
    let mut i0 = 0;
    while i0 < d.m {
        let i1 = (i0 + H).min(d.m);
        let cols = d.cols(band, i1);
        let mut j0 = 0;
        if i1 - i0 == H {
            pack_panel::<H>(&mut panel, a, d, i0);
            #[cfg(target_arch = "x86_64")]
            if avx512 && H == MR_WIDE {
                // Two registers of sums per row where 32 columns remain, one where 16 do.
                while j0 + 2 * NR <= cols {
                    let ks = d.inner(band, (i0, i1), (j0, j0 + 2 * NR));
                    // SAFETY: `avx512` is only true in the version compiled for (and dispatched to on) CPUs
                    // with AVX-512F.
                    unsafe { tile_avx512::<2>(c, &panel, b, d, (i0, j0), ks) };
                    j0 += 2 * NR;
                }
                while j0 + NR <= cols {
                    let ks = d.inner(band, (i0, i1), (j0, j0 + NR));
                    // SAFETY: as above.
                    unsafe { tile_avx512::<1>(c, &panel, b, d, (i0, j0), ks) };
                    j0 += NR;
                }
            }
            while j0 + NR <= cols {
                let ks = d.inner(band, (i0, i1), (j0, j0 + NR));
                tile::<H>(c, &panel, b, d, (i0, j0), ks);
                j0 += NR;
            }
        }
        // Edges: the last rows and columns that do not fill a tile.
        for i in i0..i1 {
            for j in j0..cols {
                let (k0, k1) = d.inner(band, (i0, i1), (j, j + 1));
                let mut acc = 0.0f32;
                for k in k0..k1 {
                    acc += a[i * d.a_row + k * d.a_col] * b[k * d.ldb + j];
                }
                c[i * d.ldc + j] = acc;
            }
        }
        i0 = i1;
    }
}

/// Copies rows `i0..i0 + H` of `A` into `panel`, inner index by inner index: `panel[k·H + r] = A[i0 + r][k]`.
#[inline(always)]
fn pack_panel<const H: usize>(panel: &mut [f32], a: &[f32], d: Dims, i0: usize) {
    if d.a_row == 1 {
        // The H values of one inner index are adjacent in `A` (a transpose read in place).
        for (k, dst) in panel.chunks_exact_mut(H).enumerate() {
            let at = i0 + k * d.a_col;
            dst.copy_from_slice(&a[at..at + H]);
        }
    } else if d.a_col == 1 {
        // Row-major `A`: the panel is the transpose of its H rows.
        transpose_into(panel, H, &a[i0 * d.a_row..], d.a_row, H, d.k);
    } else {
        for r in 0..H {
            let row = (i0 + r) * d.a_row;
            for (k, dst) in panel.chunks_exact_mut(H).enumerate() {
                dst[r] = a[row + k * d.a_col];
            }
        }
    }
}

/// Transposes the 8 × 8 block at `src` (rows `lds` apart) into `dst` (rows `ldd` apart) through eight AVX
/// registers: the packing both attention operands need, at a few shuffles per row where a scalar copy takes
/// a load and a store per value.
///
/// # Safety
/// The CPU has AVX; `src` is valid for reads of 8 values at each of `src + r·lds` and `dst` for writes of 8
/// values at each of `dst + r·ldd` (r < 8), and the two do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose8(dst: *mut f32, ldd: usize, src: *const f32, lds: usize) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps,
        _mm256_unpacklo_ps,
    };
    // SAFETY: the caller's contract.
    let r: [_; 8] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add(i * lds)) });
    let (t0, t1) = (_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpackhi_ps(r[0], r[1]));
    let (t2, t3) = (_mm256_unpacklo_ps(r[2], r[3]), _mm256_unpackhi_ps(r[2], r[3]));
    let (t4, t5) = (_mm256_unpacklo_ps(r[4], r[5]), _mm256_unpackhi_ps(r[4], r[5]));
    let (t6, t7) = (_mm256_unpacklo_ps(r[6], r[7]), _mm256_unpackhi_ps(r[6], r[7]));
    let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
    let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
    let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
    let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
    let cols = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (i, col) in cols.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_ps(dst.add(i * ldd), *col) };
    }
}

/// What a tile `w` columns wide checks once before its loop reads without bounds checks: the panel holds the
/// inner range, the last `B` row ends at (k1 − 1, j0 + w) and the last `C` row at (i0 + H − 1, j0 + w).
/// `banded` only calls with i0 + H ≤ m, j0 + w ≤ n and k1 ≤ k, so after `Dims::check` these always hold; they
/// are asserted here too so the unchecked reads stay sound whatever the caller. An empty inner range leaves
/// nothing to sum: the tile is zeroed and `false` returned.
#[inline(always)]
fn tile_ready<const H: usize>(
    c: &mut [f32],
    panel: &[f32],
    b: &[f32],
    d: Dims,
    (i0, j0, w): (usize, usize, usize),
    (k0, k1): (usize, usize),
) -> bool {
    assert!((i0 + H - 1) * d.ldc + j0 + w <= c.len(), "tile: C out of bounds");
    if k1 <= k0 {
        for r in 0..H {
            let at = (i0 + r) * d.ldc + j0;
            c[at..at + w].fill(0.0);
        }
        return false;
    }
    assert!(k1 * H <= panel.len(), "tile: the panel is short");
    assert!((k1 - 1) * d.ldb + j0 + w <= b.len(), "tile: B out of bounds");
    true
}

/// One `H` × 16 tile of `C` at `(i0, j0)`, summing over `k0..k1` from a packed panel of `A`.
///
/// The loop reads without bounds checks: with them, the checks and their spilled limits outnumber the
/// eight multiply-adds of an iteration several times over.
#[inline(always)]
fn tile<const H: usize>(
    c: &mut [f32],
    panel: &[f32],
    b: &[f32],
    d: Dims,
    (i0, j0): (usize, usize),
    (k0, k1): (usize, usize),
) {
    if !tile_ready::<H>(c, panel, b, d, (i0, j0, NR), (k0, k1)) {
        return;
    }
    let mut acc = [[0.0f32; NR]; H];
    for k in k0..k1 {
        // SAFETY: k < k1, so the panel holds these H values and row k of B from j0 holds NR (asserted above).
        let av: &[f32; H] = unsafe { &*(panel.as_ptr().add(k * H) as *const [f32; H]) };
        let bv: &[f32; NR] = unsafe { &*(b.as_ptr().add(k * d.ldb + j0) as *const [f32; NR]) };
        for r in 0..H {
            for j in 0..NR {
                // `mul_add`: one FMA instruction in the AVX2+FMA version this is compiled into.
                acc[r][j] = av[r].mul_add(bv[j], acc[r][j]);
            }
        }
    }
    for (r, sums) in acc.iter().enumerate() {
        let at = (i0 + r) * d.ldc + j0;
        c[at..at + NR].copy_from_slice(sums);
    }
}

/// [`tile`] with `MR_WIDE` rows of `V` AVX-512 registers (16 columns each), written with intrinsics: given
/// eight rows, the vectoriser keeps the sums in memory instead of in registers. Two registers a row give
/// sixteen independent sums, twice what the multiply-adds' latency needs to keep both units busy.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tile_avx512<const V: usize>(
    c: &mut [f32],
    panel: &[f32],
    b: &[f32],
    d: Dims,
    (i0, j0): (usize, usize),
    ks: (usize, usize),
) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps};
    const H: usize = MR_WIDE;
    const { assert!(V == 1 || V == 2, "one or two registers of sums a row") };
    if !tile_ready::<H>(c, panel, b, d, (i0, j0, V * NR), ks) {
        return;
    }
    let mut acc = [[_mm512_setzero_ps(); V]; H];
    for k in ks.0..ks.1 {
        // SAFETY: row k of B from j0 holds V·16 values and the panel H values at k·H (asserted above);
        // unaligned loads.
        let bv: [_; V] = std::array::from_fn(|v| unsafe { _mm512_loadu_ps(b.as_ptr().add(k * d.ldb + j0 + v * NR)) });
        let av = unsafe { panel.as_ptr().add(k * H) };
        for (r, sums) in acc.iter_mut().enumerate() {
            // SAFETY: r < H, inside the panel's H values for k.
            let a = _mm512_set1_ps(unsafe { *av.add(r) });
            for (sum, bv) in sums.iter_mut().zip(&bv) {
                *sum = _mm512_fmadd_ps(a, *bv, *sum);
            }
        }
    }
    for (r, sums) in acc.iter().enumerate() {
        for (v, sum) in sums.iter().enumerate() {
            // SAFETY: row i0 + r of C from j0 holds V·16 values (the last one asserted above); unaligned store.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr().add((i0 + r) * d.ldc + j0 + v * NR), *sum) };
        }
    }
}

/// The textbook triple loop of [`matmul_banded`], in `f64`, for the tests.
pub fn matmul_banded_reference(c: &mut [f32], a: &[f32], b: &[f32], d: Dims, band: Band) {
    d.check(a, b, c);
    for i in 0..d.m {
        let i0 = i / MR * MR;
        let i1 = (i0 + MR).min(d.m);
        for j in 0..d.cols(band, i1) {
            let j0 = j / NR * NR;
            let full_tile = i1 - i0 == MR && j0 + NR <= d.cols(band, i1);
            let js = if full_tile { (j0, j0 + NR) } else { (j, j + 1) };
            let (k0, k1) = d.inner(band, (i0, i1), js);
            let mut acc = 0.0f64;
            for k in k0..k1 {
                acc += a[i * d.a_row + k * d.a_col] as f64 * b[k * d.ldb + j] as f64;
            }
            c[i * d.ldc + j] = acc as f32;
        }
    }
}

/// The transpose of a row-major `rows × cols` matrix, as a new row-major `cols × rows` one, on all cores: each
/// task transposes a band of the source's columns into its own rows of the result. What turns a feature-major
/// activation token-major (or back) where a pass needs the other layout.
pub fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use rayon::prelude::*;
    assert!(rows.checked_mul(cols) == Some(src.len()), "transpose: {} values for {rows}x{cols}", src.len());
    const BAND: usize = 32;
    let mut dst = vec![0.0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return dst;
    }
    dst.par_chunks_mut(BAND * rows).enumerate().for_each(|(b, out)| {
        let c0 = b * BAND;
        transpose_into(out, rows, &src[c0..], cols, rows, out.len() / rows);
    });
    dst
}

/// `dst (cols × rows, leading dimension ldd) = srcᵀ` for `src` of `rows × cols` with leading dimension `lds`:
/// the packing step between the feature-major activations and the token-major operands attention multiplies.
pub fn transpose_into(dst: &mut [f32], ldd: usize, src: &[f32], lds: usize, rows: usize, cols: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(cols <= lds && rows <= ldd, "transpose_into: leading dimensions");
    // Arithmetic that cannot wrap: the 8 × 8 blocks below read and write unchecked on the strength of these.
    let fits = |len: usize, lines: usize, ld: usize, width: usize| {
        (lines - 1).checked_mul(ld).and_then(|x| x.checked_add(width)).is_some_and(|need| need <= len)
    };
    assert!(fits(src.len(), rows, lds, cols) && fits(dst.len(), cols, ldd, rows), "transpose_into: out of bounds");
    // Whole 8 × 8 blocks through AVX where the CPU has it; the rest (everything elsewhere) value by value.
    #[cfg(target_arch = "x86_64")]
    let (r8, c8) = if std::arch::is_x86_feature_detected!("avx") {
        let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
        // Blocks of 32 × 32, so the lines a block writes are still in L1 when the next 8 × 8 fills their rest.
        const BLOCK: usize = 32;
        for rb in (0..r8).step_by(BLOCK) {
            for cb in (0..c8).step_by(BLOCK) {
                for r0 in (rb..(rb + BLOCK).min(r8)).step_by(8) {
                    for c0 in (cb..(cb + BLOCK).min(c8)).step_by(8) {
                        // SAFETY: AVX was detected; rows r0..r0+8 of `src` hold columns c0..c0+8 and rows
                        // c0..c0+8 of `dst` hold columns r0..r0+8 (inside the bounds asserted above); the
                        // slices are distinct.
                        unsafe {
                            transpose8(dst.as_mut_ptr().add(c0 * ldd + r0), ldd, src.as_ptr().add(r0 * lds + c0), lds)
                        };
                    }
                }
            }
        }
        (r8, c8)
    } else {
        (0, 0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (r8, c8) = (0, 0);
    for r in 0..rows {
        let from = if r < r8 { c8 } else { 0 };
        for c in from..cols {
            dst[c * ldd + r] = src[r * lds + c];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 - 1001.0) / 1001.0).collect()
    }

    #[test]
    fn banded_products_match_the_reference() {
        for &(m, n, k) in &[(128, 128, 64), (128, 64, 128), (37, 29, 23), (3, 3, 2), (4, 16, 1), (64, 48, 64)] {
            for band in [Band::Full, Band::LowerA, Band::UpperA, Band::LowerB, Band::UpperB, Band::LowerC] {
                // A triangular A for the bands that assume one, so the skipped terms really are zero.
                let mut a = values(m * k, 1);
                for i in 0..m {
                    for kk in 0..k {
                        let zero = match band {
                            Band::LowerA => kk > i,
                            Band::UpperA => kk < i,
                            _ => false,
                        };
                        if zero {
                            a[i * k + kk] = 0.0;
                        }
                    }
                }
                let mut b = values(k * n, 2);
                for kk in 0..k {
                    for j in 0..n {
                        let zero = match band {
                            Band::LowerB => kk > j,
                            Band::UpperB => kk < j,
                            _ => false,
                        };
                        if zero {
                            b[kk * n + j] = 0.0;
                        }
                    }
                }
                let d = Dims::packed(m, n, k);
                let (mut c, mut r, mut narrow) = (vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]);
                matmul_banded(&mut c, &a, &b, d, band);
                matmul_banded_reference(&mut r, &a, &b, d, band);
                // The four-row tiles of the versions without AVX-512, which this machine may not dispatch to.
                banded::<MR>(&mut narrow, &a, &b, d, band, false);
                let full = {
                    let mut f = vec![0.0; m * n];
                    matmul_banded_reference(&mut f, &a, &b, d, Band::Full);
                    f
                };
                for i in 0..m {
                    for j in 0..n {
                        if band == Band::LowerC && j > i {
                            continue;
                        }
                        let (got, want) = (c[i * n + j], r[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{band:?} {m}x{n}x{k} [{i},{j}]: {got} vs {want}"
                        );
                        let got = narrow[i * n + j];
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "4-row {band:?} {m}x{n}x{k} [{i},{j}]: {got} vs {want}"
                        );
                        assert!((want - full[i * n + j]).abs() <= 1e-4 * (1.0 + want.abs()), "band skipped a non-zero");
                    }
                }
            }
        }
    }

    #[test]
    fn strided_a_reads_a_transpose_in_place() {
        // A given as the transpose of a row-major k × m matrix stored with leading dimension 40.
        let (m, n, k, ld) = (20, 32, 12, 40);
        let at = values(k * ld, 4);
        let b = values(k * n, 5);
        let mut packed = vec![0.0; m * k];
        for i in 0..m {
            for kk in 0..k {
                packed[i * k + kk] = at[kk * ld + i];
            }
        }
        let (mut c, mut r) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul_banded(&mut c, &at, &b, Dims { a_row: 1, a_col: ld, ..Dims::packed(m, n, k) }, Band::Full);
        matmul_banded_reference(&mut r, &packed, &b, Dims::packed(m, n, k), Band::Full);
        for (x, y) in c.iter().zip(&r) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()));
        }
    }

    #[test]
    fn transpose_packs() {
        // Smaller than one 8 × 8 block, and whole blocks with ragged edges inside larger leading dimensions.
        for (rows, cols, lds, ldd) in [(5, 7, 7, 5), (37, 29, 40, 44), (16, 24, 24, 16)] {
            let src = values(rows * lds, 3);
            let mut dst = vec![-7.0; cols * ldd];
            transpose_into(&mut dst, ldd, &src, lds, rows, cols);
            for c in 0..cols {
                for r in 0..ldd {
                    let want = if r < rows { src[r * lds + c] } else { -7.0 };
                    assert_eq!(dst[c * ldd + r], want, "{rows}x{cols} [{r},{c}]");
                }
            }
        }
    }
}
