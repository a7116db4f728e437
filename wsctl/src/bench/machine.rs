//! `wsctl bench machine`: the ceilings everything on this machine lives under. Peak dense GEMM FLOP/s of the
//! `gemm` crate, called through the runtime's own `kernels::dense::matmul` so it is exactly the dense path the
//! engines use; memory bandwidth from a STREAM-like triad; and the disk's sequential write and read bandwidth,
//! the limit a MemoryX whose state lives on disk streams under. The harness divides each speed by the ceiling
//! that bounds it, so "fast" reads as "this share of what the hardware can do".

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kernels::dense;
use rayon::prelude::*;
use serde::Serialize;

/// Sizes and repetitions of one `bench machine` run.
#[derive(clap::Args)]
pub struct MachineArgs {
    /// Thread counts to measure each ceiling at.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Side of the square GEMM (n x n times n x n).
    #[arg(long, default_value_t = 2048)]
    pub gemm_n: usize,
    /// Elements (f64) of each of the triad's three arrays; the default, 3 x 256 MiB, is far beyond any cache.
    #[arg(long, default_value_t = 1 << 25)]
    pub triad_elements: usize,
    /// Timed repetitions; the best is the ceiling, the median is reported beside it.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Where the disk bandwidth is measured: a file is written there, read back and removed (default: the
    /// temporary folder; point it at the volume MemoryX would use).
    #[arg(long)]
    pub disk_dir: Option<std::path::PathBuf>,
    /// Bytes of the file the disk bandwidth is measured with: larger than the disk's cache gives its real rate.
    #[arg(long, default_value_t = 1 << 30)]
    pub disk_bytes: u64,
    /// Tiny sizes (a 256 GEMM, 1 Mi-element triad, a 16 MiB file, 2 repeats): a smoke test in about a second.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One ceiling at one thread count: the best rate seen and the median, since on a shared machine the best
/// is the hardware and the median is what a run typically got.
#[derive(Serialize)]
struct Rate {
    threads: usize,
    best: f64,
    median: f64,
}

#[derive(Serialize)]
struct Report {
    gemm_n: usize,
    triad_elements: usize,
    repeats: usize,
    /// FLOP/s of an n x n x n f32 GEMM (2 n^3 FLOPs per product).
    gemm_flops_per_s: Vec<Rate>,
    /// Bytes/s of `a = b + s * c` over f64 arrays, counted as STREAM does: 24 bytes per element.
    triad_bytes_per_s: Vec<Rate>,
    /// The disk measured: the folder and the file's size.
    disk_dir: String,
    disk_bytes: u64,
    /// Sequential write, 4 MiB blocks, up to the file's `fsync`.
    disk_write_bytes_per_s: Rate,
    /// Sequential read of the same file after its pages were dropped from the page cache.
    disk_read_bytes_per_s: Rate,
}

/// The block the disk is written and read in: large enough that the rate is the disk's, not the calls'.
const DISK_BLOCK: usize = 4 << 20;

/// Removes the measurement file however the measurement ends.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Asks the kernel to drop `file`'s cached pages (they are clean after `fsync`), so the next read comes from
/// the disk. Without it a read right after the write measures memory.
fn drop_cache(file: &std::fs::File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call; the advice changes no memory of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Bytes free in the filesystem of `dir`, so the measurement never fills a disk.
fn free_bytes(dir: &std::path::Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).context("the disk folder's name holds a NUL")?;
    // SAFETY: `path` is a NUL-terminated string and `stat` a zeroed struct the call fills.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        bail!("cannot read the free space of {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Sequential write (to `fsync`) and read (from the disk, not the cache) bandwidth of `bytes` in `dir`.
fn disk_rates(dir: &std::path::Path, bytes: u64, repeats: usize) -> Result<(Rate, Rate)> {
    use std::io::{Read, Write};
    let free = free_bytes(dir)?;
    if bytes > free / 2 {
        bail!(
            "--disk-bytes {bytes} is more than half of the {free} bytes free in {}: lower it or point --disk-dir elsewhere",
            dir.display()
        );
    }
    let file = Scratch(dir.join(format!(".wsctl-bench-disk-{}", std::process::id())));
    let block: Vec<u8> = (0..DISK_BLOCK).map(|i| (i % 251) as u8).collect();
    let mut buf = vec![0u8; DISK_BLOCK];
    let (mut writes, mut reads) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    for _ in 0..repeats {
        let start = Instant::now();
        let mut f = std::fs::File::create(&file.0).with_context(|| format!("cannot create {}", file.0.display()))?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(DISK_BLOCK as u64) as usize;
            f.write_all(&block[..n]).with_context(|| format!("writing {}", file.0.display()))?;
            left -= n as u64;
        }
        f.sync_all().with_context(|| format!("syncing {}", file.0.display()))?;
        writes.push(bytes as f64 / start.elapsed().as_secs_f64().max(1e-12));
        drop_cache(&f);
        drop(f);
        let mut f = std::fs::File::open(&file.0).with_context(|| format!("cannot open {}", file.0.display()))?;
        let start = Instant::now();
        let mut read = 0u64;
        loop {
            let n = f.read(&mut buf).with_context(|| format!("reading {}", file.0.display()))?;
            if n == 0 {
                break;
            }
            read += n as u64;
        }
        black_box(&buf);
        if read != bytes {
            bail!("read {read} bytes back from {} but wrote {bytes}", file.0.display());
        }
        reads.push(bytes as f64 / start.elapsed().as_secs_f64().max(1e-12));
    }
    Ok((best_and_median(1, writes), best_and_median(1, reads)))
}

/// Best and median of `rates`.
fn best_and_median(threads: usize, mut rates: Vec<f64>) -> Rate {
    rates.sort_by(f64::total_cmp);
    Rate {
        threads,
        best: rates.last().copied().unwrap_or(0.0),
        median: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
    }
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .with_context(|| format!("cannot start {threads} threads"))
}

/// GEMM FLOP/s on `threads` threads: the runtime's dense path splits over the threads of the pool it runs in.
fn gemm_rate(threads: usize, n: usize, repeats: usize) -> Result<Rate> {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 89) as f32 / 89.0 - 0.5).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 97) as f32 / 97.0 - 0.5).collect();
    let mut c = vec![0.0f32; n * n];
    let flops = 2.0 * (n as f64).powi(3);
    let rates = pool(threads)?.install(|| {
        let mut once = || {
            let start = Instant::now();
            dense::matmul(&mut c, dense::MatView::new(&a, n, n), dense::MatView::new(&b, n, n), false);
            black_box(&c);
            flops / start.elapsed().as_secs_f64().max(1e-12)
        };
        once();
        (0..repeats).map(|_| once()).collect::<Vec<f64>>()
    });
    Ok(best_and_median(threads, rates))
}

/// Triad bytes/s on `threads` threads, each owning one contiguous slice of the three arrays.
fn triad_rate(threads: usize, elements: usize, repeats: usize) -> Result<Rate> {
    let chunk = elements.div_ceil(threads).max(1);
    let (mut a, mut b, mut c) = (vec![0.0f64; elements], vec![0.0f64; elements], vec![0.0f64; elements]);
    let rates = pool(threads)?.install(|| {
        // Touch the pages from the threads that will use them.
        b.par_chunks_mut(chunk).zip(c.par_chunks_mut(chunk)).for_each(|(b, c)| {
            b.iter_mut().for_each(|x| *x = 1.0);
            c.iter_mut().for_each(|x| *x = 2.0);
        });
        let scalar = black_box(3.0f64);
        let mut once = || {
            let start = Instant::now();
            a.par_chunks_mut(chunk).zip(b.par_chunks(chunk)).zip(c.par_chunks(chunk)).for_each(|((a, b), c)| {
                for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                    *a = b + scalar * c;
                }
            });
            black_box(&a);
            24.0 * elements as f64 / start.elapsed().as_secs_f64().max(1e-12)
        };
        once();
        (0..repeats).map(|_| once()).collect::<Vec<f64>>()
    });
    Ok(best_and_median(threads, rates))
}

/// Runs `wsctl bench machine` and prints its report.
pub fn machine(args: MachineArgs) -> Result<()> {
    let (n, elements, repeats, disk_bytes) = if args.quick {
        (256, 1 << 20, 2, 16 << 20)
    } else {
        (args.gemm_n, args.triad_elements, args.repeats, args.disk_bytes)
    };
    if n == 0 || elements == 0 || repeats == 0 || disk_bytes == 0 {
        bail!("--gemm-n, --triad-elements, --disk-bytes and --repeats must be at least 1");
    }
    if n > 16_384 || elements > 1 << 28 {
        bail!("--gemm-n is at most 16384 and --triad-elements at most 268435456 (3 x 2 GiB), to stay in memory");
    }
    if args.threads.is_empty() || args.threads.iter().any(|&t| t == 0 || t > 1024) {
        bail!("--threads needs thread counts from 1 to 1024");
    }
    let disk_dir = args.disk_dir.clone().unwrap_or_else(std::env::temp_dir);
    let (disk_write, disk_read) = disk_rates(&disk_dir, disk_bytes, repeats)?;
    let mut report = Report {
        gemm_n: n,
        triad_elements: elements,
        repeats,
        gemm_flops_per_s: Vec::new(),
        triad_bytes_per_s: Vec::new(),
        disk_dir: disk_dir.display().to_string(),
        disk_bytes,
        disk_write_bytes_per_s: disk_write,
        disk_read_bytes_per_s: disk_read,
    };
    for &t in &args.threads {
        report.gemm_flops_per_s.push(gemm_rate(t, n, repeats)?);
        report.triad_bytes_per_s.push(triad_rate(t, elements, repeats)?);
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("GEMM {n}x{n}x{n} f32 (gemm crate via kernels::dense); triad over 3 x {elements} f64; {repeats} repeats");
    println!("threads  GEMM best      GEMM median    triad best    triad median");
    for (g, t) in report.gemm_flops_per_s.iter().zip(&report.triad_bytes_per_s) {
        println!(
            "{:>7}  {:>7.1} GFLOP/s  {:>7.1} GFLOP/s  {:>6.2} GB/s  {:>8.2} GB/s",
            g.threads,
            g.best / 1e9,
            g.median / 1e9,
            t.best / 1e9,
            t.median / 1e9
        );
    }
    let (w, r) = (&report.disk_write_bytes_per_s, &report.disk_read_bytes_per_s);
    println!(
        "disk {} ({} MiB file): write {:.2} GB/s best, {:.2} median (to fsync); read {:.2} GB/s best, {:.2} median (cache dropped)",
        report.disk_dir,
        disk_bytes >> 20,
        w.best / 1e9,
        w.median / 1e9,
        r.best / 1e9,
        r.median / 1e9
    );
    Ok(())
}
