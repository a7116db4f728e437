//! Unstructured sparse kernels, written the way the wafer runs them: one AXPY per non-zero weight over the
//! token dimension, and a dot product per non-zero for the weight gradient.
//!
//! A [`SparsePattern`] is a static mask stored compressed by lines (rows for the forward pass, columns for the
//! backward pass). Lines are stored in decreasing order of their non-zero count and dealt round-robin to the
//! workers, so the heaviest lines are spread out and no worker is left with the tail. Two kernels cover all
//! three products of a sparse linear layer:
//! - [`gather`]: `out[line] = Σ values[k] · src[idx[k]]` — forward `Y = W·X` on the row pattern, and backward
//!   `dX = Wᵀ·dY` on the column pattern.
//! - [`sddmm`]: `out[k] = a[line] · b[idx[k]]` — the weight gradient, computed only where the mask has a weight.
//!
//! [`backward`] runs the two backward products in one pass, bit for bit what each gives alone. The kernels work
//! on tiles of tokens ([`crate::tiles`]), taking operands in rows (packed first) or already in tiles.

use multiversion::multiversion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::tensor::{Disjoint, Mat};
use crate::tiles::{self, Acts, ActsRef, Lane, Layout, TILE, Tiles};

/// Above this density a mask is multiplied as a dense matrix: one AXPY per non-zero cannot beat a tuned GEMM
/// when most weights exist, so the sparse path is never much slower than the dense one.
pub const DENSE_ABOVE: f64 = 0.25;

/// A static sparsity mask in compressed form: for each stored line, the inner indices of its non-zeros.
///
/// Values are kept apart (they change every step, the mask never does), in the order of `idx`.
#[derive(Clone, Debug, PartialEq)]
pub struct SparsePattern {
    outer: usize,
    inner: usize,
    order: Vec<u32>,
    ptr: Vec<u32>,
    idx: Vec<u32>,
    /// Every position is kept and stored in natural order, so the values are the dense row-major matrix.
    full: bool,
    /// The order in which the kernels visit the non-zeros (empty when the pattern runs dense).
    schedule: Schedule,
}

impl SparsePattern {
    /// A seeded random mask over a `rows × cols` matrix keeping each weight with probability `density`:
    /// unstructured, as the seeds' sparse models are. Stored by rows.
    pub fn random(rows: usize, cols: usize, density: f64, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let lines = (0..rows)
            .map(|_| (0..cols as u32).filter(|_| rng.random_bool(density.clamp(0.0, 1.0))).collect())
            .collect();
        Self::from_lines(rows, cols, lines)
    }

    /// Builds the compressed form from each line's inner indices (in line order), sorting lines by
    /// decreasing non-zero count and each line's indices increasingly (the gather kernel walks a line's
    /// non-zeros block by block of the source).
    pub fn from_lines(outer: usize, inner: usize, mut lines: Vec<Vec<u32>>) -> Self {
        assert_eq!(lines.len(), outer, "from_lines: {outer} lines expected");
        for line in &mut lines {
            line.sort_unstable();
            line.dedup();
        }
        let mut order: Vec<u32> = (0..outer as u32).collect();
        // Stable sort: equal counts keep index order, so the layout is deterministic.
        order.sort_by_key(|&l| std::cmp::Reverse(lines[l as usize].len()));
        let mut ptr = Vec::with_capacity(outer + 1);
        let mut idx = Vec::with_capacity(lines.iter().map(Vec::len).sum());
        ptr.push(0u32);
        for &l in &order {
            let line = &lines[l as usize];
            debug_assert!(line.iter().all(|&i| (i as usize) < inner));
            idx.extend_from_slice(line);
            ptr.push(idx.len() as u32);
        }
        Self::finish(outer, inner, order, ptr, idx)
    }

    fn finish(outer: usize, inner: usize, order: Vec<u32>, ptr: Vec<u32>, idx: Vec<u32>) -> Self {
        let full = idx.len() == outer * inner
            && order.iter().enumerate().all(|(s, &l)| l as usize == s)
            && idx.iter().enumerate().all(|(k, &i)| i as usize == k % inner.max(1));
        let mut p = SparsePattern { outer, inner, order, ptr, idx, full, schedule: Schedule::default() };
        if !p.full && !p.runs_dense() {
            p.schedule = Schedule::new(&p, rayon::current_num_threads().max(1));
        }
        p
    }

    /// Rebuilds a pattern received over the wire, checking every index so a bad message cannot make a kernel
    /// read out of bounds.
    pub fn from_parts(
        outer: usize,
        inner: usize,
        order: Vec<u32>,
        ptr: Vec<u32>,
        idx: Vec<u32>,
    ) -> Result<Self, String> {
        if order.len() != outer || ptr.len() != outer + 1 {
            return Err(format!("pattern of {outer} lines has {} line ids and {} pointers", order.len(), ptr.len()));
        }
        if ptr[0] != 0 || ptr.windows(2).any(|w| w[0] > w[1]) || ptr[outer] as usize != idx.len() {
            return Err("pattern pointers are not increasing from 0 to the non-zero count".into());
        }
        let mut seen = vec![false; outer];
        for &l in &order {
            let slot = seen.get_mut(l as usize).ok_or_else(|| format!("line id {l} is outside 0..{outer}"))?;
            if std::mem::replace(slot, true) {
                return Err(format!("line id {l} appears twice"));
            }
        }
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= inner) {
            return Err(format!("index {bad} is outside 0..{inner}"));
        }
        if let Some(s) =
            (0..outer).find(|&s| idx[ptr[s] as usize..ptr[s + 1] as usize].windows(2).any(|w| w[0] >= w[1]))
        {
            return Err(format!("the indices of line {} do not strictly increase", order[s]));
        }
        Ok(Self::finish(outer, inner, order, ptr, idx))
    }

    /// The same mask stored by the other dimension, and for each of its non-zeros the position of that
    /// non-zero in `self`: MemoryX uses it to stream values in the order the backward pass consumes them.
    pub fn transpose(&self) -> (SparsePattern, Vec<u32>) {
        let mut lines: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.inner];
        for s in 0..self.outer {
            let line = self.order[s];
            for k in self.ptr[s] as usize..self.ptr[s + 1] as usize {
                lines[self.idx[k] as usize].push((line, k as u32));
            }
        }
        // Each line of the transpose in increasing inner index, as `from_lines` stores it.
        for line in &mut lines {
            line.sort_unstable_by_key(|&(i, _)| i);
        }
        let perm_lines: Vec<Vec<u32>> = lines.iter().map(|l| l.iter().map(|&(_, k)| k).collect()).collect();
        let idx_lines: Vec<Vec<u32>> = lines.into_iter().map(|l| l.into_iter().map(|(i, _)| i).collect()).collect();
        let t = SparsePattern::from_lines(self.inner, self.outer, idx_lines);
        let mut perm = Vec::with_capacity(self.nnz());
        for &l in &t.order {
            perm.extend_from_slice(&perm_lines[l as usize]);
        }
        (t, perm)
    }

    /// Number of stored lines (rows of the matrix the pattern was built by).
    pub fn outer(&self) -> usize {
        self.outer
    }

    /// Length of each line (the other dimension).
    pub fn inner(&self) -> usize {
        self.inner
    }

    /// Number of non-zeros.
    pub fn nnz(&self) -> usize {
        self.idx.len()
    }

    /// Fraction of the `outer × inner` positions that hold a weight.
    pub fn density(&self) -> f64 {
        self.nnz() as f64 / (self.outer * self.inner).max(1) as f64
    }

    /// Whether the kernels take the dense path for this mask (see [`DENSE_ABOVE`]).
    pub fn runs_dense(&self) -> bool {
        self.density() > DENSE_ABOVE
    }

    /// Line id of each stored line, heaviest first.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// Stored line `s` spans `idx()[ptr()[s]..ptr()[s+1]]`.
    pub fn ptr(&self) -> &[u32] {
        &self.ptr
    }

    /// Inner index of each non-zero, tagging its value as the wafer's weight messages are tagged.
    pub fn idx(&self) -> &[u32] {
        &self.idx
    }

    /// Non-zeros per line in line-id order, for balance statistics and the cost model.
    pub fn line_counts(&self) -> Vec<u32> {
        let mut counts = vec![0; self.outer];
        for s in 0..self.outer {
            counts[self.order[s] as usize] = self.ptr[s + 1] - self.ptr[s];
        }
        counts
    }

    /// Bytes of the pattern on the wire: a 4-byte index per non-zero plus line ids and pointers.
    pub fn wire_bytes(&self) -> u64 {
        4 * (self.idx.len() + self.order.len() + self.ptr.len()) as u64
    }

    /// The dense `outer × inner` matrix holding `values` at the mask's positions (for references and tests).
    pub fn to_dense(&self, values: &[f32]) -> Mat {
        let mut m = Mat::zeros(self.outer, self.inner);
        self.fill_dense(values, &mut m.data);
        m
    }

    /// The values at the mask's positions of the dense `outer × inner` matrix `dense`, in the stored order:
    /// what [`SparsePattern::to_dense`] takes back (a pretrained matrix pruned to the mask).
    pub fn values_of(&self, dense: &[f32]) -> Vec<f32> {
        assert_eq!(dense.len(), self.outer * self.inner, "values_of: a {}x{} matrix", self.outer, self.inner);
        let mut values = Vec::with_capacity(self.idx.len());
        for (s, &line) in self.order.iter().enumerate() {
            let row = &dense[line as usize * self.inner..][..self.inner];
            values.extend((self.ptr[s] as usize..self.ptr[s + 1] as usize).map(|k| row[self.idx[k] as usize]));
        }
        values
    }

    /// Writes the dense matrix into `out` (`outer × inner`, row-major), rows in parallel.
    fn fill_dense(&self, values: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.resize(self.outer * self.inner, 0.0);
        let mut stored_at = vec![0usize; self.outer];
        for (s, &line) in self.order.iter().enumerate() {
            stored_at[line as usize] = s;
        }
        if self.inner > 0 {
            out.par_chunks_mut(self.inner).enumerate().for_each(|(line, row)| {
                let s = stored_at[line];
                for k in self.ptr[s] as usize..self.ptr[s + 1] as usize {
                    row[self.idx[k] as usize] = values[k];
                }
            });
        }
    }
}

thread_local! {
    /// The dense matrix of the dense path, kept between calls: a fresh allocation of this size would be
    /// faulted in page by page on every call, which costs as much as the scatter itself.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// The gather kernel's packed source, kept between calls for the same reason as [`SCRATCH`].
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on the thread's buffer `key`, taken out for the call and put back after it. The kernels fork while
/// they hold it, and a rayon worker waiting at a join may start another job meanwhile (another engine's pass, on
/// [`super::on_workers`]): that call finds the buffer taken and works in a new one, where a `RefCell` borrow held
/// across the fork would panic.
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<f32>>>,
    f: impl FnOnce(&mut Vec<f32>) -> R,
) -> R {
    let mut buffer = key.take();
    let result = f(&mut buffer);
    key.set(buffer);
    result
}

/// Where the gather (or the backward pass's `dX`) writes a part's sums.
#[derive(Clone, Copy)]
enum Out {
    /// A `lines × tokens` row-major matrix: each tile's sums are built in a scratch and copied to the rows.
    Rows(Disjoint<f32>),
    /// Tiles of `lines` lanes each: each tile's sums are copied to their lanes whole, and the layers that read
    /// them do not pack them.
    Tiles(Disjoint<Lane>, usize),
}

fn workers(work: usize) -> usize {
    if work < crate::PARALLEL_MIN_FLOPS { 1 } else { rayon::current_num_threads().max(1) }
}

/// Runs `run` on every part of `schedule`: on the thread pool when `work` (the kernel's multiply-adds) is
/// enough to pay for it, in turn otherwise. The parts write disjoint outputs, so the order cannot change a
/// result; the gather, the SDDMM and the fused backward dispatch through here.
fn for_each_part(schedule: &Schedule, work: usize, run: impl Fn(&Part) + Sync + Send) {
    if workers(work) > 1 {
        schedule.parts.par_iter().for_each(run);
    } else {
        schedule.parts.iter().for_each(run);
    }
}

/// `out[order[s], :] = Σ_k values[k] · src[idx[k], :]` for every stored line `s`: one AXPY per non-zero.
///
/// `src` has a row per inner index and the result a row per line; both have one column per token. The result
/// is written once, not zeroed first.
pub fn gather(p: &SparsePattern, values: &[f32], src: &Mat) -> Mat {
    gather_as(p, values, src.into(), Layout::Rows).into_rows()
}

/// [`gather`] over a source in either layout, the output in `layout` (rows whatever is asked when the mask
/// runs dense, see [`Layout::Tiles`]): a source in tiles is read as it is, and an output in tiles is built in
/// place, where rows are packed into tiles first and the sums copied out to rows after.
pub fn gather_as(p: &SparsePattern, values: &[f32], src: ActsRef<'_>, layout: Layout) -> Acts {
    assert_eq!(values.len(), p.nnz(), "gather: {} values for {} non-zeros", values.len(), p.nnz());
    assert_eq!(src.rows(), p.inner, "gather: source has {} rows, pattern needs {}", src.rows(), p.inner);
    let (rows, tokens) = (p.outer, src.tokens());
    if p.full {
        let view = super::dense::MatView::new(values, p.outer, p.inner);
        return Acts::Rows(Mat::from_vec(rows, tokens, super::dense::product(view, src.to_rows().view())));
    }
    if p.runs_dense() {
        return with_buffer(&SCRATCH, |w| {
            p.fill_dense(values, w);
            let view = super::dense::MatView::new(w, p.outer, p.inner);
            Acts::Rows(Mat::from_vec(rows, tokens, super::dense::product(view, src.to_rows().view())))
        });
    }
    if p.inner == 0 || tokens == 0 {
        let zeros = Mat::zeros(rows, tokens);
        return match layout {
            Layout::Rows => Acts::Rows(zeros),
            Layout::Tiles => Acts::Tiles(Tiles::from_rows(&zeros)),
        };
    }
    with_buffer(&PACKED, |scratch| {
        let tiles = lanes_of(src, scratch);
        gather_tiles(p, values, tiles, tokens, layout)
    })
}

/// The source's lanes: its own when it is in tiles, else packed into `scratch`.
fn lanes_of<'s>(src: ActsRef<'s>, scratch: &'s mut Vec<f32>) -> &'s [Lane] {
    match src {
        ActsRef::Tiles(t) => t.lanes(),
        ActsRef::Rows(m) => pack_tiles(&m.data, m.rows, m.cols, scratch),
    }
}

/// The gather over a source in tiles (`tokens` columns, `p.inner` rows), as a new `p.outer × tokens`
/// activation in `layout`.
fn gather_tiles(p: &SparsePattern, values: &[f32], tiles: &[Lane], tokens: usize, layout: Layout) -> Acts {
    // The writes below trust this shape: every tile holds a lane per source row.
    assert_eq!(
        tiles.len(),
        Tiles::count(tokens) * p.inner,
        "gather: {} lanes for {tokens} tokens of {} rows",
        tiles.len(),
        p.inner
    );
    let run = |out: Out| {
        for_each_part(&p.schedule, p.nnz() * tokens, |part| {
            // SAFETY: `out` holds every line of the pattern (`written_by_parts`), each part writes only its own,
            // and `tiles` holds `Tiles::count(tokens)` tiles of `p.inner` lanes (asserted above).
            unsafe { gather_part(part, values, tiles, p.inner, tokens, out) }
        })
    };
    // SAFETY: `gather_part` writes every token of each of its part's lines to `out` (tile by tile), and only
    // those; the parts deal all the lines.
    unsafe { written_by_parts(p.outer, tokens, layout, run) }
}

/// A new `lines × tokens` activation in `layout`, written through `run` by the parts of a schedule.
///
/// # Safety
/// `run` must write every value of every line (rows: tokens `0..tokens` of each row; tiles: every lane, padding
/// included), each part only the lines it was dealt, which is what makes the parts' writes disjoint.
unsafe fn written_by_parts(lines: usize, tokens: usize, layout: Layout, run: impl FnOnce(Out)) -> Acts {
    match layout {
        Layout::Rows => {
            let len = lines * tokens;
            let mut data: Vec<f32> = Vec::with_capacity(len);
            run(Out::Rows(Disjoint(data.as_mut_ptr())));
            // SAFETY: `run` wrote all `len` values (the caller's promise), through raw pointers, before the
            // length is set.
            unsafe { data.set_len(len) };
            Acts::Rows(Mat::from_vec(lines, tokens, data))
        }
        Layout::Tiles => {
            let len = Tiles::count(tokens) * lines;
            let mut lanes: Vec<Lane> = Vec::with_capacity(len);
            run(Out::Tiles(Disjoint(lanes.as_mut_ptr()), lines));
            // SAFETY: as for rows: all `len` lanes were written.
            unsafe { lanes.set_len(len) };
            // The padding holds sums of the source's padding, zeros.
            Acts::Tiles(Tiles::from_lanes(lines, tokens, lanes))
        }
    }
}

/// Both gradients of a sparse layer whose pattern is stored by input column (as the backward pass streams
/// it): `dx = Wᵀ·dy` as the gather computes it and the weight gradient `dw` at the mask's positions as the SDDMM
/// does, bit for bit. Both read the same lanes of `dy` in the same order, so one pass over the pattern computes
/// the two (see `backward_tiles`), packing `dy` once and reading each of its lanes once per non-zero, where
/// calling [`gather`] and [`sddmm`] in turn would pack it twice and read it twice.
///
/// Returns `(dw, dx)`: the weight gradient in the pattern's order, then the input gradient.
pub fn backward(p: &SparsePattern, values: &[f32], x: &Mat, dy: &Mat) -> (Vec<f32>, Mat) {
    let (dw, dx) = backward_as(p, values, x.into(), dy.into(), Layout::Rows);
    (dw, dx.into_rows())
}

/// [`backward`] over operands in either layout (each read as it is when in tiles), `dx` in `layout` (see
/// [`gather_as`]).
pub fn backward_as(
    p: &SparsePattern,
    values: &[f32],
    x: ActsRef<'_>,
    dy: ActsRef<'_>,
    layout: Layout,
) -> (Vec<f32>, Acts) {
    assert_eq!(values.len(), p.nnz(), "backward: {} values for {} non-zeros", values.len(), p.nnz());
    assert_eq!(dy.rows(), p.inner, "backward: dy has {} rows, pattern needs {}", dy.rows(), p.inner);
    assert_eq!(x.rows(), p.outer, "backward: x has {} rows, pattern has {} lines", x.rows(), p.outer);
    assert_eq!(x.tokens(), dy.tokens(), "backward: token counts differ");
    let tokens = dy.tokens();
    let mut dw = vec![0.0; p.nnz()];
    if p.full || p.runs_dense() || p.inner == 0 || tokens == 0 {
        let dx = gather_as(p, values, dy, layout);
        sddmm_as(p, x, dy, &mut dw);
        return (dw, dx);
    }
    let dx = with_buffer(&PACKED, |packed_dy| {
        with_buffer(&SCRATCH, |packed_x| {
            let dy_tiles = lanes_of(dy, packed_dy);
            let x_tiles = lanes_of(x, packed_x);
            backward_tiles(p, values, x_tiles, dy_tiles, tokens, layout, &mut dw)
        })
    });
    (dw, dx)
}

/// The order in which the gather and SDDMM kernels visit a pattern's non-zeros, fixed when the pattern is built.
///
/// The source is cut into tiles of [`TILE`] tokens. Within a tile, the source rows are taken a block at a time
/// (a block fits in L1), and a group of lines (see [`group_lines`]) takes its non-zeros that fall in the block,
/// shortest run first, before the next block is touched; then the next group walks the blocks again. Walking
/// the compressed lines in that order would jump between lines for every block, so the indices are stored once
/// more, already in visiting order, and read straight through.
#[derive(Clone, Debug, Default, PartialEq)]
struct Schedule {
    parts: Vec<Part>,
}

/// The share of one worker: lines dealt round-robin from the heaviest down, so the parts carry equal work.
#[derive(Clone, Debug, Default, PartialEq)]
struct Part {
    /// Destination row of each of the part's lines.
    lines: Vec<u32>,
    /// Runs of non-zeros in visiting order: local line, and where the run ends in `idx`/`at`.
    runs: Vec<(u32, u32)>,
    /// Source row of each non-zero, in visiting order.
    idx: Vec<u32>,
    /// Position of each non-zero in the pattern's own order, where its value is.
    at: Vec<u32>,
}

impl Schedule {
    /// One part per worker, the stored lines dealt round-robin from the heaviest down, so the parts carry
    /// equal work.
    fn new(p: &SparsePattern, parts: usize) -> Self {
        let (block, group) = (block_rows(p), group_lines(p));
        Schedule {
            parts: (0..parts).map(|w| Part::new(p, (w..p.outer).step_by(parts).collect(), block, group)).collect(),
        }
    }
}

impl Part {
    /// The runs in visiting order as (local line, end in `idx`, local line of the run after it): the kernels
    /// prefetch that next line's lanes while a run computes (see [`prefetch_lane`]).
    fn runs_ahead(&self) -> impl Iterator<Item = (u32, u32, Option<u32>)> + '_ {
        let next = self.runs.iter().skip(1).map(|&(j, _)| Some(j)).chain([None]);
        self.runs.iter().zip(next).map(|(&(j, end), next)| (j, end, next))
    }

    /// The visiting order of the stored lines `mine`: group by group of lines, block by block of source rows,
    /// and within a block the group's runs from the shortest to the longest.
    fn new(p: &SparsePattern, mine: Vec<usize>, block: usize, group: usize) -> Self {
        let mut part = Part { lines: mine.iter().map(|&s| p.order[s]).collect(), ..Part::default() };
        part.idx.reserve(mine.iter().map(|&s| (p.ptr[s + 1] - p.ptr[s]) as usize).sum());
        part.at.reserve(part.idx.capacity());
        let mut next: Vec<usize> = mine.iter().map(|&s| p.ptr[s] as usize).collect();
        let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(group);
        for first in (0..mine.len()).step_by(group) {
            let lines = first..(first + group).min(mine.len());
            for b1 in (block..p.inner + block).step_by(block) {
                runs.clear();
                for j in lines.clone() {
                    let (start, end) = (next[j], p.ptr[mine[j] + 1] as usize);
                    // Indices increase along a line (see `from_lines`), so this block's non-zeros come next.
                    let stop = start + p.idx[start..end].partition_point(|&i| (i as usize) < b1);
                    if stop > start {
                        runs.push((j, start, stop));
                    }
                    next[j] = stop;
                }
                // Shortest runs first: a run's loop then exits after as many non-zeros as the run before it
                // most of the time, which the branch predictor learns, where runs in line order (lengths at
                // random around the mean) mispredicted nearly every exit. Each line still has one run per
                // block, so its sums are built in the same order and the results keep their bits.
                // Ties keep line order (`j` is pushed increasing and unique), so the schedule is deterministic
                // without a stable sort's scratch buffer.
                runs.sort_unstable_by_key(|&(j, start, stop)| (stop - start, j));
                for &(j, start, stop) in &runs {
                    part.idx.extend_from_slice(&p.idx[start..stop]);
                    part.at.extend(start as u32..stop as u32);
                    part.runs.push((j as u32, part.idx.len() as u32));
                }
            }
        }
        part
    }
}

/// Lines whose sums are built together while one block of source rows is consumed: the block stays in L1,
/// each line's sums are loaded into registers once per run of its non-zeros in the block, and the whole tile
/// of source rows is read from L2 once per group. Their sums take a quarter of the tile's bytes, between 64 and
/// 256 lines: a wide source (768 rows and more) is then read fewer times per tile (a 90% sparse step at width
/// 768 5–8% faster than with 64), while a narrow one keeps small groups, whose sums stay close to L1.
fn group_lines(p: &SparsePattern) -> usize {
    (p.inner / 4).clamp(64, 256)
}

/// Source rows per block: as many as fill 8 KiB of L1 data cache (a quarter of the smallest in use), or more when the pattern is so
/// sparse that a line would have fewer than eight non-zeros per block (each run reloads the line's sums).
fn block_rows(p: &SparsePattern) -> usize {
    let l1_rows = (8 << 10) / std::mem::size_of::<Lane>();
    let per_line = (p.nnz() / p.outer.max(1)).max(1);
    l1_rows.max((p.inner * 8).div_ceil(per_line)).min(p.inner.max(1))
}

/// Lays the `rows × tokens` source out as tiles of [`TILE`] tokens, each tile `rows` contiguous lanes,
/// zero-padded past the last token: the kernel always works on whole lanes, and rows of activations that are a
/// power of two apart no longer fall onto the same few cache sets.
fn pack_tiles<'s>(src: &[f32], rows: usize, tokens: usize, scratch: &'s mut Vec<f32>) -> &'s [Lane] {
    let tiles = tokens.div_ceil(TILE);
    let floats = tiles * rows * TILE;
    // Lanes start at the first address of the scratch aligned for them. The scratch only grows: every lane is
    // written in full below, so clearing it first (a memset of the whole buffer per call) would be wasted.
    if scratch.len() < floats + TILE {
        scratch.resize(floats + TILE, 0.0);
    }
    let skip = scratch.as_ptr().align_offset(std::mem::align_of::<Lane>());
    let buf = &mut scratch[skip..skip + floats];
    tiles::pack(src, rows, tokens, buf);
    // SAFETY: `buf` starts at an address aligned for `Lane` (by `skip`), holds `tiles * rows` whole lanes of
    // initialised `f32`s, and `Lane` is `TILE` floats with no padding (see its definition).
    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const Lane, tiles * rows) }
}

/// The gather for one part: tile by tile, every line's sums built in visiting order, then copied to the output
/// (to its row's tokens of the tile, or whole to its lane of the tile).
///
/// # Safety
/// `out` points at a buffer that holds every line of the pattern (`Out::Rows`: `tokens` values a line;
/// `Out::Tiles`: a lane a line in each of `tokens.div_ceil(TILE)` tiles) and that no one else writes or reads
/// while this runs, except other parts writing other lines; `tiles` holds `tokens.div_ceil(TILE)` tiles of
/// `rows` lanes.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
unsafe fn gather_part(part: &Part, values: &[f32], tiles: &[Lane], rows: usize, tokens: usize, out: Out) {
    // Fused multiply-adds where the compiled version has them (one instruction, one rounding); elsewhere
    // `mul_add` would be a library call per element.
    if multiversion::target::target_cfg_f!(target_feature = "fma") {
        unsafe { gather_part_with::<true>(part, values, tiles, rows, tokens, out) }
    } else {
        unsafe { gather_part_with::<false>(part, values, tiles, rows, tokens, out) }
    }
}

/// [`gather_part`], with or without fused multiply-adds.
///
/// # Safety
/// As [`gather_part`].
#[inline(always)]
unsafe fn gather_part_with<const FMA: bool>(
    part: &Part,
    values: &[f32],
    tiles: &[Lane],
    rows: usize,
    tokens: usize,
    out: Out,
) {
    // The part's values in visiting order, gathered once for all tiles.
    let vals: Vec<f32> = part.at.iter().map(|&k| values[k as usize]).collect();
    // Each tile's sums are built in one compact scratch, reused from tile to tile, and then copied out, in rows or
    // in tiles alike: building them straight in the output's own lanes was 4% slower a 90% sparse step.
    let mut acc = vec![Lane([0.0; TILE]); part.lines.len()];
    for (t, tile) in tiles.chunks_exact(rows).enumerate() {
        acc.fill(Lane([0.0; TILE]));
        let mut k = 0;
        for (j, end, next) in part.runs_ahead() {
            if let Some(next) = next {
                prefetch_lane(acc.as_ptr().wrapping_add(next as usize));
            }
            let a = &mut acc[j as usize];
            let mut sum = a.0;
            for (&v, &i) in vals[k..end as usize].iter().zip(&part.idx[k..end as usize]) {
                axpy::<FMA>(&mut sum, v, &tile[i as usize]);
            }
            a.0 = sum;
            k = end as usize;
        }
        // SAFETY: the caller's promise, as `copy_out` needs it.
        unsafe { copy_out(&acc, &part.lines, t, tokens, out) };
    }
}

/// Copies a part's sums over tile `t` (`acc[j]` for its local line `j`) to the output.
///
/// # Safety
/// As [`gather_part`]: the lines are the part's own, and `out` holds them.
#[inline(always)]
unsafe fn copy_out(acc: &[Lane], lines: &[u32], t: usize, tokens: usize, out: Out) {
    match out {
        Out::Rows(dst) => {
            let (t0, tl) = (t * TILE, TILE.min(tokens - t * TILE));
            for (a, &line) in acc.iter().zip(lines) {
                // SAFETY: see `written_by_parts`: row `line` belongs to this part alone and lies inside the buffer,
                // which may not be initialised yet, so it is written through a raw copy rather than a slice.
                unsafe { std::ptr::copy_nonoverlapping(a.0.as_ptr(), dst.ptr().add(line as usize * tokens + t0), tl) };
            }
        }
        Out::Tiles(dst, count) => {
            for (a, &line) in acc.iter().zip(lines) {
                // SAFETY: see `written_by_parts`: lane `line` of tile `t` (at `t · count + line`) belongs to this
                // part alone and lies inside the buffer; it may not be initialised yet, so it is written.
                unsafe { dst.ptr().add(t * count + line as usize).write(*a) };
            }
        }
    }
}

/// Both gradients of a sparse layer over operands in tiles, in one pass over the pattern: `dX = Wᵀ·dY` as a new
/// activation in `layout`, and the weight gradient into `dw` (one value per non-zero, length checked here).
/// Each non-zero reads its lane of `dY` once for both products, where the gather and the SDDMM in turn read it
/// twice; the sums are built in the same order as theirs, so the bits are the same.
fn backward_tiles(
    p: &SparsePattern,
    values: &[f32],
    x_tiles: &[Lane],
    dy_tiles: &[Lane],
    tokens: usize,
    layout: Layout,
    dw: &mut [f32],
) -> Acts {
    let tiles = Tiles::count(tokens);
    assert!(
        x_tiles.len() == tiles * p.outer && dy_tiles.len() == tiles * p.inner,
        "backward: operands are not {tiles} tiles of {}/{} rows",
        p.outer,
        p.inner
    );
    assert_eq!(dw.len(), p.nnz(), "backward: {} weight gradients for {} non-zeros", dw.len(), p.nnz());
    let dst = Disjoint(dw.as_mut_ptr());
    let run = |out: Out| {
        for_each_part(&p.schedule, 2 * p.nnz() * tokens, |part| {
            // SAFETY: `out` holds every line of the pattern (`written_by_parts`) and `dw` every non-zero, each
            // part writes only its own, and both operands hold `tiles` tiles (asserted above).
            unsafe { backward_part(part, values, (x_tiles, p.outer), (dy_tiles, p.inner), tokens, out, dst) }
        })
    };
    // SAFETY: `backward_part` writes every token of each of its part's lines to `out`, as `gather_part` does,
    // and `dw` only at its own non-zeros' positions (each inside `dw`, whose length is checked above).
    unsafe { written_by_parts(p.outer, tokens, layout, run) }
}

/// One part of [`backward_tiles`]: tile by tile, each run keeps its line's `dX` sums and its lane of `x` in
/// registers while its non-zeros' lanes of `dY` are read once each, for the AXPY and the dot product.
///
/// # Safety
/// As [`gather_part`] for `out`, and as [`sddmm_part`] for `dw`; `x` and `dy` hold exactly
/// `Tiles::count(tokens)` tiles each (of `x.1` and `dy.1` lanes), or some lines' lanes would go unwritten.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
unsafe fn backward_part(
    part: &Part,
    values: &[f32],
    x: (&[Lane], usize),
    dy: (&[Lane], usize),
    tokens: usize,
    out: Out,
    dw: Disjoint<f32>,
) {
    // Fused multiply-adds where the compiled version has them, as in `gather_part`.
    if multiversion::target::target_cfg_f!(target_feature = "fma") {
        unsafe { backward_part_with::<true>(part, values, x, dy, tokens, out, dw) }
    } else {
        unsafe { backward_part_with::<false>(part, values, x, dy, tokens, out, dw) }
    }
}

/// [`backward_part`], with or without fused multiply-adds.
///
/// # Safety
/// As [`backward_part`].
#[inline(always)]
unsafe fn backward_part_with<const FMA: bool>(
    part: &Part,
    values: &[f32],
    (x_tiles, x_rows): (&[Lane], usize),
    (dy_tiles, dy_rows): (&[Lane], usize),
    tokens: usize,
    out: Out,
    dw: Disjoint<f32>,
) {
    let vals: Vec<f32> = part.at.iter().map(|&k| values[k as usize]).collect();
    let n = part.idx.len();
    // The runs end where the next begins and the last at the end of `idx` (see `Part::new`): every partial sum
    // below `n` is written by the first tile, before any is read.
    assert_eq!(part.runs.last().map_or(0, |r| r.1 as usize), n, "backward: the runs do not cover the part");
    let mut sums: Vec<Partial> = Vec::with_capacity(n);
    let mut acc = vec![Lane([0.0; TILE]); part.lines.len()];
    for (t, (tx, tdy)) in x_tiles.chunks_exact(x_rows).zip(dy_tiles.chunks_exact(dy_rows)).enumerate() {
        acc.fill(Lane([0.0; TILE]));
        if t == 0 {
            // SAFETY: `sums` has room for `n`, which the runs cover (checked above); the first tile writes them.
            unsafe { backward_tile::<FMA, true>(part, &vals, tx, tdy, &mut acc, sums.as_mut_ptr()) };
            // SAFETY: all `n` partial sums were just written.
            unsafe { sums.set_len(n) };
        } else {
            // SAFETY: as above, and the sums are initialised.
            unsafe { backward_tile::<FMA, false>(part, &vals, tx, tdy, &mut acc, sums.as_mut_ptr()) };
        }
        // SAFETY: the caller's promise, as `copy_out` needs it.
        unsafe { copy_out(&acc, &part.lines, t, tokens, out) };
    }
    for (sum, &at) in sums.iter().zip(&part.at) {
        // SAFETY: see `backward_tiles`: position `at` belongs to this part alone and lies inside `dw`.
        unsafe { *dw.ptr().add(at as usize) = fold(sum) };
    }
}

/// One tile of [`backward_part_with`]: for each run, its line's `dX` sums over the tile and the partial dot
/// products of its non-zeros, starting from zero on the first tile (`FIRST`, where `sums` is not yet
/// initialised) and added to after.
///
/// # Safety
/// `sums` points at room for a partial sum per non-zero of the part, initialised unless `FIRST`, which nothing
/// else touches meanwhile.
#[inline(always)]
unsafe fn backward_tile<const FMA: bool, const FIRST: bool>(
    part: &Part,
    vals: &[f32],
    tx: &[Lane],
    tdy: &[Lane],
    acc: &mut [Lane],
    sums: *mut Partial,
) {
    let mut k = 0;
    for (j, end, next) in part.runs_ahead() {
        if let Some(next) = next {
            prefetch_lane(acc.as_ptr().wrapping_add(next as usize));
            prefetch_lane(tx.as_ptr().wrapping_add(part.lines[next as usize] as usize));
        }
        let a = &mut acc[j as usize];
        let mut sum = a.0;
        // The line's lane of `x`, copied so it stays in registers across the run (see `sddmm_part_with`).
        let line = &{ tx[part.lines[j as usize] as usize] };
        for (q, (&v, &i)) in vals[k..end as usize].iter().zip(&part.idx[k..end as usize]).enumerate() {
            let src = &tdy[i as usize];
            axpy::<FMA>(&mut sum, v, src);
            // SAFETY: `k + q` is one of the part's non-zeros, below the room the caller promised.
            let slot = unsafe { sums.add(k + q) };
            // SAFETY: initialised unless `FIRST` (the caller's promise).
            let mut partial = if FIRST { [0.0; PARTIAL] } else { unsafe { (*slot).0 } };
            dot_lane_into::<FMA>(&mut partial, line, src);
            // SAFETY: as above; written, as it may not be initialised yet.
            unsafe { slot.write(Partial(partial)) };
        }
        a.0 = sum;
        k = end as usize;
    }
}

/// Asks for the cache lines of the lane at `lane` ahead of its use: the next run's sums (and its line's lane of
/// the other operand) are known a run early, and loading them then hides the wait for L2 that every run's first
/// loads otherwise stalled on. A hint only: it never faults, whatever the address.
#[inline(always)]
fn prefetch_lane(lane: *const Lane) {
    #[cfg(target_arch = "x86_64")]
    for line in 0..std::mem::size_of::<Lane>() / 64 {
        // SAFETY: a prefetch reads nothing the program can observe and cannot fault, even at an address outside
        // any allocation; `wrapping_add` computes the address without claiming it is in bounds.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (lane as *const i8).wrapping_add(64 * line),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = lane;
}

/// `sum += v · x` over one lane: the wafer's AXPY of one non-zero weight over a tile of tokens.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index over lanes the compiler vectorises
fn axpy<const FMA: bool>(sum: &mut [f32; TILE], v: f32, x: &Lane) {
    for j in 0..TILE {
        sum[j] = if FMA { v.mul_add(x.0[j], sum[j]) } else { sum[j] + v * x.0[j] };
    }
}

/// `out[k] = a[order[s], :] · b[idx[k], :]` for every non-zero `k` of line `s`: the sampled dense-dense product
/// that gives a weight gradient only where the mask holds a weight.
pub fn sddmm(p: &SparsePattern, a: &Mat, b: &Mat, out: &mut [f32]) {
    sddmm_as(p, a.into(), b.into(), out)
}

/// [`sddmm`] over operands in either layout, each read as it is when in tiles.
pub fn sddmm_as(p: &SparsePattern, a: ActsRef<'_>, b: ActsRef<'_>, out: &mut [f32]) {
    assert_eq!(out.len(), p.nnz(), "sddmm: {} outputs for {} non-zeros", out.len(), p.nnz());
    assert_eq!(a.rows(), p.outer, "sddmm: a has {} rows, pattern has {} lines", a.rows(), p.outer);
    assert_eq!(b.rows(), p.inner, "sddmm: b has {} rows, pattern needs {}", b.rows(), p.inner);
    assert_eq!(a.tokens(), b.tokens(), "sddmm: token counts differ");
    if p.full {
        let (a, b) = (a.to_rows(), b.to_rows());
        super::dense::matmul(out, a.view(), b.view().t(), false);
        return;
    }
    if p.runs_dense() {
        let (a, b) = (a.to_rows(), b.to_rows());
        with_buffer(&SCRATCH, |full| {
            full.clear();
            full.resize(p.outer * p.inner, 0.0);
            super::dense::matmul(full, a.view(), b.view().t(), false);
            for (s, &line) in p.order.iter().enumerate() {
                let row = &full[line as usize * p.inner..(line as usize + 1) * p.inner];
                for k in p.ptr[s] as usize..p.ptr[s + 1] as usize {
                    out[k] = row[p.idx[k] as usize];
                }
            }
        });
        return;
    }
    if a.tokens() == 0 {
        out.fill(0.0);
        return;
    }
    with_buffer(&PACKED, |packed_b| {
        with_buffer(&SCRATCH, |packed_a| {
            let a_tiles = lanes_of(a, packed_a);
            let b_tiles = lanes_of(b, packed_b);
            sddmm_tiles(p, a_tiles, b_tiles, a.tokens(), out);
        })
    });
}

/// The SDDMM over operands already packed into tiles (`p.outer` and `p.inner` rows, `tokens` columns), into
/// `out`, one value per non-zero (length checked by the caller).
fn sddmm_tiles(p: &SparsePattern, a_tiles: &[Lane], b_tiles: &[Lane], tokens: usize, out: &mut [f32]) {
    let tiles = Tiles::count(tokens);
    assert!(
        a_tiles.len() == tiles * p.outer && b_tiles.len() == tiles * p.inner,
        "sddmm: operands are not {tiles} tiles of {}/{} rows",
        p.outer,
        p.inner
    );
    let dst = Disjoint(out.as_mut_ptr());
    let run = |part: &Part| {
        // SAFETY: each part writes only `out[at]` for its own non-zeros; the parts deal the lines, so
        // every position of `out` (one per non-zero, `out.len() == nnz` checked by the caller) is written by one part.
        unsafe { sddmm_part(part, a_tiles, b_tiles, p.outer, p.inner, dst) }
    };
    for_each_part(&p.schedule, p.nnz() * tokens, run);
}

/// The weight gradient of one part, in the gather kernel's visiting order: for each run, the line's lane of
/// `a` stays in registers while the source lanes of its non-zeros are dotted with it; the sums of all tiles
/// build up in visiting order and are written to their places in the pattern's order once, at the end.
///
/// # Safety
/// `out` points at a buffer holding a value for every non-zero position of the pattern, which no one else
/// reads or writes while this runs except other parts writing their own positions; the tiles hold `a_rows` and
/// `b_rows` lanes each.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
unsafe fn sddmm_part(
    part: &Part,
    a_tiles: &[Lane],
    b_tiles: &[Lane],
    a_rows: usize,
    b_rows: usize,
    out: Disjoint<f32>,
) {
    // Fused multiply-adds where the compiled version has them, as in `gather_part`.
    if multiversion::target::target_cfg_f!(target_feature = "fma") {
        unsafe { sddmm_part_with::<true>(part, a_tiles, b_tiles, a_rows, b_rows, out) }
    } else {
        unsafe { sddmm_part_with::<false>(part, a_tiles, b_tiles, a_rows, b_rows, out) }
    }
}

/// [`sddmm_part`], with or without fused multiply-adds.
///
/// # Safety
/// As [`sddmm_part`]: `out` is the output's buffer and the part's non-zeros are its own.
#[inline(always)]
unsafe fn sddmm_part_with<const FMA: bool>(
    part: &Part,
    a_tiles: &[Lane],
    b_tiles: &[Lane],
    a_rows: usize,
    b_rows: usize,
    out: Disjoint<f32>,
) {
    // One register-wide partial sum per non-zero, folded to a number once at the end: folding each tile's
    // product to a scalar cost more shuffles than the product had multiplies.
    let n = part.idx.len();
    let mut sums: Vec<Partial> = Vec::with_capacity(n);
    let mut pairs = a_tiles.chunks_exact(a_rows).zip(b_tiles.chunks_exact(b_rows));
    match pairs.next() {
        // The first tile's products are written as the sums' starting values, where zeroing the sums first was
        // one more pass over 64 bytes a non-zero (megabytes a layer, out of cache) and the first tile read the
        // zeros back. Each is the same dot product onto a zero as before, so the bits are the same.
        Some((ta, tb)) => {
            let slots = &mut sums.spare_capacity_mut()[..n];
            let mut k = 0;
            for &(j, end) in &part.runs {
                let line = &{ ta[part.lines[j as usize] as usize] };
                for (slot, &i) in slots[k..end as usize].iter_mut().zip(&part.idx[k..end as usize]) {
                    let mut sum = [0.0; PARTIAL];
                    dot_lane_into::<FMA>(&mut sum, line, &tb[i as usize]);
                    slot.write(Partial(sum));
                }
                k = end as usize;
            }
            // The runs end where the next begins and the last at the end of `idx` (see `Part::new`).
            assert_eq!(k, n, "sddmm: the runs cover {k} of {n} non-zeros");
            // SAFETY: the runs cover `0..n` without gaps (checked just above), and each slot was written.
            unsafe { sums.set_len(n) };
        }
        None => sums.resize(n, Partial([0.0; PARTIAL])),
    }
    for (ta, tb) in pairs {
        let mut k = 0;
        for (j, end, next) in part.runs_ahead() {
            if let Some(next) = next {
                prefetch_lane(ta.as_ptr().wrapping_add(part.lines[next as usize] as usize));
            }
            // A copy of the line's lane, so it stays in registers across the run: through a reference into the
            // tile it was read again for every non-zero, the compiler unable to tell the sums' stores from it.
            let line = &{ ta[part.lines[j as usize] as usize] };
            for (sum, &i) in sums[k..end as usize].iter_mut().zip(&part.idx[k..end as usize]) {
                dot_lane_into::<FMA>(&mut sum.0, line, &tb[i as usize]);
            }
            k = end as usize;
        }
    }
    for (sum, &at) in sums.iter().zip(&part.at) {
        // SAFETY: see `sddmm_tiles`: position `at` belongs to this part alone and lies inside `out`.
        unsafe { *out.0.add(at as usize) = fold(sum) };
    }
}

/// Lanes of a partial sum: one AVX-512 register of `f32`.
const PARTIAL: usize = 16;

/// A non-zero's running dot product, one register wide.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Partial([f32; PARTIAL]);

/// Adds the dot product of two lanes to a register-wide partial sum: the lane's register-wide pieces multiplied and added
/// element-wise, every operation a whole-register one.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index over lanes the compiler vectorises
fn dot_lane_into<const FMA: bool>(sum: &mut [f32; PARTIAL], a: &Lane, b: &Lane) {
    for j in 0..PARTIAL {
        // Two chains, the even pieces onto the running sum and the odd ones onto the first odd product, joined
        // at the end: half the latency of one chain of eight.
        let piece = |q: usize| (a.0[q * PARTIAL + j], b.0[q * PARTIAL + j]);
        let madd = |(x, y): (f32, f32), s: f32| if FMA { x.mul_add(y, s) } else { s + x * y };
        let (x, y) = piece(1);
        let (mut even, mut odd) = (madd(piece(0), sum[j]), x * y);
        for q in 1..TILE / PARTIAL / 2 {
            even = madd(piece(2 * q), even);
            odd = madd(piece(2 * q + 1), odd);
        }
        sum[j] = even + odd;
    }
}

/// A partial sum's lanes added in a pairwise tree.
#[inline(always)]
fn fold(sum: &Partial) -> f32 {
    let mut p = sum.0;
    let mut width = PARTIAL / 2;
    while width >= 1 {
        for j in 0..width {
            p[j] += p[j + width];
        }
        width /= 2;
    }
    p[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    fn random_mat(rows: usize, cols: usize, seed: u64) -> Mat {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Mat::from_vec(rows, cols, (0..rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect())
    }

    fn close(a: &[f32], b: &[f32]) {
        reference::assert_close(a, b, 1e-4);
    }

    #[test]
    fn mask_density_and_order() {
        let p = SparsePattern::random(200, 300, 0.1, 7);
        let density = p.nnz() as f64 / 60_000.0;
        assert!((density - 0.1).abs() < 0.01, "density {density}");
        let counts: Vec<u32> = p.ptr.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "lines are stored heaviest first");
        assert_eq!(SparsePattern::random(200, 300, 0.1, 7), p, "same seed, same mask");
        assert_ne!(SparsePattern::random(200, 300, 0.1, 8), p);
    }

    #[test]
    fn kernels_match_the_dense_reference() {
        // Token counts around the tile size exercise both the full-tile and the remainder paths; the large
        // case runs on several workers.
        for &(rows, cols, tokens, density) in &[
            (17, 23, 5, 0.3),
            (64, 48, 64, 0.5),
            (130, 70, 150, 0.1),
            (300, 500, 200, 0.2),
            (8, 9, 3, 0.0),
            (90, 80, 70, 0.95),
            (33, 41, 20, 1.0),
        ] {
            let p = SparsePattern::random(rows, cols, density, 3);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let values: Vec<f32> = (0..p.nnz()).map(|_| rng.random_range(-1.0..1.0)).collect();
            let w = p.to_dense(&values);
            let x = random_mat(cols, tokens, 11);
            let dy = random_mat(rows, tokens, 13);

            let y = gather(&p, &values, &x);
            close(&y.data, &reference::matmul(&w, &x).data);

            let (t, perm) = p.transpose();
            let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
            let dx = gather(&t, &tvalues, &dy);
            close(&dx.data, &reference::matmul(&reference::transpose(&w), &dy).data);

            let mut g = vec![0.0; p.nnz()];
            sddmm(&p, &dy, &x, &mut g);
            close(&g, &reference::sddmm(&p, &dy, &x));
            let mut gt = vec![0.0; t.nnz()];
            sddmm(&t, &x, &dy, &mut gt);
            let back: Vec<f32> = {
                let mut v = vec![0.0; p.nnz()];
                for (kt, &k) in perm.iter().enumerate() {
                    v[k as usize] = gt[kt];
                }
                v
            };
            close(&back, &g);

            // The fused backward pass gives, bit for bit, what the gather and the SDDMM give alone.
            let (gt_both, dx_both) = backward(&t, &tvalues, &x, &dy);
            assert_eq!(dx_both.data, dx.data, "{rows}x{cols}: dx");
            assert_eq!(gt_both, gt, "{rows}x{cols}: dw");
        }
    }

    /// Every kernel gives the same values bit for bit whichever layout its operands come in and its output is
    /// asked in, padding and all: the transformer's MLP keeps its hidden layer in tiles, and its loss must not
    /// move. A mask dense enough for the dense path gives rows whatever is asked.
    #[test]
    fn kernels_give_the_same_bits_in_either_layout() {
        for &(rows, cols, tokens, density) in &[
            (40, 30, 128, 0.1),
            (130, 70, 150, 0.1),
            (300, 500, 200, 0.2),
            (20, 10, 7, 0.9),
            (30, 20, 0, 0.1),
            (30, 0, 50, 0.1),
        ] {
            let p = SparsePattern::random(rows, cols, density, 3);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let values: Vec<f32> = (0..p.nnz()).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (x, dy) = (random_mat(cols, tokens, 11), random_mat(rows, tokens, 13));
            let (xt, dyt) = (Tiles::from_rows(&x), Tiles::from_rows(&dy));
            let y = gather(&p, &values, &x);
            for src in [ActsRef::Rows(&x), ActsRef::Tiles(&xt)] {
                assert_eq!(
                    gather_as(&p, &values, src, Layout::Rows),
                    Acts::Rows(y.clone()),
                    "{rows}x{cols}: forward to rows"
                );
                let tiled = gather_as(&p, &values, src, Layout::Tiles);
                match &tiled {
                    Acts::Tiles(t) => {
                        assert_eq!(t, &Tiles::from_rows(&y), "{rows}x{cols}: forward to tiles, zero padding")
                    }
                    Acts::Rows(m) => {
                        assert!((p.runs_dense() || p.full) && m == &y, "only a mask that runs dense writes rows")
                    }
                }
            }
            let (t, perm) = p.transpose();
            let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
            let (dw, dx) = backward(&t, &tvalues, &x, &dy);
            for (xs, dys) in [
                (ActsRef::Tiles(&xt), ActsRef::Rows(&dy)),
                (ActsRef::Rows(&x), ActsRef::Tiles(&dyt)),
                (ActsRef::Tiles(&xt), ActsRef::Tiles(&dyt)),
            ] {
                for layout in [Layout::Rows, Layout::Tiles] {
                    let (dw2, dx2) = backward_as(&t, &tvalues, xs, dys, layout);
                    assert_eq!(dw2, dw, "{rows}x{cols}: dw");
                    let expected = match layout == Layout::Tiles && !t.runs_dense() && !t.full {
                        true => Acts::Tiles(Tiles::from_rows(&dx)),
                        false => Acts::Rows(dx.clone()),
                    };
                    assert_eq!(dx2, expected, "{rows}x{cols}: dx, in the layout asked for, padding and all");
                    let mut g = vec![0.0; t.nnz()];
                    sddmm_as(&t, xs, dys, &mut g);
                    assert_eq!(g, dw, "{rows}x{cols}: sddmm alone");
                }
            }
        }
    }

    /// A kernel called while its thread's buffers are out (as when a rayon worker, waiting at a join inside one
    /// engine's pass, runs another engine's) works in new ones and gives the same result, on the dense path
    /// (density 0.5) and the tiled one (0.1), forward and backward. Were `with_buffer` to hold a `RefCell` borrow
    /// across the call (as the kernels did before), this would panic.
    #[test]
    fn kernels_run_inside_one_another() {
        for density in [0.5, 0.1] {
            let p = SparsePattern::random(64, 48, density, 3);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let values: Vec<f32> = (0..p.nnz()).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (x, dy) = (random_mat(48, 40, 11), random_mat(64, 40, 13));
            let (t, perm) = p.transpose();
            let tvalues: Vec<f32> = perm.iter().map(|&k| values[k as usize]).collect();
            let alone = (gather(&p, &values, &x), backward(&t, &tvalues, &x, &dy));
            let nested = with_buffer(&PACKED, |_| {
                with_buffer(&SCRATCH, |_| (gather(&p, &values, &x), backward(&t, &tvalues, &x, &dy)))
            });
            assert_eq!(nested.0.data, alone.0.data, "density {density}: the forward product");
            assert_eq!((nested.1.0, nested.1.1.data), (alone.1.0, alone.1.1.data), "density {density}: the gradients");
        }
    }

    /// The schedule of a pattern wide enough for 256-line groups visits every non-zero once, each line's in
    /// increasing index order (its sums built as the compressed form lists them, so they keep their bits), one
    /// block at a time, and within a group's block the runs go shortest first.
    #[test]
    fn schedule_visits_every_line_in_order() {
        let p = SparsePattern::random(700, 1100, 0.1, 9);
        let (block, group) = (block_rows(&p), group_lines(&p));
        assert_eq!(group, 256);
        let mut stored = vec![0usize; p.outer];
        for (s, &line) in p.order.iter().enumerate() {
            stored[line as usize] = s;
        }
        let mut seen = vec![false; p.nnz()];
        let mut reordered = false;
        for part in &p.schedule.parts {
            assert_eq!(part.at.len(), part.idx.len());
            assert_eq!(part.runs.last().map_or(0, |&(_, end)| end as usize), part.idx.len(), "the runs cover idx");
            let mut last = vec![None; part.lines.len()];
            let (mut k, mut prev) = (0, None);
            for &(j, end) in &part.runs {
                let (j, end) = (j as usize, end as usize);
                assert!(end > k, "an empty run");
                let s = stored[part.lines[j] as usize];
                let key = (j / group, part.idx[k] as usize / block);
                if let Some((pj, plen, pkey)) = prev {
                    assert!(pkey <= key, "groups, then blocks, in order");
                    if pkey == key {
                        assert!(plen <= end - k, "shortest runs first");
                        reordered |= j < pj;
                    }
                }
                for q in k..end {
                    let at = part.at[q] as usize;
                    assert!((p.ptr[s] as usize..p.ptr[s + 1] as usize).contains(&at), "a non-zero of another line");
                    assert_eq!(part.idx[q], p.idx[at]);
                    assert_eq!(part.idx[q] as usize / block, key.1, "a run stays in one block");
                    assert!(last[j] < Some(at), "line {j}'s non-zeros out of order");
                    last[j] = Some(at);
                    assert!(!std::mem::replace(&mut seen[at], true), "non-zero {at} visited twice");
                }
                prev = Some((j, end - k, key));
                k = end;
            }
        }
        assert!(seen.iter().all(|&v| v), "a non-zero never visited");
        assert!(reordered, "no block reordered its runs: the test misses the sort");
    }

    #[test]
    fn wire_patterns_are_checked() {
        let p = SparsePattern::random(10, 12, 0.3, 1);
        let ok = SparsePattern::from_parts(10, 12, p.order.clone(), p.ptr.clone(), p.idx.clone());
        assert_eq!(ok.as_ref(), Ok(&p));
        let mut bad_idx = p.idx.clone();
        bad_idx[0] = 12;
        assert!(SparsePattern::from_parts(10, 12, p.order.clone(), p.ptr.clone(), bad_idx).is_err());
        let mut dup = p.order.clone();
        dup[1] = dup[0];
        assert!(SparsePattern::from_parts(10, 12, dup, p.ptr.clone(), p.idx.clone()).is_err());
        assert!(SparsePattern::from_parts(10, 12, p.order.clone(), p.ptr[..5].to_vec(), p.idx.clone()).is_err());
        let mut unsorted = p.idx.clone();
        let first_long = (0..10).find(|&s| p.ptr[s + 1] - p.ptr[s] >= 2).expect("a line with two non-zeros");
        unsorted.swap(p.ptr[first_long] as usize, p.ptr[first_long] as usize + 1);
        assert!(SparsePattern::from_parts(10, 12, p.order.clone(), p.ptr.clone(), unsorted).is_err());
    }
}
