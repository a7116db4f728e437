//! What every codec cuts and reassembles with: the chunk size, the cap on what a header may make a receiver
//! reserve, and the zero-copy conversions between typed buffers and message bytes.

use bytes::Bytes;

use errors::{Error, Result};

/// Payload bytes per chunk: just under 1 MiB, leaving room for the header and framing.
pub const CHUNK_BYTES: usize = 1_000_000;

/// Appends the little-endian words in `bytes` to `out`: one copy from the message into the typed buffer the
/// kernels read, with no intermediate byte buffer.
pub(crate) fn extend_words<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8], what: &str) -> Result<()> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(Error::Protocol(format!(
            "{what} holds {} bytes, not a whole number of {size}-byte values",
            bytes.len()
        )));
    }
    // Each word is written once, straight from the message (whose bytes need not be aligned): no zero-fill
    // of the room first, which doubled the writes of a megabyte chunk. A layer-sized buffer is written around
    // the cache.
    super::uncached::extend(out, bytes);
    Ok(())
}

/// Most values a header may make the assembler reserve room for up front (64 Mi words, 256 MiB), even within
/// the plan's limits (which the meters check first); a longer stream still arrives, growing as it comes.
pub(super) const MAX_RESERVE: u64 = 64 << 20;

/// Value buffers of layers a receiver (or a weight server's disk tier) has finished with, kept for the next layer
/// it assembles (or reads). A fresh buffer of a large layer is a fresh mapping whose every page faults on first
/// touch (for a 64 MiB layer, about as long as the copy into it); a kept one is warm. At most [`Recycled::KEEP`]
/// are kept, so what a receiver holds beyond its layers in flight is a few of the plan's layers (a MemoryX
/// process keeps more: [`Recycled::keep_up_to`], [`Recycled::keep_within_peak`]).
#[derive(Debug)]
pub struct Recycled {
    pool: std::sync::Mutex<Pool>,
    /// Buffers of fewer values are not kept: they come from the allocator's heap, already mapped.
    least: usize,
}

/// What a [`Recycled`] keeps, and the values of its size lent out.
#[derive(Debug)]
struct Pool {
    kept: Vec<Vec<f32>>,
    keep: Keep,
    /// Values of the buffers taken from the pool (or made by it) and not given back yet.
    out: usize,
    /// The most `out` has been: what the holder had in use at once.
    peak: usize,
    /// Buffers the pool could not lend from those kept, so its caller made them new.
    misses: usize,
}

/// How many buffers a [`Recycled`] keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Keep {
    /// At most this many.
    Count(usize),
    /// As many as fit beside those lent out within the most ever lent out at once
    /// ([`Recycled::keep_within_peak`]).
    WithinPeak,
}

impl Pool {
    fn kept_values(&self) -> usize {
        self.kept.iter().map(Vec::capacity).sum()
    }
}

impl Default for Recycled {
    fn default() -> Self {
        Recycled::keeping_from(0)
    }
}

impl Recycled {
    /// Buffers kept at most.
    const KEEP: usize = 4;

    /// Values from which a layer-sized pool keeps a buffer ([`Recycled::layer_sized`]): a smaller one comes from
    /// the allocator's heap, already mapped (a weight server maps only buffers of a huge page or more fresh:
    /// `process::tighten_allocator`), and would only take the place of a large one among the few kept, or be
    /// handed a large one for a bias.
    pub(crate) const LAYER_SIZED: usize = crate::process::HugePages::PAGE / 4;

    /// A pool of its holder's own for buffers of [`Recycled::LAYER_SIZED`] values or more (a weight server's
    /// disk tier); smaller ones are left to the heap.
    pub fn layer_sized() -> Self {
        Recycled::keeping_from(Self::LAYER_SIZED)
    }

    /// A pool that keeps buffers of at least `least` values.
    const fn keeping_from(least: usize) -> Self {
        let pool = Pool { kept: Vec::new(), keep: Keep::Count(Self::KEEP), out: 0, peak: 0, misses: 0 };
        Recycled { pool: std::sync::Mutex::new(pool), least }
    }

    /// Keeps buffers only within the most this pool has had lent out at once: for a process under a memory
    /// budget, whose allowance has room for the layers in transit but not for buffers kept beside them. What it
    /// keeps and what it counts as out never add up to more than that peak, so keeping does not raise the
    /// process's peak by more than the buffers it cannot count (given back without having been lent: those it
    /// does not keep when they are larger than all it counts out); a buffer too small for what is asked makes
    /// room for the fresh one by being freed. The 1 B example's coordinator (4 servers, a quarter in memory)
    /// peaked at 1.15 GiB keeping a fixed count of its gathered layers and gradients, against 0.95 GiB of budget
    /// plus allowance; mapping them all fresh instead, a 3 B-shaped run's coordinator spent a twelfth of the
    /// machine zeroing fresh pages.
    pub fn keep_within_peak(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.keep = Keep::WithinPeak;
            let room = pool.peak.saturating_sub(pool.out);
            Self::trim_while(&mut pool, |p| p.kept_values() > room);
        }
    }

    /// Keeps up to `buffers` (never fewer than [`Recycled::KEEP`]): for a MemoryX process without a memory
    /// budget, which holds a step's staged gradients until each is applied (its layer's fetch for the next
    /// step's forward pass) and then receives the next step's.
    /// Keeping only a few, it mapped every other gradient fresh each step: a streamed ~100M GPT's coordinator
    /// spent over a quarter of its CPU zeroing those pages. What it keeps between steps is what it held at the
    /// step's peak, so its peak does not grow.
    pub fn keep_up_to(&self, buffers: usize) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.keep = Keep::Count(buffers.max(Self::KEEP));
        }
    }

    /// The pool of MemoryX's processes, for the buffers that carry a layer through them: the layers the
    /// coordinator gathers and sends down the tree, the gradients it receives and cuts into slices, the slices a
    /// weight server sends and receives and the gradients it stages. Those buffers are made in one place and
    /// freed in another (a chunk that went out on the wire, a gradient the optimizer has applied), so one pool
    /// per process serves them all. A weight server maps every buffer of a huge page or more fresh
    /// (`process::tighten_allocator`), and those are what it keeps; the 1 B example's MemoryX spent ~30% of its
    /// CPU zeroing such fresh pages. It keeps [`Recycled::KEEP`] of them, and in a process under a memory budget
    /// only what fits its peak ([`Recycled::keep_within_peak`]).
    pub fn layers() -> &'static Recycled {
        static LAYERS: Recycled = Recycled::keeping_from(Recycled::LAYER_SIZED);
        &LAYERS
    }

    /// An empty buffer with room for at least `capacity` values: the smallest kept one that is large enough,
    /// or a new one.
    pub fn take(&self, capacity: usize) -> Vec<f32> {
        self.kept(capacity).unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// `len` zeros, in a kept buffer, or else a new one from `calloc`. A new one's pages are the kernel's zero
    /// page until written, so a buffer filled part by part (a layer gathered from its servers) becomes resident
    /// as it is filled, not all at once: zero-filling a fresh one raised the 1 B example's coordinator's peak by
    /// most of a layer.
    pub fn zeroed(&self, len: usize) -> Vec<f32> {
        match self.kept(len) {
            Some(mut v) => {
                v.resize(len, 0.0);
                v
            }
            None => vec![0.0; len],
        }
    }

    /// The smallest kept buffer with room for `capacity` values, taken out of the pool; `None` when the caller
    /// is to make a new one, which is then counted as lent out (room for it made first under
    /// [`Keep::WithinPeak`]).
    fn kept(&self, capacity: usize) -> Option<Vec<f32>> {
        if capacity < self.least {
            return None;
        }
        let mut pool = self.pool.lock().ok()?;
        let fits =
            pool.kept.iter().enumerate().filter(|(_, b)| b.capacity() >= capacity).min_by_key(|(_, b)| b.capacity());
        match fits.map(|(i, _)| i) {
            Some(i) => {
                let buffer = pool.kept.swap_remove(i);
                pool.out += buffer.capacity();
                Some(buffer)
            }
            None => {
                pool.misses += 1;
                pool.out += capacity;
                pool.peak = pool.peak.max(pool.out);
                if pool.keep == Keep::WithinPeak {
                    let room = pool.peak - pool.out;
                    Self::trim_while(&mut pool, |p| p.kept_values() > room);
                }
                None
            }
        }
    }

    /// How many buffers of its size the pool could not lend from those it kept: each one a fresh mapping.
    #[cfg(test)]
    pub(crate) fn misses(&self) -> usize {
        self.pool.lock().map(|p| p.misses).unwrap_or(0)
    }

    /// Values kept and lent out now, and the most ever lent out at once.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        self.pool.lock().map(|p| (p.kept_values() + p.out, p.peak)).unwrap_or((0, 0))
    }

    /// Frees the smallest kept buffers while `over` says the pool keeps too much.
    fn trim_while(pool: &mut Pool, over: impl Fn(&Pool) -> bool) {
        while over(pool) {
            let Some(i) = pool.kept.iter().enumerate().min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i) else { break };
            pool.kept.swap_remove(i);
        }
    }

    /// A copy of `values` in a buffer from this pool.
    pub fn copy_of(&self, values: &[f32]) -> Vec<f32> {
        let mut out = self.take(values.len());
        out.extend_from_slice(values);
        out
    }

    /// `values` as message bytes without a copy, the buffer given back to this pool when the last chunk holding
    /// any of it is dropped (sent).
    pub fn bytes(&'static self, values: Vec<f32>) -> Bytes {
        Bytes::from_owner(Pooled { values, home: self })
    }

    /// Frees the smallest kept buffers until at most `buffers` are left, once (unlike [`Recycled::keep_up_to`],
    /// which sets how many it keeps from then on): for a holder whose budget has room for them only until its
    /// next buffers are taken.
    pub fn free_all_but(&self, buffers: usize) {
        if let Ok(mut pool) = self.pool.lock() {
            Self::trim_while(&mut pool, |p| p.kept.len() > buffers);
        }
    }

    /// Keeps `buffer` (emptied) for a later [`Recycled::take`]; when full, the smallest kept ones make room
    /// (under [`Keep::WithinPeak`], it is kept only if it fits beside those kept and lent out).
    pub fn give(&self, mut buffer: Vec<f32>) {
        if buffer.capacity() == 0 || buffer.capacity() < self.least {
            return;
        }
        buffer.clear();
        let Ok(mut pool) = self.pool.lock() else { return };
        // A buffer larger than all that is counted out was not lent by this pool (a clone sent on, a buffer made
        // elsewhere): under a peak it is not kept.
        let lent = pool.out >= buffer.capacity();
        pool.out = pool.out.saturating_sub(buffer.capacity());
        match pool.keep {
            Keep::Count(keep) => {
                pool.kept.push(buffer);
                Self::trim_while(&mut pool, |p| p.kept.len() > keep);
            }
            Keep::WithinPeak => {
                if lent && pool.kept_values() + pool.out + buffer.capacity() <= pool.peak {
                    pool.kept.push(buffer);
                }
            }
        }
    }
}

/// Values lent to message bytes by [`Recycled::bytes`], going back to their pool when dropped.
struct Pooled {
    values: Vec<f32>,
    home: &'static Recycled,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values)
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.home.give(std::mem::take(&mut self.values));
    }
}

/// Little-endian words owned by a [`Bytes`] without copying them: the platform is little-endian (checked at
/// compile time below), so a `Vec<f32>` already is its wire form.
pub(crate) struct Words(pub(crate) Vec<f32>);

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("the wire format sends words in the machine's order, which must be little-endian");

/// Pieces of at most [`CHUNK_BYTES`] of `data`, sharing its buffer.
pub(crate) fn pieces(data: Bytes) -> impl Iterator<Item = Bytes> {
    (0..data.len()).step_by(CHUNK_BYTES).map(move |at| data.slice(at..(at + CHUNK_BYTES).min(data.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(pool: &Recycled) -> usize {
        pool.pool.lock().map(|p| p.kept.len()).unwrap_or(usize::MAX)
    }

    /// A buffer lent to message bytes comes back to its pool when the last piece cut from it is dropped, not
    /// before, and the next buffer taken is that one; a copy from the pool holds the values copied.
    #[test]
    fn lent_bytes_go_back_to_their_pool_with_their_last_piece() {
        static POOL: Recycled = Recycled::keeping_from(1_000);
        let values: Vec<f32> = (0..600_000).map(|k| k as f32).collect();
        let at = values.as_ptr();
        let mut cut: Vec<Bytes> = pieces(POOL.bytes(values)).collect();
        assert_eq!(cut.len(), 3, "2.4 MB in pieces of at most 1 MB");
        assert_eq!(
            bytemuck::pod_read_unaligned::<f32>(&cut[1][..4]),
            (CHUNK_BYTES / 4) as f32,
            "the pieces are the values"
        );
        let last = cut.pop();
        drop(cut);
        assert_eq!(kept(&POOL), 0, "a piece is still held");
        drop(last);
        assert_eq!(kept(&POOL), 1, "back once every piece is gone");
        let again = POOL.take(500_000);
        assert!(again.is_empty() && again.as_ptr() == at, "the same buffer, emptied");
        POOL.give(again);
        let copy = POOL.copy_of(&[1.5; 2_000]);
        assert!(copy.as_ptr() == at && copy == vec![1.5; 2_000], "a copy into the kept buffer");
    }

    /// A pool keeps no buffer below its least size (the heap serves those warm), and at most `KEEP` (or as many
    /// as it is asked to keep), the smallest making room.
    #[test]
    fn a_pool_keeps_few_and_only_large_buffers() {
        let pool = Recycled::keeping_from(1_000);
        pool.give(vec![0.0; 999]);
        assert_eq!(kept(&pool), 0, "below the least size");
        for n in 1..=Recycled::KEEP + 2 {
            pool.give(Vec::with_capacity(1_000 * n));
        }
        assert_eq!(kept(&pool), Recycled::KEEP);
        assert!(pool.take(1_000).capacity() >= 3_000, "the smallest were dropped");
        pool.keep_up_to(Recycled::KEEP + 2);
        for n in 1..=4 {
            pool.give(Vec::with_capacity(10_000 * n));
        }
        assert_eq!(kept(&pool), Recycled::KEEP + 2, "as many as asked, the smallest making room beyond");
        pool.keep_up_to(1);
        pool.give(Vec::with_capacity(50_000));
        assert_eq!(kept(&pool), Recycled::KEEP, "never fewer than KEEP");
    }

    /// Under a budget a pool keeps buffers only within the most it ever had lent out at once: a buffer given
    /// back is kept while it and those out fit that peak, is handed out again, and one too small for what is
    /// asked is freed to make room for the fresh one, so what is kept and out never passes the peak.
    #[test]
    fn a_pool_within_its_peak_never_holds_more_than_was_once_in_use() {
        let pool = Recycled::keeping_from(1_000);
        pool.keep_within_peak();
        let held = Recycled::held;
        // Two layers in use at once, then given back: both kept (they are the peak).
        let (a, b) = (pool.take(4_000), pool.take(3_000));
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        pool.give(a);
        pool.give(b);
        assert_eq!(kept(&pool), 2);
        assert_eq!(held(&pool), (7_000, 7_000));
        // Reused, the smallest that fits: no new buffer.
        let c = pool.take(2_500);
        assert_eq!(c.as_ptr(), pb, "the 3,000 one");
        let d = pool.zeroed(3_500);
        assert!(d.as_ptr() == pa && d.len() == 3_500 && d.iter().all(|&x| x == 0.0), "the 4,000 one, zeroed");
        pool.give(c);
        pool.give(d);
        // Asked for more than any kept holds: the kept are freed to make room, and the peak is what is out.
        let e = pool.take(6_000);
        assert_eq!(kept(&pool), 0, "both freed: 6,000 out beside either kept one would pass the peak of 7,000");
        assert_eq!(held(&pool), (6_000, 7_000));
        let f = pool.take(5_000);
        assert_eq!(held(&pool), (11_000, 11_000), "both out: the peak grew by what is out, nothing kept");
        pool.give(e);
        pool.give(f);
        assert_eq!(held(&pool), (11_000, 11_000), "both kept within the peak");
        // A buffer made elsewhere and given back beyond the room is not kept.
        pool.give(Vec::with_capacity(2_000));
        assert_eq!(held(&pool), (11_000, 11_000));
        // A count-limited pool that is told to keep within its peak frees what is beyond it.
        let counted = Recycled::keeping_from(1_000);
        counted.give(Vec::with_capacity(5_000));
        assert_eq!(kept(&counted), 1);
        counted.keep_within_peak();
        assert_eq!(kept(&counted), 0, "nothing was ever lent out, so nothing fits");
    }
}
