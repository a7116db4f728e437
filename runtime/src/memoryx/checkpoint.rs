//! Checkpoints of MemoryX: every weight and optimizer moment in a `safetensors` file named by its step, with
//! the step and a CRC-32 of the tensor data in the file's metadata. A checkpoint is written to a temporary
//! file, flushed and renamed into place, so a crash leaves either the old set or the new one, never half a file;
//! a file whose checksum does not match is passed over for the one before it. The driver's checkpoints also
//! record the job's `spec.model` and seed ([`Owner`]), so a checkpoint handed back to the user says what it
//! holds (`wsctl export`); files written before that are read as before, without them.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use errors::{Error, Result};

/// MemoryX's whole state as named tensors, for checkpoints.
pub type Tensors = Vec<(String, Vec<f32>)>;

/// What a checkpoint keeps of each layer, in the order it writes them: the weights, the bias, and the
/// optimizer's two moments of each. One list, so a snapshot, its restore and the checksum order agree.
pub const KINDS: [&str; 6] = ["weight", "bias", "weight.m", "weight.v", "bias.m", "bias.v"];

/// The name of layer `layer`'s tensor of kind `kind` (one of [`KINDS`]) in a checkpoint.
pub fn tensor_name(layer: usize, kind: &str) -> String {
    format!("layer.{layer}.{kind}")
}

const PREFIX: &str = "step-";
/// Bytes an older checkpoint of the same state may exceed the one just written by when retention reads it back:
/// room for longer metadata (a longer step number, a uid), nothing like another tensor.
const PRUNE_SLACK: u64 = 64 << 10;
const SUFFIX: &str = ".safetensors";

/// What to do when a checkpoint write failed because the volume is full (nothing otherwise): the last complete
/// checkpoint is kept either way.
pub fn full_volume_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::StorageFull {
        "; the checkpoint volume is full: raise spec.checkpoint.volumeSize or lower spec.checkpoint.keep (the last complete checkpoint is kept)"
    } else {
        ""
    }
}

/// The file a checkpoint of `step` lives in.
pub fn path_for(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{step:08}{SUFFIX}"))
}

/// The checksum a checkpoint records of its tensors (names and values, in order).
pub fn checksum(tensors: &Tensors) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for (name, values) in tensors {
        h.update(name.as_bytes());
        // Whole slices at a time: fed four bytes at a time, the hasher never reaches its vectorised path and
        // checksumming a checkpoint cost a percent of a training run. The bytes are the values' little-endian
        // encoding either way.
        if cfg!(target_endian = "little") {
            h.update(bytemuck::cast_slice(values));
        } else {
            values.iter().for_each(|v| h.update(&v.to_le_bytes()));
        }
    }
    h.finalize()
}

/// The bytes of a checkpoint file: the tensors as safetensors, with the job, the step and a checksum in the
/// metadata. Also what a pipelined engine's replica travels as.
pub fn to_bytes(step: u64, tensors: &Tensors, job: &str) -> Result<Vec<u8>> {
    encode(step, tensors, &Owner { job, uid: None, model: None })
}

/// Whose state a checkpoint holds, as recorded in its metadata: the job's name, the uid of its TrainingJob
/// (so a restore can tell its checkpoints from another job's) and its model (so an export knows the layout
/// and can refuse a checkpoint of the wrong kind of model without guessing from tensor shapes).
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    /// The job's name on the wire.
    pub job: &'a str,
    /// The TrainingJob's uid, when it has one (in a cluster).
    pub uid: Option<&'a str>,
    /// The job's `spec.model` and `spec.training.seed` (the seed draws a sparse model's masks, which the
    /// checkpoint does not store), when known.
    pub model: Option<(&'a crds::ModelSpec, u64)>,
}

/// Metadata key of the model spec (JSON of [`crds::ModelSpec`]).
pub const MODEL_KEY: &str = "model";
/// Metadata key of the seed the model's masks were drawn from.
pub const SEED_KEY: &str = "seed";

/// Metadata key of the checksum over the rest of the metadata (the step, job, uid, model, seed and the tensors'
/// checksum): a step changed on disk would otherwise resume the run at another step. Checkpoints written before
/// it was recorded are read without it.
const META_CRC_KEY: &str = "meta_crc32";

/// The checksum of `metadata` but its own entry: every other key and value, in key order.
fn metadata_checksum(metadata: &HashMap<String, String>) -> String {
    let mut entries: Vec<(&String, &String)> = metadata.iter().filter(|(k, _)| *k != META_CRC_KEY).collect();
    entries.sort();
    let mut h = crc32fast::Hasher::new();
    for (k, v) in entries {
        for part in [k.as_bytes(), &[0], v.as_bytes(), &[0]] {
            h.update(part);
        }
    }
    format!("{:08x}", h.finalize())
}

/// [`to_bytes`], recording also who the state belongs to.
pub fn encode(step: u64, tensors: &Tensors, owner: &Owner<'_>) -> Result<Vec<u8>> {
    let (job, uid) = (owner.job, owner.uid);
    let bytes: Vec<(String, Vec<u8>)> =
        tensors.iter().map(|(n, v)| (n.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views = bytes
        .iter()
        .zip(tensors)
        .map(|((name, data), (_, values))| {
            TensorView::new(Dtype::F32, vec![values.len()], data)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Protocol(format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut metadata = HashMap::from([
        ("format".to_string(), "weightstream/v1alpha1".to_string()),
        ("job".to_string(), job.to_string()),
        ("step".to_string(), step.to_string()),
        ("crc32".to_string(), format!("{:08x}", checksum(tensors))),
    ]);
    if let Some(uid) = uid {
        metadata.insert("uid".to_string(), uid.to_string());
    }
    if let Some((model, seed)) = owner.model {
        let json =
            serde_json::to_string(model).map_err(|e| Error::Protocol(format!("recording the model spec: {e}")))?;
        metadata.insert(MODEL_KEY.to_string(), json);
        metadata.insert(SEED_KEY.to_string(), seed.to_string());
    }
    metadata.insert(META_CRC_KEY.to_string(), metadata_checksum(&metadata));
    safetensors::tensor::serialize(views, Some(metadata))
        .map_err(|e| Error::Protocol(format!("serialising checkpoint: {e}")))
}

/// Writes a checkpoint of `step` into `dir` atomically and keeps only the newest `keep` *readable* ones.
/// Returns its path.
///
/// Nothing already written is lost: the file goes to a temporary name first (removed again if the write fails,
/// a full disk above all, so no stale temp file is left to fill the volume), then is renamed into place; only
/// then are older checkpoints pruned, and a damaged one is deleted only when `keep` good ones newer than it
/// exist, so retention never leaves fewer good checkpoints than it found.
pub fn write(dir: &Path, step: u64, tensors: &Tensors, job: &str, keep: usize) -> Result<PathBuf> {
    write_for(dir, step, tensors, job, None, keep)
}

/// [`write`] for the TrainingJob of `uid`, so a restore can tell its checkpoints from another job's.
pub fn write_for(
    dir: &Path,
    step: u64,
    tensors: &Tensors,
    job: &str,
    uid: Option<&str>,
    keep: usize,
) -> Result<PathBuf> {
    write_owned(dir, step, tensors, &Owner { job, uid, model: None }, keep)
}

/// [`write`] recording everything [`Owner`] knows: what the driver writes, so a checkpoint handed back to the
/// user says which model it holds.
pub fn write_owned(dir: &Path, step: u64, tensors: &Tensors, owner: &Owner<'_>, keep: usize) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating checkpoint directory {}", dir.display()), e))?;
    remove_stale_temp_files(dir);
    let data = encode(step, tensors, owner)?;
    let path = path_for(dir, step);
    let tmp = dir.join(format!(".{PREFIX}{step:08}{SUFFIX}.tmp"));
    let written = fs::File::create(&tmp)
        .and_then(|mut file| file.write_all(&data).and_then(|()| file.sync_all()))
        .and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(format!("writing checkpoint {}{}", path.display(), full_volume_hint(&e)), e));
    }
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    // Older checkpoints of this job hold the same tensors; only their metadata (step, uid) may differ in length.
    prune(dir, keep.max(1), &path, data.len() as u64 + PRUNE_SLACK)?;
    Ok(path)
}

/// Keeps the newest `keep` readable checkpoints; older files go, readable or not, but a damaged file newer than
/// the `keep`-th good one stays (it may be a write still being checked by a reader, and costs only space).
/// `fresh` was just written and synced from memory, so it counts as good without being read back; each older
/// one is verified only while fewer than `keep` good ones have been found.
/// Files larger than `max_bytes` are not read (nor counted as good).
fn prune(dir: &Path, keep: usize, fresh: &Path, max_bytes: u64) -> Result<()> {
    let mut good = 0;
    for (_, path) in list(dir)? {
        if good >= keep {
            let _ = fs::remove_file(&path);
        } else if path == fresh || read(&path, max_bytes).is_ok() {
            good += 1;
        }
    }
    Ok(())
}

/// Removes temporary files a crashed or failed write left behind (a write in progress is never concurrent with
/// this: one MemoryX writes a directory).
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(".tmp") {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Checkpoint files in `dir`, newest first.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    list_steps(dir, SUFFIX)
}

/// Files in `dir` named `step-<N><suffix>`, with their step, newest first: one-file checkpoints and sliced
/// checkpoints' manifests are found the same way. A missing folder holds none.
pub(crate) fn list_steps(dir: &Path, suffix: &str) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix(PREFIX)?.strip_suffix(suffix)?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found)
}

/// Reads one checkpoint of at most `max_bytes` (the plan's [`plan::limits::Limits::state_bytes`]), verifying its
/// checksum. A larger file is refused by its size on disk, before any of it is read.
pub fn read(path: &Path, max_bytes: u64) -> Result<(u64, Tensors)> {
    let bytes = read_bounded(path, max_bytes)?;
    from_bytes(&bytes, &format!("checkpoint {}", path.display()))
}

/// The bytes of the file at `path`, refused when its size is beyond `max_bytes` before any of it is read; the
/// read itself stops past `max_bytes` too, so a file growing meanwhile is refused as well.
fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let context = || format!("reading {}", path.display());
    let file = fs::File::open(path).map_err(|e| Error::io(context(), e))?;
    let size = file.metadata().map_err(|e| Error::io(context(), e))?.len();
    let what = || format!("checkpoint {} (bytes on disk)", path.display());
    Error::check_limit(what, size, max_bytes)?;
    let mut bytes = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, max_bytes.saturating_add(1)), &mut bytes)
        .map_err(|e| Error::io(context(), e))?;
    Error::check_limit(what, bytes.len() as u64, max_bytes)?;
    Ok(bytes)
}

/// Parses the bytes of a checkpoint file (`what` names them in errors), verifying the checksum.
pub fn from_bytes(bytes: &[u8], what: &str) -> Result<(u64, Tensors)> {
    decode(bytes, what).map(|(step, tensors, _)| (step, tensors))
}

/// What a checkpoint's metadata says beyond its tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Info {
    /// The step it was taken after.
    pub step: u64,
    /// The job's name.
    pub job: Option<String>,
    /// The TrainingJob's uid, when recorded.
    pub uid: Option<String>,
    /// The model spec, when recorded (checkpoints written before it was are read without it).
    pub model: Option<crds::ModelSpec>,
    /// The seed the model's masks were drawn from, when recorded.
    pub seed: Option<u64>,
}

/// [`read`] with the checkpoint's [`Info`]: what an export needs to know the model's layout.
pub fn read_with_info(path: &Path, max_bytes: u64) -> Result<(Info, Tensors)> {
    let bytes = read_bounded(path, max_bytes)?;
    from_bytes_with_info(&bytes, &format!("checkpoint {}", path.display()))
}

/// [`from_bytes`] with the checkpoint's [`Info`].
pub fn from_bytes_with_info(bytes: &[u8], what: &str) -> Result<(Info, Tensors)> {
    let (step, tensors, _) = decode(bytes, what)?;
    let (_, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| Error::Protocol(format!("{what} is unusable: {e}")))?;
    let info = meta.metadata().clone().unwrap_or_default();
    let model = match info.get(MODEL_KEY) {
        Some(json) => Some(
            serde_json::from_str(json)
                .map_err(|e| Error::Protocol(format!("{what} records a model spec this version cannot read: {e}")))?,
        ),
        None => None,
    };
    Ok((
        Info {
            step,
            job: info.get("job").cloned(),
            uid: info.get("uid").cloned(),
            model,
            seed: info.get(SEED_KEY).and_then(|s| s.parse().ok()),
        },
        tensors,
    ))
}

/// [`from_bytes`], with the uid of the TrainingJob the checkpoint belongs to, when it records one.
fn decode(bytes: &[u8], what: &str) -> Result<(u64, Tensors, Option<String>)> {
    let bad = |why: String| Error::Protocol(format!("{what} is unusable: {why}"));
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
    let info = meta.metadata().clone().unwrap_or_default();
    if let Some(want) = info.get(META_CRC_KEY).filter(|&want| *want != metadata_checksum(&info)) {
        return Err(bad(format!("its metadata (step, job, model) does not match its checksum {want}")));
    }
    let step: u64 =
        info.get("step").and_then(|s| s.parse().ok()).ok_or_else(|| bad("no step in its metadata".into()))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
    names.sort_by_key(|n| tensor_order(n));
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let view = st.tensor(&name).map_err(|e| bad(e.to_string()))?;
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!("tensor {name} is not f32")));
        }
        let values = view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        tensors.push((name, values));
    }
    let want = info.get("crc32").cloned().unwrap_or_default();
    let have = format!("{:08x}", checksum(&tensors));
    if want != have {
        return Err(bad(format!("checksum {have} does not match the recorded {want}")));
    }
    Ok((step, tensors, info.get("uid").cloned()))
}

/// The order tensors were written in (layer, then kind), so the checksum is computed over the same sequence.
pub fn tensor_order(name: &str) -> (usize, usize) {
    let mut parts = name.splitn(3, '.');
    let layer = parts.nth(1).and_then(|l| l.parse().ok()).unwrap_or(usize::MAX);
    let kind = KINDS.iter().position(|k| name.ends_with(&format!(".{layer}.{k}"))).unwrap_or(usize::MAX);
    (layer, kind)
}

/// The newest readable checkpoint in `dir` of at most `max_bytes`, passing over damaged (or larger) ones with a
/// warning.
pub fn latest(dir: &Path, max_bytes: u64) -> Result<Option<(u64, Tensors, PathBuf)>> {
    latest_for(dir, None, max_bytes)
}

/// The newest readable checkpoint in `dir` of the TrainingJob of `uid`: one recording another job's uid (a job
/// deleted and recreated under the same name, whose volume survived) is passed over with a warning, so a new
/// job never resumes an old one's weights. Checkpoints without a uid (local runs) belong to anyone. A file
/// larger than `max_bytes` (the plan's state size) is passed over by its size, unread.
pub fn latest_for(dir: &Path, uid: Option<&str>, max_bytes: u64) -> Result<Option<(u64, Tensors, PathBuf)>> {
    for (_, path) in list(dir)? {
        let read =
            read_bounded(&path, max_bytes).and_then(|bytes| decode(&bytes, &format!("checkpoint {}", path.display())));
        match read {
            Ok((step, _, Some(theirs))) if uid.is_some_and(|ours| ours != theirs) => {
                tracing::warn!(step, path = %path.display(), owner = %theirs, "a checkpoint of another job (uid) is not resumed");
            }
            Ok((step, tensors, _)) => return Ok(Some((step, tensors, path))),
            Err(e) => tracing::warn!("{e}; trying an older checkpoint"),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Fuzzing the parser (proptest): a checkpoint with any bytes changed, cut or grown reads back as the
        /// tensors written or is refused with a reason; bytes that never were a checkpoint are refused; none panics.
        #[test]
        fn a_changed_checkpoint_reads_as_written_or_is_refused(
            values in proptest::collection::vec(-1e3f32..1e3, 1..64),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in proptest::option::of(any::<prop::sample::Index>()),
            tail in proptest::collection::vec(any::<u8>(), 0..8),
            noise in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let n = values.len();
            let t: Tensors =
                vec![("layer.0.weight".into(), values), ("layer.0.bias".into(), vec![0.5; n.div_ceil(2)])];
            let good = to_bytes(7, &t, "job").unwrap();
            prop_assert_eq!(from_bytes(&good, "it").unwrap(), (7, t.clone()));
            let mut bad = good.clone();
            for (at, x) in &edits {
                let i = at.index(bad.len());
                bad[i] ^= x | 1;
            }
            if let Some(c) = cut {
                bad.truncate(c.index(bad.len()));
            }
            bad.extend(&tail);
            match from_bytes(&bad, "it") {
                Ok(read) => prop_assert_eq!(read, (7, t)),
                Err(e) => prop_assert!(e.to_string().contains("it is unusable"), "{e}"),
            }
            prop_assert!(from_bytes(&noise, "noise").is_err());
        }
    }

    /// The step, job and model a checkpoint records are checked like its tensors: a step changed on disk would
    /// resume the run at another step (found by the fuzzing above: the tensors' checksum alone let it through).
    #[test]
    fn a_checkpoint_whose_recorded_step_changed_is_refused() {
        let t: Tensors = vec![("layer.0.weight".into(), vec![1.0, 2.0])];
        let good = to_bytes(17, &t, "job").unwrap();
        let at = good.windows(6).position(|w| w == b"\"17\"}," || w == b"\"17\",\"").expect("the step");
        let mut bad = good.clone();
        bad[at + 2] = b'3';
        let e = from_bytes(&bad, "it").unwrap_err().to_string();
        assert!(e.contains("metadata") && e.contains("checksum"), "{e}");
        assert_eq!(from_bytes(&good, "it").unwrap(), (17, t));
    }

    #[test]
    fn round_trip_keep_and_corruption() {
        let dir = std::env::temp_dir().join(format!("ws-ckpt-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        let t = |x: f32| -> Tensors {
            vec![
                ("layer.0.weight".into(), vec![x, 2.0]),
                ("layer.0.bias".into(), vec![3.0]),
                ("layer.1.weight".into(), vec![4.0; 10]),
            ]
        };
        for step in 1..=4 {
            write(&dir, step * 10, &t(step as f32), "job", 2).unwrap();
        }
        let files = list(&dir).unwrap();
        assert_eq!(files.iter().map(|f| f.0).collect::<Vec<_>>(), vec![40, 30], "only the newest two are kept");
        let (step, tensors, _) = latest(&dir, 1 << 20).unwrap().unwrap();
        assert_eq!((step, tensors), (40, t(4.0)));
        // Flip a byte of the newest: it is passed over for the older one.
        let mut bytes = fs::read(&files[0].1).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        fs::write(&files[0].1, bytes).unwrap();
        assert!(read(&files[0].1, 1 << 20).unwrap_err().to_string().contains("checksum"));
        assert_eq!(latest(&dir, 1 << 20).unwrap().unwrap().0, 30);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_checkpoint_records_its_model_and_old_ones_read_without_it() {
        let dir = std::env::temp_dir().join(format!("ws-ckpt-model-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        let t: Tensors = vec![("layer.0.weight".into(), vec![1.0; 4])];
        let model = crds::ModelSpec {
            kind: crds::ModelKind::Gpt,
            width: Some(8),
            heads: Some(2),
            ..crds::ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, 0.0)
        };
        let owner = Owner { job: "j", uid: Some("u"), model: Some((&model, 42)) };
        let path = write_owned(&dir, 10, &t, &owner, 5).unwrap();
        let (info, tensors) = read_with_info(&path, 1 << 20).unwrap();
        assert_eq!(tensors, t);
        assert_eq!(
            info,
            Info { step: 10, job: Some("j".into()), uid: Some("u".into()), model: Some(model), seed: Some(42) }
        );
        assert_eq!(latest_for(&dir, Some("u"), 1 << 20).unwrap().unwrap().0, 10, "resumable as before");
        // A checkpoint written before the model was recorded still reads, without one.
        let old = write(&dir, 20, &t, "j", 5).unwrap();
        let (info, _) = read_with_info(&old, 1 << 20).unwrap();
        assert_eq!((info.step, info.model, info.seed), (20, None, None));
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_job_resumes_only_its_own_checkpoints() {
        let dir = std::env::temp_dir().join(format!("ws-ckpt-owner-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        let t = |x: f32| -> Tensors { vec![("layer.0.weight".into(), vec![x; 4])] };
        write_for(&dir, 10, &t(1.0), "j", Some("uid-old"), 5).unwrap();
        assert!(latest_for(&dir, Some("uid-new"), 1 << 20).unwrap().is_none(), "a recreated job starts afresh");
        assert_eq!(latest_for(&dir, Some("uid-old"), 1 << 20).unwrap().unwrap().0, 10);
        assert_eq!(latest_for(&dir, None, 1 << 20).unwrap().unwrap().0, 10, "a run without a uid takes any");
        write(&dir, 5, &t(0.5), "j", 5).unwrap();
        assert_eq!(
            latest_for(&dir, Some("uid-new"), 1 << 20).unwrap().unwrap().0,
            5,
            "one without a uid belongs to anyone"
        );
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn retention_counts_readable_checkpoints_and_stale_temp_files_go() {
        let dir = std::env::temp_dir().join(format!("ws-ckpt-keep-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        let t = |x: f32| -> Tensors { vec![("layer.0.weight".into(), vec![x; 4])] };
        write(&dir, 10, &t(1.0), "job", 2).unwrap();
        write(&dir, 20, &t(2.0), "job", 2).unwrap();
        // Step 20's file is damaged (a disk error): the good step 10 must survive until two good checkpoints
        // newer than it exist, or a crash now would leave one good checkpoint where two were promised.
        let p20 = path_for(&dir, 20);
        let mut bytes = fs::read(&p20).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        fs::write(&p20, bytes).unwrap();
        fs::write(dir.join(".step-00000025.safetensors.tmp"), b"half a file").unwrap();
        write(&dir, 30, &t(3.0), "job", 2).unwrap();
        let steps: Vec<u64> = list(&dir).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(steps, vec![30, 20, 10], "good 30 and 10 kept; damaged 20 not yet pruned");
        assert!(!dir.join(".step-00000025.safetensors.tmp").exists(), "the stale temp file is gone");
        write(&dir, 40, &t(4.0), "job", 2).unwrap();
        let steps: Vec<u64> = list(&dir).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(steps, vec![40, 30], "two good ones newer than the damaged one: it goes, and so does 10");
        assert_eq!(latest(&dir, 1 << 20).unwrap().unwrap().0, 40);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_checkpoint_beyond_the_plan_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("ws-ckpt-big-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        let t = |x: f32| -> Tensors { vec![("layer.0.weight".into(), vec![x; 4])] };
        let good = write(&dir, 10, &t(1.0), "job", 5).unwrap();
        let limit = fs::metadata(&good).unwrap().len();
        // A newer file far larger than the state (sparse on disk: its size is what is checked, not its content).
        let big = path_for(&dir, 20);
        fs::File::create(&big).unwrap().set_len(1 << 40).unwrap();
        match read(&big, limit).unwrap_err() {
            Error::OverLimit { what, value, limit: l } => {
                assert!(what.contains("step-00000020.safetensors"), "{what}");
                assert_eq!((value, l), (1 << 40, limit));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(latest(&dir, limit).unwrap().unwrap().0, 10, "passed over for the good one");
        // A file within the size whose header claims an absurd shape.
        let header = br#"{"layer.0.weight":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}}"#;
        let mut absurd = (header.len() as u64).to_le_bytes().to_vec();
        absurd.extend_from_slice(header);
        absurd.extend_from_slice(&[0u8; 16]);
        fs::write(&big, &absurd).unwrap();
        assert!(read(&big, limit).unwrap_err().to_string().contains("unusable"));
        fs::remove_dir_all(&dir).ok();
    }
}
