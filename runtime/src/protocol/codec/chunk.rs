//! What every codec cuts and reassembles with: the chunk size, the cap on what a header may make a receiver
//! reserve, and the zero-copy conversions between typed buffers and message bytes.

use bytes::Bytes;

use wire::error::{Error, Result};

/// Payload bytes per chunk: just under 1 MiB, leaving room for the header and framing.
pub const CHUNK_BYTES: usize = 1_000_000;

/// Appends the little-endian words in `bytes` to `out`: one copy from the message into the typed buffer the
/// kernels read, with no intermediate byte buffer.
pub(crate) fn extend_words<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8], what: &str) -> Result<()> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(Error::Protocol(format!("{what} holds {} bytes, not a whole number of {size}-byte values", bytes.len())));
    }
    // Each word is written once, straight from the message (whose bytes need not be aligned): no zero-fill
    // of the room first, which doubled the writes of a megabyte chunk.
    out.extend(bytes.chunks_exact(size).map(bytemuck::pod_read_unaligned::<T>));
    Ok(())
}

/// Most values a header may make the assembler reserve room for up front (64 Mi words, 256 MiB), even within
/// the plan's limits (which the meters check first); a longer stream still arrives, growing as it comes.
pub(super) const MAX_RESERVE: u64 = 64 << 20;

/// Value buffers of layers a receiver (or a weight server's disk tier) has finished with, kept for the next layer
/// it assembles (or reads). A fresh buffer of a large layer is a fresh mapping whose every page faults on first
/// touch (for a 64 MiB layer, about as long as the copy into it); a kept one is warm. At most [`Recycled::KEEP`]
/// are kept, so what a receiver holds beyond its layers in flight is a few of the plan's layers.
#[derive(Debug, Default)]
pub struct Recycled {
    buffers: std::sync::Mutex<Vec<Vec<f32>>>,
}

impl Recycled {
    /// Buffers kept at most.
    const KEEP: usize = 4;

    /// An empty buffer with room for at least `capacity` values: the smallest kept one that is large enough,
    /// or a new one.
    pub fn take(&self, capacity: usize) -> Vec<f32> {
        let Ok(mut kept) = self.buffers.lock() else { return Vec::with_capacity(capacity) };
        let fits = kept.iter().enumerate().filter(|(_, b)| b.capacity() >= capacity).min_by_key(|(_, b)| b.capacity());
        match fits.map(|(i, _)| i) {
            Some(i) => kept.swap_remove(i),
            None => Vec::with_capacity(capacity),
        }
    }

    /// Frees every kept buffer: for a holder whose budget has room for them only until its next buffers are
    /// taken.
    pub fn clear(&self) {
        if let Ok(mut kept) = self.buffers.lock() {
            kept.clear();
        }
    }

    /// Keeps `buffer` (emptied) for a later [`Recycled::take`]; when full, the smallest kept one makes room.
    pub fn give(&self, mut buffer: Vec<f32>) {
        if buffer.capacity() == 0 {
            return;
        }
        buffer.clear();
        let Ok(mut kept) = self.buffers.lock() else { return };
        kept.push(buffer);
        if kept.len() > Self::KEEP {
            if let Some(i) = kept.iter().enumerate().min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i) {
                kept.swap_remove(i);
            }
        }
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

