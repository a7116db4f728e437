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

// SAFETY: every call is forwarded to `System` unchanged; `advise` only touches the backing of memory `System`
// has just handed out.
unsafe impl std::alloc::GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { std::alloc::System.alloc(layout) };
        Self::advise(ptr, layout.size());
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { std::alloc::System.alloc_zeroed(layout) };
        Self::advise(ptr, layout.size());
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let grown = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        Self::advise(grown, new_size);
        grown
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
}
