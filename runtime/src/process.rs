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
pub fn keep_allocator_warm() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (thread-safe); its callers make it their first call, before
    // the working set or any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Keeps the allocator from holding on to freed layer buffers, for a process whose memory is budgeted (a weight
/// server): glibc otherwise raises its mmap threshold after the first large buffer is freed and serves later
/// ones from per-thread arenas that it seldom gives back, so the resident set drifts far above what is in use.
/// A fixed threshold returns every buffer of a layer's size to the system when freed, and two arenas bound the
/// per-thread caches.
pub fn tighten_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before the process allocates its state.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
