//! Appending a message's words to a buffer larger than a core's cache with stores that go around the cache.
//!
//! A streamed layer is copied once, from the message into the buffer the kernels read (`chunk::extend_words`).
//! For a layer of megabytes that buffer was last touched a layer or more ago: each line an ordinary store
//! writes is first read from memory, and the copy runs at memory's speed for two passes, not one. The ~100M
//! GPT's engine spent 1.5% of its core there (1,024 × 4,096 layers of 16 MiB). Non-temporal stores write whole
//! lines without reading them: the same copy of 16 MiB layers ran at 19 GB/s (AVX-512) and 15–17 GB/s (SSE2)
//! against 9 GB/s, and reading the layer afterwards, as the kernels do, ran 2–10% slower (the copy no longer
//! leaves its lines in a cache too small to keep them until then). A buffer that fits the cache keeps ordinary
//! stores, which leave it there for the kernels.

use std::mem::MaybeUninit;

/// Buffers of at least this many bytes are filled with non-temporal stores: twice a current server core's L2
/// (2 MiB on this project's machines), so its beginning has left that cache by the time its end is written.
pub(crate) const MIN_BUFFER: usize = 4 << 20;

/// Copies shorter than this go through ordinary stores: aligning the destination and fencing after the stores
/// cost more than a short copy saves.
const MIN_COPY: usize = 4096;

/// Appends the little-endian words of `bytes` (whole words only: a trailing partial word is left) to `out`.
/// Writes around the cache when `out` holds [`MIN_BUFFER`] bytes or more and the copy is long enough to gain;
/// otherwise through it, word by word, as the reference does (`reference`). Either way the words are the same.
pub(super) fn extend<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8]) {
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    let bytes = &bytes[..n * size];
    let large = out.capacity().max(out.len() + n).saturating_mul(size) >= MIN_BUFFER;
    if !(cfg!(target_endian = "little") && size > 0 && large && bytes.len() >= MIN_COPY) {
        reference(out, bytes);
        return;
    }
    out.reserve(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    // SAFETY: `spare` is `n` values of `T`, `n · size` bytes of writable memory that nothing else refers to; as
    // bytes they are `MaybeUninit<u8>`, which has no validity requirement.
    let dst = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), n * size) };
    copy(dst, bytes);
    // SAFETY: `copy` wrote all `n · size` bytes of the first `n` spare values; `T` is `Pod`, so any bytes are a
    // valid `T`, and on a little-endian target a word's bytes in memory are its little-endian encoding.
    unsafe { out.set_len(out.len() + n) };
}

/// What [`extend`] does, word by word through ordinary stores: the reference it is tested against, and its path
/// for small buffers and short copies.
fn reference<T: bytemuck::Pod>(out: &mut Vec<T>, bytes: &[u8]) {
    out.extend(bytes.chunks_exact(std::mem::size_of::<T>()).map(bytemuck::pod_read_unaligned::<T>));
}

/// Copies `src` into `dst` (of the same length), the body of the copy with non-temporal stores where the CPU
/// has them, and fences them so that whatever the caller hands the buffer to sees every byte.
fn copy(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    let len = dst.len().min(src.len());
    let (d, s) = (dst.as_mut_ptr().cast::<u8>(), src.as_ptr());
    #[cfg(target_arch = "x86_64")]
    {
        // The destination's first 64-byte boundary: the stores below need aligned addresses.
        let head = d.align_offset(64).min(len);
        let body = (len - head) / 64 * 64;
        // SAFETY: `d` and `s` are valid for `len` bytes each and do not overlap (one is borrowed mutably, the
        // other shared); `head + body ≤ len`, and `d + head` is 64-byte aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(s, d, head);
            stream(d.add(head), s.add(head), body);
            std::ptr::copy_nonoverlapping(s.add(head + body), d.add(head + body), len - head - body);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: `d` and `s` are valid for `len` bytes each and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s, d, len)
    };
}

/// Copies `len` bytes (a multiple of 64) from `s` to the 64-byte aligned `d` with non-temporal stores, 64 bytes
/// at a time with AVX-512 where the CPU has it, 16 with SSE2 (every x86-64) otherwise; then `sfence`, which
/// orders those stores before any later store (a lock released or a channel sent) that publishes the buffer.
///
/// # Safety
/// `s` is valid for reads and `d` for writes of `len` bytes, they do not overlap, and `d` is 64-byte aligned.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(d: *mut u8, s: *const u8, len: usize) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the caller's contract, and the CPU has AVX-512F.
        unsafe { stream_avx512(d, s, len) };
    } else {
        // SAFETY: the caller's contract.
        unsafe { stream_sse2(d, s, len) };
    }
    // SAFETY: `sfence` has no memory operands; SSE is part of x86-64.
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// [`stream`]'s loop on every x86-64 (SSE2), 16 bytes a store.
///
/// # Safety
/// [`stream`]'s.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_sse2(d: *mut u8, s: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    for i in (0..len).step_by(16) {
        // SAFETY: the caller's contract; `d + i` is 16-byte aligned.
        unsafe { _mm_stream_si128(d.add(i).cast::<__m128i>(), _mm_loadu_si128(s.add(i).cast::<__m128i>())) };
    }
}

/// [`stream`]'s AVX-512 loop.
///
/// # Safety
/// [`stream`]'s, and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_avx512(d: *mut u8, s: *const u8, len: usize) {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_stream_ps};
    for i in (0..len).step_by(64) {
        // SAFETY: the caller's contract; `d + i` is 64-byte aligned. The loads and stores move bits unchanged.
        unsafe { _mm512_stream_ps(d.add(i).cast::<f32>(), _mm512_loadu_ps(s.add(i).cast::<f32>())) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes no two positions of which hold the same pattern for long, with some NaN payloads among them.
    fn message(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ if i % 97 == 0 { 0xff } else { 0 }).collect()
    }

    #[test]
    fn large_buffers_get_the_references_words_at_every_alignment_and_length() {
        let msg = message(MIN_COPY * 3 + 300);
        for offset in [0, 1, 3, 4, 17, 64] {
            for len in [MIN_COPY - 4, MIN_COPY, MIN_COPY + 4, MIN_COPY + 60, MIN_COPY * 3 + 3] {
                let bytes = &msg[offset..offset + len];
                for start in [0usize, 1, 5, 16] {
                    let mut fast: Vec<f32> = Vec::with_capacity(MIN_BUFFER / 4 + 64);
                    let mut slow: Vec<f32> = Vec::with_capacity(MIN_BUFFER / 4 + 64);
                    for v in [&mut fast, &mut slow] {
                        v.extend((0..start).map(|i| i as f32));
                    }
                    extend(&mut fast, bytes);
                    reference(&mut slow, bytes);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&fast), bits(&slow), "offset {offset}, length {len}, start {start}");
                    assert_eq!(fast.len(), start + len / 4);
                }
            }
        }
    }

    #[test]
    fn a_buffer_grows_through_the_fast_path_and_keeps_every_word() {
        let msg = message(1 << 20);
        let (mut fast, mut slow) = (Vec::<u32>::new(), Vec::<u32>::new());
        for _ in 0..5 {
            extend(&mut fast, &msg[3..]);
            reference(&mut slow, &msg[3..]);
        }
        assert!(fast.capacity() * 4 >= MIN_BUFFER, "the last appends took the fast path");
        assert_eq!(fast, slow);
    }

    /// One of [`stream`]'s loops.
    #[cfg(target_arch = "x86_64")]
    type StoreLoop = unsafe fn(*mut u8, *const u8, usize);

    /// Both loops, whichever this CPU would take: CI's machines need not have AVX-512.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_store_loops_copy_every_byte() {
        let src = message(64 * 50 + 7);
        let loops: [(&str, StoreLoop); 2] = [("SSE2", stream_sse2), ("AVX-512", stream_avx512)];
        for (name, run) in loops {
            if name == "AVX-512" && !std::arch::is_x86_feature_detected!("avx512f") {
                continue;
            }
            for offset in [0, 1, 7] {
                let mut dst = vec![0u8; 64 * 52];
                let head = dst.as_ptr().align_offset(64);
                let len = 64 * 50;
                // SAFETY: `dst` holds `head + len` bytes from an aligned start, `src` `offset + len`; the CPU has
                // the loop's instructions (checked above); one is a fresh vector, the other shared.
                unsafe {
                    run(dst.as_mut_ptr().add(head), src.as_ptr().add(offset), len);
                    std::arch::x86_64::_mm_sfence();
                }
                assert_eq!(&dst[head..head + len], &src[offset..offset + len], "{name}, offset {offset}");
                assert!(dst[..head].iter().chain(&dst[head + len..]).all(|&b| b == 0), "{name} wrote outside");
            }
        }
    }

    #[test]
    fn small_buffers_and_short_copies_match_too() {
        let msg = message(5000);
        for len in [0, 1, 3, 4, 7, 100, 4999] {
            let (mut fast, mut slow) = (Vec::<u32>::new(), Vec::<u32>::new());
            extend(&mut fast, &msg[..len]);
            reference(&mut slow, &msg[..len]);
            assert_eq!(fast, slow, "length {len}");
        }
    }
}
