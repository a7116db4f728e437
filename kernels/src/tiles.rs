//! The sparse kernels' layout of an activation: tiles of [`TILE`] tokens, each tile one contiguous lane per
//! feature. The kernels read their sources and build their sums lane by lane; an activation that goes from one
//! sparse layer to the next through element-wise passes only (the MLP's hidden layer: up, GELU, down) stays in
//! this layout, so it is neither copied out to feature rows by the layer that makes it nor packed back into
//! tiles by the layers that read it, forward and backward; the layer norms that sparse layers read are written
//! in it too. Every other activation is a row-major [`Mat`].

use std::borrow::Cow;
use std::mem::MaybeUninit;

use crate::tensor::{Disjoint, Mat};

/// Tokens per tile: one line's sums over a tile fill eight AVX-512 registers, so each non-zero's AXPY is eight
/// independent fused multiply-adds (enough to cover their latency, where four made every AXPY wait on the
/// last), and every non-zero weight is read once per tile, so a wide tile spends little on reading the pattern.
pub const TILE: usize = 128;

/// One feature's [`TILE`] tokens of one tile, aligned to a cache line. `repr(C)`: the kernels and the
/// element-wise passes view a run of lanes as a run of `f32`, which needs the floats at offset 0 and no padding
/// (checked below).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
pub struct Lane(pub [f32; TILE]);

const _: () =
    assert!(std::mem::size_of::<Lane>() == TILE * std::mem::size_of::<f32>() && std::mem::align_of::<Lane>() == 64);

/// Lays the `rows × tokens` row-major `src` out in `out` as tiles (lane after lane, tile after tile, `out` as
/// long as `Tiles::count(tokens) · rows` lanes), zero-padded past the last token.
pub fn pack(src: &[f32], rows: usize, tokens: usize, out: &mut [f32]) {
    assert_eq!(src.len(), rows * tokens, "pack: {rows}x{tokens} from {} floats", src.len());
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and `deal_rows` only writes initialised values.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut MaybeUninit<f32>, out.len()) };
    deal_rows(rows, tokens, out, |r, t0, lane| {
        for (o, &v) in lane.iter_mut().zip(&src[r * tokens + t0..]) {
            o.write(v);
        }
    });
}

/// Fills `out` (`Tiles::count(tokens) · rows` lanes, lane after lane, tile after tile) row by row, rows on all
/// cores when large: `write(r, t0, lane)` writes row `r`'s tokens `t0..t0 + lane.len()`, and the padding past the
/// last token is zeroed here. Each row is produced once, front to back, and dealt out to its lane in every tile:
/// reading every row a lane at a time instead (tile after tile) strides 8 KiB between reads, which the
/// prefetchers do not follow. Packing rows and the layer norm's output both go through here.
pub fn deal_rows(
    rows: usize,
    tokens: usize,
    out: &mut [MaybeUninit<f32>],
    write: impl Fn(usize, usize, &mut [MaybeUninit<f32>]) + Sync,
) {
    use rayon::prelude::*;
    let tiles = Tiles::count(tokens);
    assert_eq!(out.len(), tiles * rows * TILE, "tiles: {rows}x{tokens} into {} floats", out.len());
    let dst = Disjoint(out.as_mut_ptr());
    let fill = |r: usize| {
        for t in 0..tiles {
            let (t0, tl) = (t * TILE, TILE.min(tokens - t * TILE));
            // SAFETY: lane (t, r) is the TILE slots at (t·rows + r)·TILE inside `out` (its length is checked
            // above); every (t, r) pair is written by exactly one call (r's), so calls on different threads never
            // touch the same lane, and `out` is borrowed mutably for all of them.
            let lane = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add((t * rows + r) * TILE), TILE) };
            write(r, t0, &mut lane[..tl]);
            lane[tl..].fill(MaybeUninit::new(0.0));
        }
    };
    if out.len() >= 1 << 16 {
        (0..rows).into_par_iter().with_min_len(8).for_each(fill);
    } else {
        (0..rows).for_each(fill);
    }
}

/// A `rows × tokens` activation as tiles of [`TILE`] tokens: lane `(t, r)` holds tokens `t·TILE..` of feature
/// `r`, and a tile's lanes are contiguous. Tokens past `tokens` in the last tile are padding and hold zeros, so
/// a product over whole lanes (a dot product, an AXPY) is the product over the real tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tiles {
    rows: usize,
    tokens: usize,
    lanes: Vec<Lane>,
}

impl Tiles {
    /// Number of tiles that hold `tokens` tokens.
    pub fn count(tokens: usize) -> usize {
        tokens.div_ceil(TILE)
    }

    /// Tiles whose lanes `fill` writes, every one of them, as a flat slice of `f32` (lane after lane, tile after
    /// tile): an output about to be overwritten is not zeroed first. The padding is cleared after, whatever
    /// `fill` left there.
    ///
    /// # Safety
    /// `fill` must initialise every element of the slice it is given, the padding included.
    pub unsafe fn written_once(rows: usize, tokens: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Self {
        let n = Self::count(tokens) * rows;
        let mut lanes: Vec<Lane> = Vec::with_capacity(n);
        let slots = lanes.spare_capacity_mut();
        // SAFETY: `MaybeUninit<Lane>` has the layout of `Lane`, `TILE` consecutive `f32` with no padding
        // (512 bytes, a multiple of its 64-byte alignment), so the first `n` slots are `n · TILE` slots of `f32`.
        let floats = unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr() as *mut MaybeUninit<f32>, n * TILE) };
        fill(floats);
        // SAFETY: the caller's `fill` initialised all `n · TILE` floats, so the first `n` lanes.
        unsafe { lanes.set_len(n) };
        let mut tiles = Tiles { rows, tokens, lanes };
        tiles.clear_padding();
        tiles
    }

    /// Tiles from lanes a kernel wrote: `lanes` holds `Tiles::count(tokens) · rows` of them with zero padding.
    pub fn from_lanes(rows: usize, tokens: usize, lanes: Vec<Lane>) -> Self {
        assert_eq!(
            lanes.len(),
            Self::count(tokens) * rows,
            "tiles: {} lanes for {rows} rows of {tokens} tokens",
            lanes.len()
        );
        Tiles { rows, tokens, lanes }
    }

    /// The matrix in tiles, on all cores (for a kernel that takes this layout and a caller that has rows).
    pub fn from_rows(m: &Mat) -> Self {
        let (rows, tokens) = (m.rows, m.cols);
        let copy = |r: usize, t0: usize, lane: &mut [MaybeUninit<f32>]| {
            for (o, &v) in lane.iter_mut().zip(&m.row(r)[t0..]) {
                o.write(v);
            }
        };
        // SAFETY: `deal_rows` writes every slot, padding included.
        unsafe { Self::written_once(rows, tokens, |out| deal_rows(rows, tokens, out, copy)) }
    }

    /// The same values as a row-major matrix (for a dense kernel given tiles).
    pub fn to_rows(&self) -> Mat {
        let mut m = Mat::zeros(self.rows, self.tokens);
        if self.tokens > 0 {
            for (r, row) in m.data.chunks_exact_mut(self.tokens).enumerate() {
                for (t, piece) in row.chunks_mut(TILE).enumerate() {
                    piece.copy_from_slice(&self.lanes[t * self.rows + r].0[..piece.len()]);
                }
            }
        }
        m
    }

    /// Number of features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of real tokens (the last tile may hold fewer).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// All lanes, tile after tile.
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// All values, lane after lane (padding included): for element-wise passes, to which the layout is
    /// immaterial.
    pub fn values(&self) -> &[f32] {
        // SAFETY: `Lane` is `TILE` consecutive `f32` with no padding (see `written_once`).
        unsafe { std::slice::from_raw_parts(self.lanes.as_ptr() as *const f32, self.lanes.len() * TILE) }
    }

    /// All values, mutable; a pass that writes non-zeros into the padding must call [`Tiles::clear_padding`].
    pub fn values_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `values`, and the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.lanes.as_mut_ptr() as *mut f32, self.lanes.len() * TILE) }
    }

    /// Zeros the tokens past `tokens` in the last tile: an element-wise pass such as `f(z + b)` turns the
    /// padding's zeros into other values, which a later product over whole lanes would add to real sums.
    pub fn clear_padding(&mut self) {
        let used = self.tokens % TILE;
        if used == 0 || self.rows == 0 {
            return;
        }
        let last = self.lanes.len() - self.rows;
        for lane in &mut self.lanes[last..] {
            lane.0[used..].fill(0.0);
        }
    }

    /// The bytes of the activation on the engine: its real values (the padding is the CPU kernels' artefact,
    /// not something the wafer would hold).
    pub fn bytes(&self) -> u64 {
        (self.rows * self.tokens * std::mem::size_of::<f32>()) as u64
    }
}

/// Which layout a kernel writes its output in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A row-major [`Mat`], a row per feature.
    Rows,
    /// [`Tiles`], when the kernel that makes the output can write them (the sparse ones); a dense kernel
    /// writes rows whatever is asked, as reading tiles back into a GEMM would cost more than it saved.
    Tiles,
}

/// An activation in either layout.
#[derive(Clone, Debug, PartialEq)]
pub enum Acts {
    /// Feature rows.
    Rows(Mat),
    /// The sparse kernels' tiles.
    Tiles(Tiles),
}

impl Default for Acts {
    fn default() -> Self {
        Acts::Rows(Mat::default())
    }
}

impl Acts {
    /// A borrowed view, to hand to a kernel.
    pub fn view(&self) -> ActsRef<'_> {
        match self {
            Acts::Rows(m) => ActsRef::Rows(m),
            Acts::Tiles(t) => ActsRef::Tiles(t),
        }
    }

    /// All values in storage order (padding included), for element-wise passes.
    pub fn values(&self) -> &[f32] {
        match self {
            Acts::Rows(m) => &m.data,
            Acts::Tiles(t) => t.values(),
        }
    }

    /// All values, mutable; after a pass that may write the padding, [`Acts::clear_padding`].
    pub fn values_mut(&mut self) -> &mut [f32] {
        match self {
            Acts::Rows(m) => &mut m.data,
            Acts::Tiles(t) => t.values_mut(),
        }
    }

    /// See [`Tiles::clear_padding`]; rows have none.
    pub fn clear_padding(&mut self) {
        if let Acts::Tiles(t) = self {
            t.clear_padding();
        }
    }

    /// Number of features.
    pub fn rows(&self) -> usize {
        self.view().rows()
    }

    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.view().tokens()
    }

    /// The bytes this activation occupies in engine SRAM.
    pub fn bytes(&self) -> u64 {
        match self {
            Acts::Rows(m) => m.bytes(),
            Acts::Tiles(t) => t.bytes(),
        }
    }

    /// The layout the values are in.
    pub fn layout(&self) -> Layout {
        match self {
            Acts::Rows(_) => Layout::Rows,
            Acts::Tiles(_) => Layout::Tiles,
        }
    }

    /// The same values in `layout` (moved when they are in it already): for an element-wise pass between two
    /// activations whose makers chose differently (a dense kernel writes rows when tiles were asked for).
    pub fn into_layout(self, layout: Layout) -> Acts {
        match (self, layout) {
            (Acts::Tiles(t), Layout::Rows) => Acts::Rows(t.to_rows()),
            (Acts::Rows(m), Layout::Tiles) => Acts::Tiles(Tiles::from_rows(&m)),
            (same, _) => same,
        }
    }

    /// The values as a row-major matrix.
    pub fn into_rows(self) -> Mat {
        match self {
            Acts::Rows(m) => m,
            Acts::Tiles(t) => t.to_rows(),
        }
    }
}

/// A borrowed activation in either layout: what the linear layers read.
#[derive(Clone, Copy, Debug)]
pub enum ActsRef<'a> {
    /// Feature rows.
    Rows(&'a Mat),
    /// The sparse kernels' tiles.
    Tiles(&'a Tiles),
}

impl<'a> From<&'a Mat> for ActsRef<'a> {
    fn from(m: &'a Mat) -> Self {
        ActsRef::Rows(m)
    }
}

impl<'a> ActsRef<'a> {
    /// Number of features.
    pub fn rows(&self) -> usize {
        match self {
            ActsRef::Rows(m) => m.rows,
            ActsRef::Tiles(t) => t.rows,
        }
    }

    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        match self {
            ActsRef::Rows(m) => m.cols,
            ActsRef::Tiles(t) => t.tokens,
        }
    }

    /// Feature `r` over tokens `j0..j0 + w`, which must lie in one tile when the values are in tiles (a pass
    /// over tokens that works a tile's worth at a time reads either layout through this).
    pub fn row_segment(&self, r: usize, j0: usize, w: usize) -> &'a [f32] {
        match *self {
            ActsRef::Rows(m) => &m.row(r)[j0..j0 + w],
            ActsRef::Tiles(t) => {
                assert!(
                    r < t.rows && j0 + w <= t.tokens,
                    "feature {r}, tokens {j0}..{} of a {}x{}",
                    j0 + w,
                    t.rows,
                    t.tokens
                );
                assert!(w == 0 || j0 / TILE == (j0 + w - 1) / TILE, "tokens {j0}..{} cross a tile", j0 + w);
                &t.lanes[j0 / TILE * t.rows + r].0[j0 % TILE..j0 % TILE + w]
            }
        }
    }

    /// The values as rows: borrowed when they are rows, unpacked from tiles otherwise.
    pub fn to_rows(&self) -> Cow<'a, Mat> {
        match *self {
            ActsRef::Rows(m) => Cow::Borrowed(m),
            ActsRef::Tiles(t) => Cow::Owned(t.to_rows()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(rows: usize, cols: usize) -> Mat {
        Mat::from_vec(rows, cols, (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect())
    }

    /// Rows to tiles and back is the identity and the padding is zero, for token counts of none, below, at and
    /// past a tile (a last tile with and without a partial run of sixteen). (That each row's sum over the tiles
    /// is the bias gradient's, bit for bit, is tested beside the bias gradient, in the runtime's `model::linear`.)
    #[test]
    fn tiles_round_trip_and_sum_like_rows() {
        for tokens in [0, 1, 17, TILE, TILE + 5, TILE + 16, 3 * TILE, 2 * TILE + 100] {
            let m = mat(5, tokens);
            let t = Tiles::from_rows(&m);
            assert_eq!(t.lanes().len(), Tiles::count(tokens) * 5);
            assert_eq!(t.to_rows(), m, "{tokens} tokens");
            let used = (tokens + TILE - 1) % TILE + 1;
            assert!(t.lanes().iter().rev().take(5).all(|l| l.0[used..].iter().all(|&v| v == 0.0)), "zero padding");
        }
    }

    /// An element-wise pass that writes the padding is undone by `clear_padding`, and the real values stay.
    #[test]
    fn clear_padding_zeros_only_the_padding() {
        let m = mat(3, TILE + 9);
        let mut t = Tiles::from_rows(&m);
        t.values_mut().iter_mut().for_each(|v| *v += 1.0);
        t.clear_padding();
        let mut plus = m.clone();
        plus.data.iter_mut().for_each(|v| *v += 1.0);
        assert_eq!(t.to_rows(), plus);
        assert_eq!(t, {
            let mut u = Tiles::from_rows(&plus);
            u.clear_padding();
            u
        });
        assert!(t.lanes()[3..].iter().all(|l| l.0[9..].iter().all(|&v| v == 0.0)));
    }
}
