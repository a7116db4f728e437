//! Checkpoints of a job whose state is spread over several weight servers. Each server writes its slice of
//! the state to its own volume (`step-N.slice-I-of-K.safetensors`, atomically, with a checksum); the
//! coordinator then writes the step's manifest (`step-N.manifest.json`) naming every slice's checksum. The
//! manifest is written last, so a checkpoint counts only once every slice of it is complete: a server lost
//! mid-checkpoint leaves slices without a manifest, which are ignored and pruned, and the job resumes from the
//! manifest before. A manifest whose slice is missing or damaged is an error naming the slice, never a silent
//! fall-back that could mix steps.
//!
//! A single server keeps the one-file checkpoints of [`super::checkpoint`], which `wsctl checkpoint pull` and
//! `wsctl export` read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::{self, Tensors};
use super::server::SliceId;
use crate::error::{Error, Result};

/// What a complete checkpoint of a sliced state holds: the step, the servers, and each slice's checksum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The step the state was taken after.
    pub step: u64,
    /// The job's name.
    pub job: String,
    /// The TrainingJob's uid, when it has one: only this job's checkpoints are resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The job's model, so the checkpoint says what it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<crds::ModelSpec>,
    /// The seed the model's masks were drawn from.
    #[serde(default)]
    pub seed: u64,
    /// Each slice's checksum, in server order; its length is the number of servers.
    pub slices: Vec<u32>,
}

const PREFIX: &str = "step-";
const MANIFEST_SUFFIX: &str = ".manifest.json";
/// Largest manifest read: a few hundred bytes per server and the model spec.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The file of slice `slice` of the checkpoint of `step` in a server's directory.
pub fn slice_path(dir: &Path, step: u64, slice: SliceId) -> PathBuf {
    dir.join(format!("{PREFIX}{step:08}.slice-{}-of-{}.safetensors", slice.index, slice.count))
}

/// The manifest of `step` in the coordinator's directory.
pub fn manifest_path(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{step:08}{MANIFEST_SUFFIX}"))
}

/// Writes `bytes` to `path` through a temporary file, flushed and renamed into place, so a crash leaves the old
/// file or the new one, never half of one.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let written = fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        let hint = if e.kind() == std::io::ErrorKind::StorageFull {
            "; the checkpoint volume is full: raise spec.checkpoint.volumeSize or lower spec.checkpoint.keep (the last complete checkpoint is kept)"
        } else {
            ""
        };
        return Err(Error::io(format!("writing {}{hint}", path.display()), e));
    }
    if let Some(d) = path.parent().and_then(|d| fs::File::open(d).ok()) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes a server's slice of the checkpoint of `step`; returns its checksum for the manifest.
pub fn write_slice(dir: &Path, step: u64, tensors: &Tensors, job: &str, slice: SliceId) -> Result<u32> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating checkpoint directory {}", dir.display()), e))?;
    let bytes = checkpoint::to_bytes(step, tensors, job)?;
    write_atomic(&slice_path(dir, step, slice), &bytes)?;
    Ok(checkpoint::checksum(tensors))
}

/// Reads a server's slice of the checkpoint of `step` (at most `max_bytes`), which the manifest says has
/// checksum `crc32`: a missing, damaged or different file is an error naming it.
pub fn read_slice(dir: &Path, step: u64, slice: SliceId, crc32: u32, max_bytes: u64) -> Result<Tensors> {
    let path = slice_path(dir, step, slice);
    let fail = |why: String| {
        Error::Protocol(format!(
            "the checkpoint of step {step} is incomplete: {slice}'s slice {} {why}; restore that server's volume, or \
             delete {step:08}'s manifest (step-{step:08}.manifest.json) on the coordinator's volume to resume from the \
             checkpoint before it",
            path.display()
        ))
    };
    if !path.exists() {
        return Err(fail("is missing".into()));
    }
    let (at, tensors) = checkpoint::read(&path, max_bytes).map_err(|e| fail(format!("is unusable ({e})")))?;
    let have = checkpoint::checksum(&tensors);
    if at != step || have != crc32 {
        return Err(fail(format!("holds step {at} with checksum {have:08x}, not step {step} with {crc32:08x}")));
    }
    Ok(tensors)
}

/// Removes a server's slices of checkpoints other than `keep`, and temporary files a crash left behind.
pub fn retain_slices(dir: &Path, slice: SliceId, keep: &[u64]) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    let ours = format!(".slice-{}-of-{}.safetensors", slice.index, slice.count);
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let step = name.strip_prefix(PREFIX).and_then(|r| r.strip_suffix(&ours)).and_then(|s| s.parse::<u64>().ok());
        let stale_tmp = name.starts_with(PREFIX) && name.ends_with(".tmp");
        if step.is_some_and(|s| !keep.contains(&s)) || stale_tmp {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// Writes the manifest of a checkpoint whose slices are all written, then prunes manifests beyond the newest
/// `keep`. Returns the steps whose manifests remain (the slices the servers must keep).
pub fn write_manifest(dir: &Path, manifest: &Manifest, keep: usize) -> Result<(PathBuf, Vec<u64>)> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating checkpoint directory {}", dir.display()), e))?;
    let path = manifest_path(dir, manifest.step);
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| Error::io("encoding a manifest", e.into()))?;
    write_atomic(&path, &json)?;
    let mut kept = Vec::new();
    for (step, p) in list(dir)? {
        if kept.len() < keep.max(1) {
            kept.push(step);
        } else {
            let _ = fs::remove_file(p);
        }
    }
    Ok((path, kept))
}

/// Manifests in `dir`, newest first.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix(PREFIX)?.strip_suffix(MANIFEST_SUFFIX)?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(found)
}

/// The newest manifest in `dir` of the job of `uid` (manifests of another job's uid are passed over with a
/// warning), for a state of `servers` slices. A manifest of another server count is an error: the slices
/// cannot be cut again without every one of them.
pub fn latest(dir: &Path, uid: Option<&str>, servers: u32) -> Result<Option<(Manifest, PathBuf)>> {
    for (_, path) in list(dir)? {
        let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(u64::MAX);
        Error::check_limit(|| format!("manifest {}", path.display()), size, MAX_MANIFEST_BYTES)?;
        let text = fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| Error::Protocol(format!("manifest {} is unusable: {e}; delete it to resume from an older one", path.display())))?;
        if let (Some(ours), Some(theirs)) = (uid, manifest.uid.as_deref()) {
            if ours != theirs {
                tracing::warn!(path = %path.display(), owner = %theirs, "a checkpoint of another job (uid) is not resumed");
                continue;
            }
        }
        if manifest.slices.len() != servers as usize {
            return Err(Error::Plan(format!(
                "the checkpoint {} was written by {} weight servers but the job now has {servers}; set \
                 spec.memoryx.servers back to {} to resume it",
                path.display(),
                manifest.slices.len(),
                manifest.slices.len()
            )));
        }
        return Ok(Some((manifest, path)));
    }
    Ok(None)
}
