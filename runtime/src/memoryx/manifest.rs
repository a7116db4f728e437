//! Checkpoints of a job whose state is spread over several weight servers. The coordinator writes each
//! server's slice of the state (`step-N.slice-I-of-K.safetensors`, atomically, with a checksum), taking it from
//! the server one layer at a time, into [`slice_dir`] of its own volume; it then writes the step's manifest
//! (`step-N.manifest.json`) naming every slice's checksum. So the whole checkpoint sits on one volume: `wsctl
//! checkpoint pull` gathers it from there, and a job resumes from it on any number of servers, the slices cut
//! again ([`super::store::MemoryX::read_slices`]). The manifest is written last, so a checkpoint counts only once
//! every slice of it is complete: a write cut short leaves slices without a manifest, which are ignored and
//! pruned, and the job resumes from the manifest before. A manifest whose slice is missing or damaged is an
//! error naming the slice, never a silent fall-back that could mix steps.
//!
//! A single server keeps the one-file checkpoints of [`super::checkpoint`]; [`read_joined`] turns a sliced one
//! into the same tensors, which `wsctl export` and `wsctl generate` read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::{self, Tensors};
use super::slice::SliceId;
use errors::{Error, Result};

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

/// Where slice `index` of a checkpoint lives under the checkpoint directory `base`: slice 0 (the coordinator's)
/// in `base` itself, so one server's checkpoints are where they always were, slice `i` in `base/server-i`.
pub fn slice_dir(base: &Path, index: u32) -> PathBuf {
    if index == 0 { base.to_path_buf() } else { base.join(format!("server-{index}")) }
}

/// The names and lengths of the tensors slice `slice` of a state of `lengths` (each layer's whole tensors, in
/// [`checkpoint::KINDS`] order) holds, in checkpoint order, empty ones left out.
pub fn slice_tensors(lengths: &[super::slice::LayerLengths], slice: SliceId) -> Vec<(String, usize)> {
    lengths
        .iter()
        .enumerate()
        .flat_map(|(l, lens)| {
            checkpoint::KINDS
                .iter()
                .zip(lens)
                .map(move |(kind, &n)| (checkpoint::tensor_name(l, kind), slice.range(n).len()))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

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
        return Err(Error::io(format!("writing {}{}", path.display(), checkpoint::full_volume_hint(&e)), e));
    }
    if let Some(d) = path.parent().and_then(|d| fs::File::open(d).ok()) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes a server's slice of a checkpoint as it is read, one tensor at a time, so a server whose slice lives
/// mostly on disk never holds it whole: the safetensors header (every tensor's name and length is known up
/// front) goes first with a placeholder checksum, the tensors follow in checkpoint order while the checksum is
/// computed, and the checksum is written into the header last. The file goes to a temporary name and is
/// renamed into place only when complete.
pub struct SliceWriter {
    file: fs::File,
    tmp: PathBuf,
    path: PathBuf,
    tensors: Vec<(String, usize)>,
    next: usize,
    hasher: crc32fast::Hasher,
    /// Where the checksum's eight hex digits sit in the file.
    crc_at: u64,
}

/// The checksum's placeholder in a header being written.
const CRC_PLACEHOLDER: &str = "ZZZZZZZZ";

impl SliceWriter {
    /// Starts slice `slice` of the checkpoint of `step` in `dir`, which will hold `tensors` (name and length,
    /// in checkpoint order, empty ones left out).
    pub fn create(
        dir: &Path,
        step: u64,
        job: &str,
        slice: SliceId,
        tensors: Vec<(String, usize)>,
    ) -> Result<SliceWriter> {
        fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating checkpoint directory {}", dir.display()), e))?;
        let mut header = serde_json::Map::new();
        let metadata = serde_json::json!({
            "format": "weightstream/v1alpha1",
            "job": job,
            "step": step.to_string(),
            "slice": format!("{}/{}", slice.index, slice.count),
            "crc32": CRC_PLACEHOLDER,
        });
        header.insert("__metadata__".into(), metadata);
        let mut at = 0u64;
        for (name, len) in &tensors {
            let end = at + 4 * *len as u64;
            header.insert(name.clone(), serde_json::json!({"dtype": "F32", "shape": [len], "data_offsets": [at, end]}));
            at = end;
        }
        let mut json = serde_json::to_vec(&header).map_err(|e| Error::io("encoding a checkpoint header", e.into()))?;
        // safetensors aligns the data to 8 bytes by padding the header with spaces.
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let needle = format!("\"crc32\":\"{CRC_PLACEHOLDER}\"");
        let pos = json
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
            .ok_or_else(|| Error::Protocol("the checkpoint header lost its checksum".into()))?;
        let crc_at = 8 + (pos + needle.len() - 1 - CRC_PLACEHOLDER.len()) as u64;
        let path = slice_path(dir, step, slice);
        let tmp = path.with_extension("tmp");
        let mut file = fs::File::create(&tmp).map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
        let mut head = (json.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&json);
        file.write_all(&head).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        Ok(SliceWriter { file, tmp, path, tensors, next: 0, hasher: crc32fast::Hasher::new(), crc_at })
    }

    /// Appends the next tensor's values, which must have the length announced for it.
    pub fn push(&mut self, values: &[f32]) -> Result<()> {
        let (name, len) = self
            .tensors
            .get(self.next)
            .ok_or_else(|| Error::Protocol("a checkpoint slice got a tensor too many".into()))?;
        if values.len() != *len {
            return Err(Error::Protocol(format!(
                "checkpoint tensor {name} has {} values; {len} announced",
                values.len()
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(values);
        self.hasher.update(name.as_bytes());
        self.hasher.update(bytes);
        if let Err(e) = self.file.write_all(bytes) {
            return Err(self.failed(e));
        }
        self.next += 1;
        Ok(())
    }

    fn failed(&self, e: std::io::Error) -> Error {
        let _ = fs::remove_file(&self.tmp);
        Error::io(format!("writing {}{}", self.tmp.display(), checkpoint::full_volume_hint(&e)), e)
    }

    /// Writes the checksum into the header, flushes and renames the file into place; returns the checksum.
    pub fn finish(self) -> Result<u32> {
        if self.next != self.tensors.len() {
            let _ = fs::remove_file(&self.tmp);
            return Err(Error::Protocol(format!(
                "a checkpoint slice got {} of its {} tensors",
                self.next,
                self.tensors.len()
            )));
        }
        let crc = self.hasher.clone().finalize();
        use std::os::unix::fs::FileExt;
        let done = self
            .file
            .write_all_at(format!("{crc:08x}").as_bytes(), self.crc_at)
            .and_then(|()| self.file.sync_all())
            .and_then(|()| fs::rename(&self.tmp, &self.path));
        if let Err(e) = done {
            return Err(self.failed(e));
        }
        if let Some(d) = self.path.parent().and_then(|d| fs::File::open(d).ok()) {
            let _ = d.sync_all();
        }
        Ok(crc)
    }
}

/// A server's slice of a checkpoint, opened for reading one tensor at a time: its header is checked against
/// the size on disk and its checksum verified in one streaming pass before any tensor is handed out, so a
/// damaged or partial file is refused whole and the slice is never held in memory at once.
pub struct SliceReader {
    file: fs::File,
    path: PathBuf,
    /// Each tensor's byte offset in the file and its length in values.
    entries: std::collections::HashMap<String, (u64, usize)>,
}

impl SliceReader {
    /// Opens slice `slice` of the checkpoint of `step` in `dir`, which the manifest says has checksum `crc32`;
    /// the file may be at most `max_bytes`. A missing, damaged or different file is an error naming it.
    pub fn open(dir: &Path, step: u64, slice: SliceId, crc32: u32, max_bytes: u64) -> Result<SliceReader> {
        use std::os::unix::fs::FileExt;
        let path = slice_path(dir, step, slice);
        let fail = |why: String| {
            Error::Protocol(format!(
                "the checkpoint of step {step} is incomplete: {slice}'s slice {} {why}; restore the file, or delete \
                 its manifest (step-{step:08}.manifest.json) beside it to resume from the checkpoint before it",
                path.display()
            ))
        };
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(fail("is missing".into())),
            Err(e) => return Err(fail(format!("is unreadable ({e})"))),
        };
        let size = file.metadata().map_err(|e| fail(format!("is unreadable ({e})")))?.len();
        Error::check_limit(|| format!("checkpoint slice {} (bytes on disk)", path.display()), size, max_bytes)?;
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0).map_err(|_| fail("is unusable (shorter than its header)".into()))?;
        let n = u64::from_le_bytes(n);
        if n > size.saturating_sub(8) || n > (64 << 20) {
            return Err(fail(format!("is unusable (a header of {n} bytes in a file of {size})")));
        }
        let mut json = vec![0u8; n as usize];
        file.read_exact_at(&mut json, 8).map_err(|_| fail("is unusable (its header is cut short)".into()))?;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&json).map_err(|e| fail(format!("is unusable (its header: {e})")))?;
        let meta = header.get("__metadata__").cloned().unwrap_or_default();
        let recorded_step = meta["step"].as_str().and_then(|s| s.parse::<u64>().ok());
        let recorded_crc = meta["crc32"].as_str().and_then(|s| u32::from_str_radix(s, 16).ok());
        let mut entries = std::collections::HashMap::new();
        let mut end = 0u64;
        for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
            let offsets =
                info["data_offsets"].as_array().and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)));
            let Some((a, b)) = offsets.filter(|(a, b)| a <= b && (b - a) % 4 == 0 && info["dtype"] == "F32") else {
                return Err(fail(format!("is unusable (tensor {name} is not an f32 range)")));
            };
            end = end.max(b);
            entries.insert(name.clone(), (8 + n + a, ((b - a) / 4) as usize));
        }
        if 8 + n + end != size {
            return Err(fail(format!(
                "is unusable (it holds {size} bytes where its header describes {})",
                8 + n + end
            )));
        }
        if recorded_step != Some(step) || recorded_crc != Some(crc32) {
            return Err(fail(format!(
                "holds step {recorded_step:?} with checksum {recorded_crc:x?}, not step {step} with {crc32:08x}"
            )));
        }
        let reader = SliceReader { file, path: path.clone(), entries };
        let have = reader.checksum().map_err(|e| fail(format!("is unusable ({e})")))?;
        if have != crc32 {
            return Err(fail(format!("is unusable (checksum {have:08x} does not match the recorded {crc32:08x})")));
        }
        Ok(reader)
    }

    /// The checksum of its tensors, in checkpoint order, read a few MiB at a time.
    fn checksum(&self) -> Result<u32> {
        use std::os::unix::fs::FileExt;
        let mut names: Vec<&String> = self.entries.keys().collect();
        names.sort_by_key(|n| checkpoint::tensor_order(n));
        let mut h = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 4 << 20];
        for name in names {
            let (at, len) = self.entries[name];
            h.update(name.as_bytes());
            let mut done = 0u64;
            while done < 4 * len as u64 {
                let take = (4 * len as u64 - done).min(buf.len() as u64) as usize;
                self.file
                    .read_exact_at(&mut buf[..take], at + done)
                    .map_err(|e| Error::io(format!("reading {}", self.path.display()), e))?;
                h.update(&buf[..take]);
                done += take as u64;
            }
        }
        Ok(h.finalize())
    }

    /// The length of tensor `name`, if the slice has it.
    pub fn len_of(&self, name: &str) -> Option<usize> {
        self.entries.get(name).map(|e| e.1)
    }

    /// Tensor `name`'s values, if the slice has it.
    pub fn read(&self, name: &str) -> Result<Option<Vec<f32>>> {
        use std::os::unix::fs::FileExt;
        let Some(&(at, len)) = self.entries.get(name) else { return Ok(None) };
        let mut v = vec![0f32; len];
        self.file
            .read_exact_at(bytemuck::cast_slice_mut(&mut v), at)
            .map_err(|e| Error::io(format!("reading {name} from {}", self.path.display()), e))?;
        Ok(Some(v))
    }
}

/// Opens every slice the manifest of `step` with `checksums` names under `base` ([`slice_dir`]), each checked
/// (size at most `max_bytes`, header, step and checksum) before anything is read from it.
pub fn open_slices(base: &Path, step: u64, checksums: &[u32], max_bytes: u64) -> Result<Vec<SliceReader>> {
    let count = checksums.len() as u32;
    checksums
        .iter()
        .enumerate()
        .map(|(i, &crc)| {
            SliceReader::open(&slice_dir(base, i as u32), step, SliceId { index: i as u32, count }, crc, max_bytes)
        })
        .collect()
}

/// A tensor's whole values from its parts in the slices, in slice order (empty when no slice has it).
pub fn join_tensor(readers: &[SliceReader], name: &str) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for r in readers {
        if let Some(part) = r.read(name)? {
            out.extend_from_slice(&part);
        }
    }
    Ok(out)
}

/// The manifest at `path`, bounded and parsed.
pub fn read_manifest(path: &Path) -> Result<Manifest> {
    let size = fs::metadata(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?.len();
    Error::check_limit(|| format!("manifest {}", path.display()), size, MAX_MANIFEST_BYTES)?;
    let text = fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&text).map_err(|e| {
        Error::Protocol(format!("manifest {} is unusable: {e}; delete it to resume from an older one", path.display()))
    })
}

/// Whether `path` names a manifest (rather than a one-file checkpoint).
pub fn is_manifest(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(MANIFEST_SUFFIX))
}

/// The whole state a sliced checkpoint holds, its slices joined: the manifest at `path` and its tensors, in
/// checkpoint order. The slices are found beside the manifest as the coordinator lays them out ([`slice_dir`]),
/// each checked before it is read and all of them together at most `max_bytes`.
pub fn read_joined(path: &Path, max_bytes: u64) -> Result<(Manifest, Tensors)> {
    let manifest = read_manifest(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let readers = open_slices(base, manifest.step, &manifest.slices, max_bytes)?;
    let mut names: Vec<String> = readers.iter().flat_map(|r| r.entries.keys().cloned()).collect();
    names.sort_by_key(|n| checkpoint::tensor_order(n));
    names.dedup();
    let total: u64 = readers.iter().map(|r| r.entries.values().map(|e| 4 * e.1 as u64).sum::<u64>()).sum();
    Error::check_limit(|| format!("checkpoint {} (its slices' values)", path.display()), total, max_bytes)?;
    let tensors = names.into_iter().map(|n| join_tensor(&readers, &n).map(|v| (n, v))).collect::<Result<_>>()?;
    Ok((manifest, tensors))
}

/// Any checkpoint the appliance writes, read whole with what it records: a one-file checkpoint, or a sliced one
/// named by its manifest (its slices joined, [`read_joined`]); at most `max_bytes` of state either way.
pub fn read_checkpoint(path: &Path, max_bytes: u64) -> Result<(checkpoint::Info, Tensors)> {
    if !is_manifest(path) {
        return checkpoint::read_with_info(path, max_bytes);
    }
    let (m, tensors) = read_joined(path, max_bytes)?;
    let info = checkpoint::Info { step: m.step, job: Some(m.job), uid: m.uid, model: m.model, seed: Some(m.seed) };
    Ok((info, tensors))
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
    super::checkpoint::list_steps(dir, MANIFEST_SUFFIX)
}

/// The newest manifest in `dir` of the job of `uid` (manifests of another job's uid are passed over with a
/// warning). Its slices may number more or fewer than the job's servers now: they are cut again on reading.
pub fn latest(dir: &Path, uid: Option<&str>) -> Result<Option<(Manifest, PathBuf)>> {
    for (_, path) in list(dir)? {
        let manifest = read_manifest(&path)?;
        if let (Some(ours), Some(theirs)) = (uid, manifest.uid.as_deref())
            && ours != theirs
        {
            tracing::warn!(path = %path.display(), owner = %theirs, "a checkpoint of another job (uid) is not resumed");
            continue;
        }
        if manifest.slices.is_empty() || manifest.slices.len() > crds::MAX_SERVERS as usize {
            return Err(Error::Protocol(format!(
                "manifest {} names {} slices; delete it to resume from an older one",
                path.display(),
                manifest.slices.len()
            )));
        }
        return Ok(Some((manifest, path)));
    }
    Ok(None)
}
