//! `wsctl bench machine` and `wsctl bench transport` at tiny sizes: they report positive, finite ceilings,
//! really move the bytes they claim over both paths, and refuse bad sizes with one clear error line.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn wsctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wsctl")).args(args).current_dir(repo()).output().expect("wsctl starts")
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = wsctl(args);
    assert!(o.status.success(), "wsctl {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

fn positive(v: &serde_json::Value) -> bool {
    v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)
}

#[test]
fn machine_quick_reports_positive_finite_ceilings_per_thread_count() {
    let r = json(&["bench", "machine", "--json", "--quick"]);
    for key in ["gemm_flops_per_s", "triad_bytes_per_s"] {
        let rates = r[key].as_array().expect("a list per thread count");
        let threads: Vec<u64> = rates.iter().map(|x| x["threads"].as_u64().expect("threads")).collect();
        assert_eq!(threads, [1, 2], "{key}: {r}");
        for x in rates {
            assert!(positive(&x["best"]) && positive(&x["median"]), "{key}: {x}");
            assert!(x["best"].as_f64() >= x["median"].as_f64(), "best is at least the median: {x}");
        }
    }
    // The disk: write to fsync and read back from the disk, in the folder asked for, leaving nothing there.
    let dir = std::env::temp_dir().join(format!("ws-bench-disk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = json(&["bench", "machine", "--json", "--quick", "--threads", "1", "--disk-dir", dir.to_str().unwrap()]);
    assert_eq!((d["disk_dir"].as_str(), d["disk_bytes"].as_u64()), (dir.to_str(), Some(16 << 20)), "{d}");
    for key in ["disk_write_bytes_per_s", "disk_read_bytes_per_s"] {
        assert!(positive(&d[key]["best"]) && d[key]["best"].as_f64() < Some(1e12), "{key}: {d}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the measurement file is removed");
    let o = wsctl(&["bench", "machine", "--disk-bytes", "0"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--disk-bytes"), "{o:?}");
    std::fs::remove_dir_all(&dir).ok();
    // A GEMM or a triad faster than 100 TFLOP/s or 10 TB/s on this machine would be a broken timer.
    assert!(r["gemm_flops_per_s"][0]["best"].as_f64().is_some_and(|x| x < 1e14), "{r}");
    assert!(r["triad_bytes_per_s"][0]["best"].as_f64().is_some_and(|x| x < 1e13), "{r}");
}

#[test]
fn transport_moves_every_byte_over_both_paths() {
    let bytes = 3_000_004u64; // three chunks and a bit: more than one 1 MiB message
    let r = json(&["bench", "transport", "--json", "--bytes", &bytes.to_string(), "--repeats", "2"]);
    for path in ["grpc", "grpc_plaintext", "tcp"] {
        assert_eq!(r[path]["bytes_sent"].as_u64(), Some(bytes), "{path}: {r}");
        assert_eq!(r[path]["bytes_received"].as_u64(), Some(bytes), "{path}: {r}");
        assert!(positive(&r[path]["bytes_per_s"]) && positive(&r[path]["seconds"]), "{path}: {r}");
    }
    assert!(r["grpc"]["messages"].as_u64().is_some_and(|m| m >= 4), "chunks of at most 1 MiB: {r}");
    assert!(positive(&r["grpc_over_tcp"]) && positive(&r["encode_s"]) && positive(&r["assemble_s"]), "{r}");
}

#[test]
fn bad_sizes_get_one_error_line_and_a_failure_exit() {
    for args in [
        &["bench", "transport", "--bytes", "6"][..],
        &["bench", "transport", "--bytes", "0"],
        &["bench", "transport", "--repeats", "0", "--bytes", "8"],
        &["bench", "machine", "--threads", "0"],
        &["bench", "machine", "--gemm-n", "0"],
        &["bench", "machine", "--gemm-n", "100000"],
        &["bench", "transport", "--bytes", "99999999996"],
    ] {
        let o = wsctl(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: ") && !err.contains("panicked"), "{args:?}: {err}");
    }
}
