//! The engine's tensor type: a row-major matrix. Activations are stored feature-major (a row per feature, a
//! column per token/sample), as the seeds lay them over the wafer, so that every AXPY of the sparse kernels runs
//! over one contiguous stretch of tokens. (The sparse kernels' own tiled layout, which an activation between two
//! sparse layers keeps, is [`crate::tiles`].)

use std::mem::MaybeUninit;

/// Values per task of an element-wise pass over an activation: large enough that a task pays for itself.
pub const PIECE: usize = 1 << 15;

/// Rows of `cols` values per task of an element-wise pass that needs to know each value's row (a per-row
/// bias): whole rows, about [`PIECE`] values.
pub fn rows_per_piece(cols: usize) -> usize {
    (PIECE / cols.max(1)).max(1)
}

/// Tokens per task of a per-token statistic (layer norm, the softmax loss): each task sums its own tokens over
/// every row, so the order of every sum, and the result bit for bit, does not depend on the split.
pub const TOKENS_PER_TASK: usize = 256;

/// A new vector of `len` values written once, piece by piece, on all cores: `write(start, piece)` fills the
/// values `start..start + piece.len()` (every piece is `piece` long but the last). An output that is about to
/// be overwritten is not zeroed first: at a transformer's widths that zeroing was one more pass over every
/// activation.
///
/// # Safety
/// `write` must initialise every element of each piece it is given.
pub unsafe fn written_once(
    len: usize,
    piece: usize,
    write: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    use rayon::prelude::*;
    let piece = piece.max(1);
    let mut v = Vec::with_capacity(len);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(piece)
        .with_min_len(PIECE.div_ceil(piece))
        .enumerate()
        .for_each(|(i, slots)| write(i * piece, slots));
    // SAFETY: the pieces cover the first `len` slots and the caller's `write` initialised every one.
    unsafe { v.set_len(len) };
    v
}

/// [`written_once`] for a pass that also rewrites an existing slice of the same length in place: each piece of
/// the new vector comes with the matching piece of `beside` and where both start.
///
/// # Safety
/// As [`written_once`]: `write` must initialise every element of each piece of the new vector.
pub unsafe fn written_once_beside(
    beside: &mut [f32],
    piece: usize,
    write: impl Fn(usize, &mut [MaybeUninit<f32>], &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let len = beside.len();
    let mut v = Vec::with_capacity(len);
    fill_beside(&mut v.spare_capacity_mut()[..len], beside, piece, write);
    // SAFETY: `fill_beside` gave `write` every slot of the first `len`, and the caller's `write` initialised
    // every one.
    unsafe { v.set_len(len) };
    v
}

/// The pass of [`written_once_beside`] over an output the caller allocated (`out`, as long as `beside`): piece
/// by piece on all cores, each piece of `out` with the matching piece of `beside` and where both start.
pub fn fill_beside(
    out: &mut [MaybeUninit<f32>],
    beside: &mut [f32],
    piece: usize,
    write: impl Fn(usize, &mut [MaybeUninit<f32>], &mut [f32]) + Sync + Send,
) {
    use rayon::prelude::*;
    assert_eq!(out.len(), beside.len(), "fill_beside: the output and the slice beside it differ in length");
    let piece = piece.max(1);
    out.par_chunks_mut(piece)
        .zip(beside.par_chunks_mut(piece))
        .with_min_len(PIECE.div_ceil(piece))
        .enumerate()
        .for_each(|(i, (slots, beside))| write(i * piece, slots, beside));
}

/// A pointer through which workers write disjoint parts of one buffer: the sparse kernels' parts (each its own
/// lines), and the writing of rows into tiles (`tiles::deal_rows`: each row its own lanes).
pub(crate) struct Disjoint<T>(pub(crate) *mut T);
// SAFETY: shared only between workers that write provably disjoint ranges (see the users), of values that may
// be sent between threads.
unsafe impl<T: Send> Send for Disjoint<T> {}
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Clone for Disjoint<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// The pointer, through a method so closures capture the whole (`Sync`) wrapper rather than its field.
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }
}

/// Activation buffers a pass has finished with, kept for the next pass that needs one at most as long: the
/// outputs that go through `&mut [f32]` kernels (attention's) must start as initialised values, and zeroing
/// fresh ones was a pass over 12 MiB per block and step. Host memory only, like the allocator's own free lists:
/// what the simulated engine holds is counted where the activations live, not here.
#[derive(Debug, Default)]
pub struct Spare {
    buffers: Vec<Vec<f32>>,
}

impl Spare {
    /// At most this many buffers are kept; more are freed.
    const KEEP: usize = 64;

    /// A vector of `len` values whose contents are unspecified (zeros, or what a finished pass left): only for
    /// an output every value of which its writer sets. The smallest kept buffer at least as long serves,
    /// shortened.
    pub fn take(&mut self, len: usize) -> Vec<f32> {
        let fits = self.buffers.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len());
        match fits.map(|(i, _)| i) {
            Some(i) => {
                let mut buffer = self.buffers.swap_remove(i);
                buffer.truncate(len);
                buffer
            }
            None => vec![0.0; len],
        }
    }

    /// Keeps `buffer` for a later [`Spare::take`]; when full, the shortest kept buffer makes room (a shape
    /// that changed leaves nothing behind for long).
    pub fn give(&mut self, buffer: Vec<f32>) {
        if buffer.is_empty() {
            return;
        }
        let shortest = self.buffers.iter().enumerate().min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
        if let Some(i) = shortest.filter(|_| self.buffers.len() >= Self::KEEP) {
            self.buffers.swap_remove(i);
        }
        self.buffers.push(buffer);
    }
}

/// A dense row-major `rows × cols` matrix of `f32`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Mat {
    /// Number of rows (features, for activations).
    pub rows: usize,
    /// Number of columns (tokens or samples, for activations).
    pub cols: usize,
    /// `rows * cols` values, row after row.
    pub data: Vec<f32>,
}

impl Mat {
    /// A matrix of zeros, the starting point of every accumulation.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// Wraps existing values; the length must match the shape, which callers guarantee by construction.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "Mat::from_vec: {rows}x{cols} needs {} values", rows * cols);
        Mat { rows, cols, data }
    }

    /// Row `r` as a slice: one feature across all tokens.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The bytes this matrix occupies in engine SRAM.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * std::mem::size_of::<f32>()) as u64
    }

    /// A view of the whole matrix for the GEMM wrapper.
    pub fn view(&self) -> crate::dense::MatView<'_> {
        crate::dense::MatView::new(&self.data, self.rows, self.cols)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A taken buffer has the length asked for, reuses the shortest kept one that is long enough, and a full
    /// pool makes room by dropping its shortest.
    #[test]
    fn spare_buffers_are_reused_and_bounded() {
        let mut spare = Spare::default();
        for len in [10, 30, 20] {
            spare.give(vec![1.0; len]);
        }
        let b = spare.take(15);
        assert_eq!((b.len(), b.capacity() >= 20), (15, true), "the 20-long buffer, shortened");
        assert_eq!(spare.take(40), vec![0.0; 40], "nothing long enough: a new zeroed buffer");
        assert_eq!(spare.take(0).len(), 0);
        spare.buffers.clear();
        for len in 1..=Spare::KEEP + 5 {
            spare.give(vec![0.5; len]);
        }
        assert_eq!(spare.buffers.len(), Spare::KEEP);
        assert!(spare.buffers.iter().all(|b| b.len() > 5), "the shortest went first");
    }
}
