//! What this process holds in memory, and how its allocator is tuned for the role it plays.

/// This process's peak resident memory (`VmHWM` in `/proc/self/status`), in bytes; 0 where the system does not
/// say. What a memory budget is checked against, beside the process's own accounting.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// This process's resident memory now (`VmRSS`), in bytes; 0 where the system does not say.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// Keeps freed buffers in the process for the next step, for a process whose work repeats step after step at
/// the same shapes (an engine, or the whole appliance in one process). glibc's default serves a buffer above its
/// mmap threshold from fresh pages and unmaps it when freed, so each step faults its activations in again page by
/// page, zeroed by the kernel: at gpt-small's shapes some 16,000 faults, a sixth of a step's time. A threshold
/// above any one activation (32 MiB, glibc's largest) and no trimming let the next step reuse the same memory;
/// the engine's SRAM budget, checked before every allocation it makes, still bounds how much that is.
///
/// One arena for all threads, too: a step's passes run on whichever rayon worker takes them, each worker
/// allocating from its own arena, and a worker's arena grows in 64 MiB heaps that glibc unmaps as soon as one
/// is empty, whatever the trim threshold. Which worker ran what differed from run to run, and so did the
/// faults: a 40-step 90% sparse gpt-small run took 58,000 to 916,000 page faults, and its median step was 112
/// instead of 93 ms in the runs with the most. In one arena (the main one, which the threshold keeps) every
/// run took 53,000–59,000. The arena's lock is uncontended in practice: the buffers are few and large, and small
/// allocations come from each thread's cache.
///
/// And no buffer mapped on its own: 32 MiB is the highest threshold glibc takes, and an activation of that size
/// or more (the ~100M GPT's MLP activations are exactly 32 MiB; the 1 B example's, 128 MiB) was still mapped
/// fresh and unmapped when freed, every layer of every step, its huge pages zeroed by the kernel each time
/// (`clear_page_erms`, 3.6% of the machine in the ~100M GPT's streaming run). From the heap it is reused. A
/// streaming run of that shape went from 1.05 to 1.10 samples/s, the loss the same to the last bit.
pub fn keep_allocator_warm() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (thread-safe); its callers make it their first call, before
    // the working set or any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Keeps the allocator from holding on to freed layer buffers, for a process whose memory is budgeted (a weight
/// server): glibc otherwise raises its mmap threshold after the first large buffer is freed and serves later
/// ones from per-thread arenas that it seldom gives back, so the resident set drifts far above what is in use.
/// A fixed threshold returns every buffer of a layer slice's size to the system when freed, and two arenas bound
/// the per-thread caches.
///
/// The threshold is a huge page ([`HugePages::PAGE`]): what is mapped fresh is what [`HugePages`] backs with 2 MiB pages, one fault
/// each. Below it, the transport's buffers (a megabyte's message being decoded, a TLS record, an HTTP/2 frame)
/// come and go for every chunk of every layer; mapped fresh (the threshold was 64 KiB) each faulted in page by
/// page, at ~3 µs a 4 KiB page here, and MemoryX spent more time in the kernel than in its own code. From the
/// heap, with 8 MiB kept at its top instead of glibc's 128 KiB, they reuse memory already mapped. The 1 B
/// example: the coordinator's page faults over two steps fell from 10.2 M to 1.4 M and each other server's from
/// 2.3–3.0 M to 0.7 M, MemoryX's system time from 200 to 150 s, a step from 132 to 112 s; the coordinator's
/// peak RSS rose 141 MB, the others' 6–41 MB, all within their budgets' allowance.
pub fn tighten_allocator() {
    HugePages::align_large_buffers();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before the process allocates its state.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HugePages::PAGE as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// The system allocator, with every large allocation offered to the kernel as transparent huge pages. Install it
/// in a role's program (`#[global_allocator] static ALLOCATOR: HugePages = HugePages;`).
///
/// Why: the buffers a role streams (layers, their slices, gradients, tier reads) are tens of megabytes, and a
/// fresh one faults in page by page. On the virtual machines this runs on, a 4 KiB fault costs ~3 µs, six times
/// the copy that fills the page: writing 64 MiB into fresh memory took 42–54 ms, and 8–10 ms in huge pages. The
/// budgeted processes (weight servers) give their layer buffers back on purpose ([`tighten_allocator`]), so they
/// pay that on every layer. The hint changes no allocation's size or lifetime, only its backing: a buffer
/// written whole (all of a role's large ones are) occupies the same memory. Where the kernel's THP setting is
/// `never`, the hint is refused and nothing changes.
pub struct HugePages;

impl HugePages {
    /// A huge page: what the kernel backs an aligned range of this size with, at once. Also where a budgeted
    /// process stops reusing heap memory and maps fresh ([`tighten_allocator`]).
    pub const PAGE: usize = 2 << 20;

    /// Where an allocation of a [`HugePages::PAGE`] or more starts once [`HugePages::align_large_buffers`] was
    /// called: on a 4 KiB boundary, which is what direct I/O asks of a buffer (4 KiB covers every logical block
    /// size Linux file systems use). A weight server's disk tier reads and writes its layers straight between
    /// such buffers and the disk (`memoryx::tier_file`); glibc alone starts a mapped buffer 16 bytes into its
    /// first page.
    pub const ALIGN: usize = 4096;

    /// Starts every allocation of a [`HugePages::PAGE`] or more on a [`HugePages::ALIGN`] boundary from now on:
    /// for a weight server, whose disk tier reads and writes with direct I/O and whose large buffers are mapped
    /// fresh anyway ([`tighten_allocator`]), so aligning one costs a page of address space. A process that reuses
    /// heap memory for its buffers ([`keep_allocator_warm`]) is better without: aligned there, an in-process
    /// ~100M GPT run's peak RSS rose from 5.90 to 6.47 GiB. Buffers allocated before keep their alignment; every
    /// buffer is freed alike.
    pub fn align_large_buffers() {
        ALIGN_LARGE.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The alignment to ask the system for, for `size` bytes the caller wants aligned to `align`.
    fn alignment(size: usize, align: usize) -> usize {
        if size >= Self::PAGE && ALIGN_LARGE.load(std::sync::atomic::Ordering::Relaxed) {
            align.max(Self::ALIGN)
        } else {
            align
        }
    }

    /// `size` bytes aligned to `align` from the C allocator: `malloc` when its own alignment is enough (as
    /// `std::alloc::System` does), `posix_memalign` otherwise. Either is given back with `free`, so how a buffer
    /// was aligned never has to be known to free it.
    fn allocate(size: usize, align: usize) -> *mut u8 {
        if align <= MALLOC_ALIGN && align <= size {
            // SAFETY: malloc has no preconditions; a null return is passed on as the failure it is.
            return unsafe { libc::malloc(size) }.cast();
        }
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `align` is a power of two (a layout's, or ALIGN) at least a pointer's size, as posix_memalign
        // requires; on failure `ptr` stays null.
        match unsafe { libc::posix_memalign(&mut ptr, align.max(std::mem::size_of::<usize>()), size) } {
            0 => ptr.cast(),
            _ => std::ptr::null_mut(),
        }
    }

    /// Asks for huge pages under the whole huge pages inside `[ptr, ptr + len)`; a range holding none is left.
    fn advise(ptr: *mut u8, len: usize) {
        if ptr.is_null() || len < Self::PAGE {
            return;
        }
        let start = (ptr as usize).div_ceil(Self::PAGE) * Self::PAGE;
        let end = (ptr as usize + len) / Self::PAGE * Self::PAGE;
        if end > start {
            #[cfg(target_os = "linux")]
            // SAFETY: the range lies within an allocation this process just received; MADV_HUGEPAGE changes only
            // how the kernel backs it, never its contents or validity. A refusal (THP off) is harmless.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// Large buffers are aligned for direct I/O in processes that asked ([`HugePages::align_large_buffers`]).
static ALIGN_LARGE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What `malloc` aligns every allocation to (glibc: two words, and 16 bytes on x86).
const MALLOC_ALIGN: usize = 2 * std::mem::size_of::<usize>();

// SAFETY: every allocation comes from the C allocator aligned as the caller's layout asks (or more) and is freed
// with `free`, which takes what `malloc`, `calloc`, `realloc` and `posix_memalign` gave alike; `advise` only
// touches the backing of memory just handed out.
unsafe impl std::alloc::GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = Self::allocate(layout.size(), Self::alignment(layout.size(), layout.align()));
        Self::advise(ptr, layout.size());
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let (size, align) = (layout.size(), Self::alignment(layout.size(), layout.align()));
        let ptr: *mut u8 = if align <= MALLOC_ALIGN && align <= size {
            // SAFETY: calloc has no preconditions (its pages come zeroed from the kernel when fresh).
            unsafe { libc::calloc(1, size) }.cast()
        } else {
            let ptr = Self::allocate(size, align);
            if !ptr.is_null() {
                // SAFETY: `ptr` holds `size` bytes just allocated.
                unsafe { std::ptr::write_bytes(ptr, 0, size) };
            }
            ptr
        };
        Self::advise(ptr, size);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, so from the C allocator, and is freed once (the caller's
        // contract).
        unsafe { libc::free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let align = Self::alignment(new_size, layout.align());
        if align <= MALLOC_ALIGN && align <= new_size {
            // SAFETY: `ptr` came from the C allocator; realloc keeps malloc's alignment, which is enough here.
            let grown: *mut u8 = unsafe { libc::realloc(ptr.cast(), new_size) }.cast();
            Self::advise(grown, new_size);
            return grown;
        }
        // An alignment realloc may not keep: move the buffer.
        let moved = Self::allocate(new_size, align);
        if !moved.is_null() {
            // SAFETY: both buffers hold at least the bytes copied and do not overlap; `ptr` is freed once, and only
            // when the move succeeded (a failed realloc leaves it to the caller).
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                libc::free(ptr.cast());
            }
        }
        Self::advise(moved, new_size);
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::HugePages;
    use std::alloc::{GlobalAlloc, Layout};

    /// Large and small allocations through the wrapper hold what is written to them, zeroed ones start at zero,
    /// and a buffer grown past a huge page keeps its contents.
    #[test]
    fn huge_pages_allocator_keeps_contents() {
        let a = HugePages;
        for size in [16usize, 4096, (2 << 20) - 1, 2 << 20, (5 << 20) + 123] {
            let layout = Layout::from_size_align(size, 64).expect("layout");
            // SAFETY: the layout is non-zero; every pointer is checked, written within bounds and freed once.
            unsafe {
                let z = a.alloc_zeroed(layout);
                assert!(!z.is_null());
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                a.dealloc(z, layout);
                let p = a.alloc(layout);
                assert!(!p.is_null());
                for i in 0..size {
                    *p.add(i) = (i % 251) as u8;
                }
                let bigger = size * 3 + (2 << 20);
                let q = a.realloc(p, layout, bigger);
                assert!(!q.is_null());
                assert!((0..size).all(|i| *q.add(i) == (i % 251) as u8));
                a.dealloc(q, Layout::from_size_align(bigger, 64).expect("layout"));
            }
        }
    }

    /// In a process that asked, a buffer of a huge page or more starts on a direct-I/O boundary however it came
    /// to be that large (allocated, zeroed, grown from a small one), and keeps its contents when grown or shrunk
    /// across the line.
    #[test]
    fn large_buffers_start_on_a_direct_io_boundary() {
        HugePages::align_large_buffers();
        let a = HugePages;
        let aligned = |p: *mut u8| (p as usize).is_multiple_of(HugePages::ALIGN);
        let small = Layout::from_size_align(100, 4).expect("layout");
        let large = Layout::from_size_align(HugePages::PAGE + 4, 4).expect("layout");
        // SAFETY: every pointer is checked, written and read within its current size and freed once, with the
        // layout (size and alignment) it was last allocated or grown with.
        unsafe {
            for p in [a.alloc(large), a.alloc_zeroed(large)] {
                assert!(!p.is_null() && aligned(p), "{p:p}");
                a.dealloc(p, large);
            }
            let z = a.alloc_zeroed(large);
            assert!(std::slice::from_raw_parts(z, large.size()).iter().all(|&b| b == 0), "zeroed");
            a.dealloc(z, large);
            let p = a.alloc(small);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let grown = a.realloc(p, small, large.size());
            assert!(!grown.is_null() && aligned(grown), "grown past a huge page: {grown:p}");
            assert!((0..100).all(|i| *grown.add(i) == i as u8), "kept its contents");
            let shrunk = a.realloc(grown, large, 50);
            assert!(!shrunk.is_null());
            assert!((0..50).all(|i| *shrunk.add(i) == i as u8), "kept its contents");
            a.dealloc(shrunk, Layout::from_size_align(50, 4).expect("layout"));
        }
    }
}
