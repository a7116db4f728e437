//! What every codec cuts and reassembles with: the chunk size, the cap on what a header may make a receiver
//! reserve, and the zero-copy conversions between typed buffers and message bytes.

use bytes::Bytes;

use wire::error::{Error, Result};

/// Payload bytes per chunk: just under 1 MiB, leaving room for the header and framing.
pub const CHUNK_BYTES: usize = 1_000_000;

/// Appends the little-endian words in `bytes` to `out`: one copy from the message into the typed buffer the
/// kernels read, with no intermediate byte buffer.
pub(super) fn extend_words<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8], what: &str) -> Result<()> {
    if bytes.len() % 4 != 0 {
        return Err(Error::Protocol(format!("{what} holds {} bytes, not a whole number of 4-byte values", bytes.len())));
    }
    let start = out.len();
    out.resize(start + bytes.len() / 4, T::zeroed());
    bytemuck::cast_slice_mut::<T, u8>(&mut out[start..]).copy_from_slice(bytes);
    Ok(())
}

/// Most values a header may make the assembler reserve room for up front (64 Mi words, 256 MiB), even within
/// the plan's limits (which the meters check first); a longer stream still arrives, growing as it comes.
pub(super) const MAX_RESERVE: u64 = 64 << 20;

/// Little-endian words owned by a [`Bytes`] without copying them: the platform is little-endian (checked at
/// compile time below), so a `Vec<f32>` already is its wire form.
pub(super) struct Words(pub(super) Vec<f32>);

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("the wire format sends words in the machine's order, which must be little-endian");

/// Pieces of at most [`CHUNK_BYTES`] of `data`, sharing its buffer.
pub(super) fn pieces(data: Bytes) -> impl Iterator<Item = Bytes> {
    (0..data.len()).step_by(CHUNK_BYTES).map(move |at| data.slice(at..(at + CHUNK_BYTES).min(data.len())))
}

