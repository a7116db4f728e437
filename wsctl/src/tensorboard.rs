//! `wsctl tensorboard pull`: a job's records (TensorBoard event files, `metrics.jsonl`, `summary.json`) fetched
//! from its MemoryX's `GET /run` over HTTPS with the job's identity, as [`crate::checkpoint`] fetches checkpoints:
//! any base URL (a local run's MemoryX, a port-forward to a cluster job's). The listing is bounded and its names
//! must be record names (never a path); each download is its listed size (the first bytes of a record file that
//! grew since, which end on a record's end) and within [`MAX_FILE_BYTES`];
//! an event file lands only once every record in it checks (length, CRCs, an `Event`), by rename from a
//! temporary file, so `tensorboard --logdir` over the folder never reads half a file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use runtime::coordinator::run_routes::{MAX_FILES, RunFile, is_run_file};
use runtime::tensorboard::{is_event_file_name, read_events};
use wire::identity::Identity;

use crate::checkpoint::{Listed, download, get_listing};

/// Most bytes of one record file pulled: a run's event file grows by ~100 bytes a step, so this is millions of
/// steps; a larger one is refused, not read.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The records MemoryX at `base` lists, each checked to be a record's name and within [`MAX_FILE_BYTES`].
pub async fn list(base: &str, identity: &Identity) -> Result<Vec<RunFile>> {
    let what = format!("GET {base}/run");
    let files: Vec<RunFile> = get_listing(base, identity, "run").await?;
    if files.len() > MAX_FILES {
        bail!("{what}: {} files listed, more than the {MAX_FILES} MemoryX lists; refusing it", files.len());
    }
    if let Some(bad) = files.iter().find(|f| !is_run_file(&f.file)) {
        bail!("{what}: the listing names {:?}, not a record's name; refusing it", bad.file);
    }
    if let Some(big) = files.iter().find(|f| f.bytes > MAX_FILE_BYTES) {
        bail!("{what}: {} is {} bytes, more than the {MAX_FILE_BYTES} wsctl pulls; refusing it", big.file, big.bytes);
    }
    Ok(files)
}

/// Pulls every record MemoryX at `base` lists into `out` (created if missing); returns the files written.
pub async fn pull(base: &str, identity: &Identity, out: &Path) -> Result<Vec<PathBuf>> {
    let files = list(base, identity).await?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut written = Vec::new();
    for f in files {
        let (tmp, path) = (out.join(format!(".{}.tmp", f.file)), out.join(&f.file));
        // A running job's records grow while they are pulled: each comes as long as it was listed.
        let fetched = download(base, identity, ("run", &f.file), (f.bytes, Listed::Prefix), &tmp).await;
        let fetched = fetched.and_then(|()| verify(&f, &tmp));
        if let Err(e) = fetched {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot move {} into place", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// An event file's records all check; other records are kept as they came.
fn verify(f: &RunFile, tmp: &Path) -> Result<()> {
    if !is_event_file_name(&f.file) {
        return Ok(());
    }
    let bytes = std::fs::read(tmp).with_context(|| format!("cannot read {}", tmp.display()))?;
    read_events(&bytes).map(|_| ()).map_err(|e| anyhow!("{}: {e}; refusing it", f.file))
}

/// `wsctl tensorboard pull --url … --identity …`: pulls into `out` and prints each file written.
pub fn pull_command(url: &str, identity_dir: &Path, out: &Path) -> Result<()> {
    let identity = Identity::load(identity_dir)?;
    for path in crate::checkpoint::runtime_block_on(pull(url, &identity, out))? {
        println!("{}", path.display());
    }
    Ok(())
}
