//! What every `wsctl` test file needs: the repository, the binary, a fresh scratch folder.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root: examples' relative data paths are resolved from here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `wsctl` from the repository root and waits for it.
pub fn wsctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wsctl")).args(args).current_dir(repo()).output().expect("wsctl starts")
}

/// An empty folder of its own for one test (`kind` keeps test files apart, `name` tests within one).
pub fn scratch(kind: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wsctl-{kind}-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}
