//! `e2e/kind/oci-runtime.sh`, the OCI runtime the offline kind cluster's Docker uses (runc less the capabilities
//! the host cannot grant), run against a stand-in runc that records what it was handed: every capability set of a
//! container's spec (`create`/`run`, the bundle's config.json) and of an exec'd process (`exec --process`) keeps
//! exactly the capabilities in this host's bounding set, nothing else in the files changes, and runc gets the
//! arguments it was called with. Needs bash and jq; no Docker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kind/oci-runtime.sh")
}

/// The capability numbers of Linux 5.9+ by OCI name, in bit order.
const NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

fn all_caps() -> Vec<String> {
    NAMES.iter().map(|n| format!("CAP_{n}")).collect()
}

/// The capabilities this process's bounding set holds (what the script must keep), read here independently.
fn bounding() -> Vec<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).unwrap().trim();
    let mask = u64::from_str_radix(hex, 16).unwrap();
    NAMES.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, n)| format!("CAP_{n}")).collect()
}

/// A process object asking for every capability in each of its five sets.
fn greedy_process() -> Value {
    let all = all_caps();
    json!({
        "user": {"uid": 0, "gid": 0},
        "args": ["/sbin/init"],
        "capabilities": {"bounding": all, "effective": all, "inheritable": all, "permitted": all, "ambient": all},
        "oomScoreAdj": 0
    })
}

/// A stand-in runc in `dir` that writes its arguments, one per line, to `dir/args`.
fn fake_runc(dir: &Path) -> PathBuf {
    let runc = dir.join("runc");
    std::fs::write(&runc, format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\n", dir.join("args").display())).unwrap();
    Command::new("chmod").arg("0755").arg(&runc).status().unwrap();
    runc
}

/// Runs the script with `args` in `cwd`, the stand-in runc behind it; returns the arguments runc received.
fn run(dir: &Path, cwd: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .current_dir(cwd)
        .env("WS_OCI_RUNC", fake_runc(dir))
        .output()
        .unwrap();
    assert!(out.status.success(), "oci-runtime.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(dir.join("args")).unwrap().lines().map(str::to_string).collect()
}

fn assert_clamped(caps: &Value, what: &str) {
    let want = bounding();
    for set in ["bounding", "effective", "inheritable", "permitted", "ambient"] {
        let got: Vec<String> = serde_json::from_value(caps[set].clone()).unwrap();
        assert_eq!(got, want, "{what}: the {set} set keeps exactly the host's bounding set, in order");
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ws-oci-runtime-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_containers_spec_keeps_only_what_the_host_can_grant_in_every_form_of_create_and_run() {
    let cases: [(&str, &[&str]); 4] = [
        (
            "create-bundle",
            &["--root", "/run/x", "--log", "/tmp/l", "create", "--bundle", "BUNDLE", "--pid-file", "p", "c1"],
        ),
        ("create-equals", &["create", "--bundle=BUNDLE", "c2"]),
        ("run-short", &["--systemd-cgroup", "run", "-b", "BUNDLE", "--detach", "c3"]),
        ("create-cwd", &["create", "c4"]),
    ];
    for (name, args) in cases {
        let dir = tempdir(name);
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let spec =
            json!({"ociVersion": "1.0.2", "process": greedy_process(), "root": {"path": "rootfs"}, "hostname": "n"});
        std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let b = bundle.to_str().unwrap().to_string();
        let args: Vec<String> = args.iter().map(|a| a.replace("BUNDLE", &b)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Without --bundle, runc's bundle is the working directory.
        let received = run(&dir, &bundle, &args);
        assert_eq!(received, args, "{name}: runc gets the arguments unchanged");
        let after: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert_clamped(&after["process"]["capabilities"], name);
        let mut rest = after.clone();
        rest["process"]["capabilities"] = spec["process"]["capabilities"].clone();
        assert_eq!(rest, spec, "{name}: nothing but the capabilities changes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn an_exec_process_keeps_only_what_the_host_can_grant_and_other_commands_pass_through() {
    let dir = tempdir("exec");
    let process = dir.join("process.json");
    std::fs::write(&process, serde_json::to_vec(&greedy_process()).unwrap()).unwrap();
    let p = process.to_str().unwrap();
    let received = run(&dir, &dir, &["--root", "/run/x", "exec", "--process", p, "--detach", "c1"]);
    assert_eq!(received, ["--root", "/run/x", "exec", "--process", p, "--detach", "c1"]);
    let after: Value = serde_json::from_slice(&std::fs::read(&process).unwrap()).unwrap();
    assert_clamped(&after["capabilities"], "exec");
    assert_eq!(after["args"], json!(["/sbin/init"]));

    // Commands that start nothing are handed over as they are, and touch no file.
    let before = std::fs::read(&process).unwrap();
    for args in [&["state", "c1"][..], &["kill", "c1", "9"], &["delete", "--force", "c1"], &["--version"]] {
        assert_eq!(run(&dir, &dir, args), args, "{args:?} passes through");
    }
    assert_eq!(std::fs::read(&process).unwrap(), before);
    // The host here lacks CAP_SYS_RESOURCE (the reason for the script); where it has every capability, the
    // assertions above hold with nothing removed.
    if !bounding().iter().any(|c| c == "CAP_SYS_RESOURCE") {
        let caps: Vec<String> = serde_json::from_value(after["capabilities"]["bounding"].clone()).unwrap();
        assert!(!caps.iter().any(|c| c == "CAP_SYS_RESOURCE"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
