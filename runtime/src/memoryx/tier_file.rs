//! One file of a disk tier. A layer file is read with direct I/O (`O_DIRECT`) where it can be: the aligned bulk
//! of each tensor goes straight from the disk into its buffer, and the page cache does not copy it on the way.
//! Writes go through the page cache, which takes them off the stream's path (a direct write waits for the disk:
//! writing each layer back and reading its staged gradient direct made a tiered step 2.5% slower and the 1 B
//! example 9%), and start their write-back at once, so that when the layer is next read the kernel has little to
//! flush; after that read the layer's pages are dropped from the cache, which would otherwise hold a second copy
//! of every layer in memory (counted against a pod's memory limit, as page cache is). A gradient file, written in
//! the backward pass and read back at the next forward pass, stays in the cache between the two.
//!
//! A tensor's last partial block, a buffer that is not aligned, and a file system that refuses `O_DIRECT` (tmpfs)
//! read through the page cache. Each tensor starts at an offset aligned to [`ALIGN`] ([`region`] rounds them up),
//! so the bulk of every one can go direct. Linux keeps the two paths coherent: a direct read first writes back
//! the cached pages it covers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
#[cfg(target_os = "linux")]
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::process::HugePages;

/// What direct I/O needs aligned: a buffer's address, a file offset and a length. A weight server's large
/// buffers start on it ([`HugePages::align_large_buffers`]); another process's go through the page cache.
pub(crate) const ALIGN: usize = HugePages::ALIGN;

/// The bytes a tensor of `values` takes in a tier file: its own, rounded up to [`ALIGN`] so the next one starts
/// on a boundary.
pub(crate) fn region(values: usize) -> u64 {
    (4 * values as u64).div_ceil(ALIGN as u64) * ALIGN as u64
}

/// A tier file, open through the page cache, and for a layer file also with `O_DIRECT` when the file system
/// takes it.
pub(crate) struct TierFile {
    buffered: File,
    direct: Option<File>,
}

impl TierFile {
    /// Creates (or empties) the file at `path`, read direct when `direct` (a layer's file) and the file system
    /// allows.
    pub fn create(path: &Path, direct: bool) -> io::Result<TierFile> {
        let buffered = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        // A file system without direct I/O refuses the flag (EINVAL): everything then goes through the cache.
        let direct = if direct { open_direct(path) } else { None };
        Ok(TierFile { buffered, direct })
    }

    /// Whether this file is read direct.
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The direct handle and the bytes of `len` it can read at `offset` into `at`: the whole blocks, when the
    /// address and the offset are aligned.
    fn bulk(&self, at: *const u8, len: usize, offset: u64) -> Option<(&File, usize)> {
        let file = self.direct.as_ref()?;
        let bulk = len / ALIGN * ALIGN;
        (bulk > 0 && (at as usize).is_multiple_of(ALIGN) && offset.is_multiple_of(ALIGN as u64)).then_some((file, bulk))
    }

    /// Reads `len` values at byte `offset` into `out` (emptied first), straight into its spare room: a kept
    /// buffer zero-filled only for the read to overwrite it was a tenth of a tiered step's update phase. Returns
    /// the bytes read directly.
    pub fn read_values(&self, out: &mut Vec<f32>, len: usize, offset: u64) -> io::Result<u64> {
        out.clear();
        out.reserve_exact(len);
        let bytes = len * std::mem::size_of::<f32>();
        let room = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        let mut done = 0;
        if let Some((file, bulk)) = self.bulk(room, bytes, offset) {
            // SAFETY: `room .. room + bulk` lies within the spare capacity reserved above, which `pread` only
            // writes; nothing else holds the buffer.
            done = direct_once(unsafe { pread(file, room, bulk, offset) })?;
            // The pages the kernel flushed for the read are clean now: dropped, not kept as a second copy.
            drop_cached(&self.buffered, offset, done);
        }
        // The rest (all of it, when nothing went direct) through the cache.
        // SAFETY: as above, for `room + done .. room + bytes`.
        unsafe { read_exact(&self.buffered, room.add(done), bytes - done, offset + done as u64) }?;
        // SAFETY: the reads above wrote all `len` values.
        unsafe { out.set_len(len) };
        Ok(done as u64)
    }

    /// Writes `bytes` at byte `offset`, through the page cache; a file read direct starts writing them back at
    /// once (without waiting for it).
    pub fn write_bytes(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.buffered.write_all_at(bytes, offset)?;
        if self.direct.is_some() {
            start_write_back(&self.buffered, offset, bytes.len());
        }
        Ok(())
    }
}

/// `path` opened for direct reads, unless its file system refuses (EINVAL) or the system has no `O_DIRECT`.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok()
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_: &Path) -> Option<File> {
    None
}

/// Drops the clean cached pages of `len` bytes at `offset` (none when `len` is 0). Only a hint.
fn drop_cached(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    if let (Ok(at), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        && len > 0
    {
        // SAFETY: posix_fadvise only advises the kernel on the file's cached pages.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_DONTNEED) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Starts writing back the dirty pages of `len` bytes at `offset`, without waiting. Only a hint: a refusal leaves
/// the write-back to the kernel's own time.
fn start_write_back(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    if let (Ok(at), Ok(len)) = (libc::off64_t::try_from(offset), libc::off64_t::try_from(len)) {
        // SAFETY: sync_file_range only starts write-back of the file's dirty pages in the range.
        unsafe { libc::sync_file_range(file.as_raw_fd(), at, len, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// What one direct transfer moved: its count, or none when it was refused for its alignment (EINVAL: a device
/// with larger blocks than [`ALIGN`]) or interrupted, leaving it all to the cached path. Other errors are the
/// disk's and are returned.
fn direct_once(moved: io::Result<usize>) -> io::Result<usize> {
    match moved {
        Ok(n) => Ok(n),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// One `pread` of up to `len` bytes at `offset` into `at`.
///
/// # Safety
/// `at .. at + len` must be valid for writes and held by no one else.
unsafe fn pread(file: &File, at: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a disk tier offset past the file API's range"))?;
    // SAFETY: the caller's contract.
    let n = unsafe { libc::pread(file.as_raw_fd(), at.cast(), len, offset) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Reads exactly `len` bytes at `offset` into `at`.
///
/// # Safety
/// As [`pread`].
unsafe fn read_exact(file: &File, at: *mut u8, len: usize, offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: `at + done .. at + len` lies within the caller's range.
        match unsafe { pread(file, at.add(done), len - done, offset + done as u64) } {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the disk tier file ends before the layer does",
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    /// How many of the file's pages are in the page cache (`mincore` over a mapping of it).
    fn cached_pages(path: &Path) -> usize {
        let file = File::open(path).expect("open");
        let len = file.metadata().expect("metadata").len() as usize;
        let page = 4096;
        let mut resident = vec![0u8; len.div_ceil(page)];
        // SAFETY: a read-only shared mapping of `len` bytes of an open file, unmapped before returning; `mincore`
        // writes one byte per page into `resident`, which has that many.
        unsafe {
            let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            assert_eq!(libc::mincore(map, len, resident.as_mut_ptr()), 0, "mincore");
            libc::munmap(map, len);
        }
        resident.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// A folder on the disk the tests build on (the target folder), not the temporary one, which may be tmpfs
    /// (no direct I/O there).
    fn on_disk(name: &str) -> std::path::PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tier-file-tests");
        std::fs::create_dir_all(&dir).expect("test folder");
        dir.join(format!("{name}-{}.f32", std::process::id()))
    }

    /// Tensors of layer size written and read back whole, at aligned regions: what is read is what was written,
    /// the bulk is read direct, and afterwards the page cache holds none of it, only each tensor's last partial
    /// block. A gradient's file (not read direct) reads the same through the cache.
    #[test]
    fn layers_are_read_straight_from_the_disk_and_leave_the_cache() {
        HugePages::align_large_buffers();
        let path = on_disk("direct");
        let file = TierFile::create(&path, true).expect("create");
        let lengths = [(HugePages::PAGE / 4) + 1000, 7, HugePages::PAGE / 4];
        let tensors: Vec<Vec<f32>> =
            lengths.iter().enumerate().map(|(k, &n)| (0..n).map(|i| (k * 1_000_000 + i) as f32).collect()).collect();
        let offsets: Vec<u64> = lengths.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + region(n)))).collect();
        for (t, &at) in tensors.iter().zip(&offsets) {
            file.write_bytes(bytemuck::cast_slice(t), at).expect("write");
        }
        let read_all = |file: &TierFile| {
            let mut direct = 0;
            for ((t, &at), &n) in tensors.iter().zip(&offsets).zip(&lengths) {
                let mut out = Vec::with_capacity(n);
                direct += file.read_values(&mut out, n, at).expect("read");
                assert!(&out == t, "tensor of {n} values read back as written");
            }
            direct
        };
        let direct = read_all(&file);
        if !file.direct() {
            eprintln!("{}: the file system refuses O_DIRECT; only the cached path was checked", path.display());
            std::fs::remove_file(&path).ok();
            return;
        }
        // The two large tensors' whole blocks; the 7 values' one is too small to have any.
        let bulk = ((4 * lengths[0] / ALIGN + 4 * lengths[2] / ALIGN) * ALIGN) as u64;
        assert_eq!(direct, bulk, "the whole blocks of the large tensors were read direct");
        let cached = cached_pages(&path);
        assert!(cached <= 2, "only the partial blocks stay in the page cache: {cached} pages cached");

        // A write at an unaligned offset goes through the cache; a direct read of the region then sees it.
        let changed: Vec<f32> = tensors[2].iter().map(|x| -x - 1.0).collect();
        file.write_bytes(&bytemuck::cast_slice(&changed)[4..], offsets[2] + 4).expect("write");
        let mut out = Vec::with_capacity(lengths[2]);
        assert!(file.read_values(&mut out, lengths[2], offsets[2]).expect("read") > 0, "the read went direct");
        assert_eq!(out[0], tensors[2][0], "the value before the cached write's range is the first write's");
        assert!(out[1..] == changed[1..], "the cached write is read back by a direct read");

        // A file not read direct (a staged gradient's) reads the same values through the cache.
        let grads = TierFile::create(&on_disk("cached"), false).expect("create");
        for (t, &at) in tensors.iter().zip(&offsets) {
            grads.write_bytes(bytemuck::cast_slice(t), at).expect("write");
        }
        assert_eq!(read_all(&grads), 0, "nothing read direct");
        std::fs::remove_file(&path).ok();
        std::fs::remove_file(on_disk("cached")).ok();
    }

    /// A file shorter than what is asked is an error saying so, whichever path the read takes.
    #[test]
    fn a_short_file_is_an_error() {
        let path = on_disk("short");
        let file = TierFile::create(&path, true).expect("create");
        let n = HugePages::PAGE / 4;
        file.write_bytes(bytemuck::cast_slice(&vec![1.0f32; n - 5000]), 0).expect("write");
        let mut out = Vec::with_capacity(n);
        let err = file.read_values(&mut out, n, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        std::fs::remove_file(&path).ok();
    }
}
