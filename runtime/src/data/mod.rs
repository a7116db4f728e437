//! Training data: readers for the data sets a job can name, and the seeded order in which samples are dealt
//! into batches and the batches into per-engine shards.

pub mod mnist;
pub mod text;

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::engine::Shard;
use crate::error::{Error, Result};
use crate::tensor::Mat;

/// One split of a job's data, as the engines read their shards from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Dataset {
    /// Labelled images (MNIST).
    Images(Images),
    /// Windows of a byte-level text corpus.
    Text(text::TextWindows),
}

impl Dataset {
    /// Number of samples (images, or windows of text).
    pub fn len(&self) -> usize {
        match self {
            Dataset::Images(d) => d.len(),
            Dataset::Text(d) => d.len(),
        }
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples an evaluation reads: every image, or for text up to [`text::EVAL_TOKENS`] tokens of
    /// windows spread evenly over the held-out part, so evaluating a large model stays a small share of a run.
    pub fn eval_samples(&self) -> Vec<u32> {
        match self {
            Dataset::Images(d) => (0..d.len() as u32).collect(),
            Dataset::Text(d) => {
                let (len, want) = (d.len(), (text::EVAL_TOKENS / d.context.max(1)).max(1));
                if len <= want {
                    (0..len as u32).collect()
                } else {
                    (0..want).map(|i| (i * len / want) as u32).collect()
                }
            }
        }
    }

    /// The shard of `indices` as the engine holds it.
    pub fn shard(&self, indices: &[u32]) -> Shard {
        match self {
            Dataset::Images(d) => d.shard(indices),
            Dataset::Text(d) => d.shard(indices),
        }
    }
}

/// The most bytes a data file may hold, compressed or not: data sets live in memory, so more is refused before
/// it is read rather than found out by the kernel's OOM killer (or never, for `/dev/zero`).
pub const MAX_DATA_BYTES: u64 = 2 << 30;

/// Reads a data file whole: a regular file (not a device, a FIFO or a folder) of at most [`MAX_DATA_BYTES`],
/// gunzipped when its name ends in `.gz` (and the gunzipped bytes bounded alike, so a gzip bomb stops early).
pub fn read_data_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::Data(format!("cannot open {} ({e}); check spec.data.path", path.display()))
    })?;
    if !meta.is_file() {
        return Err(Error::Data(format!(
            "{} is not a regular file; point spec.data.path at a data file (or, for mnist, a folder of them)",
            path.display()
        )));
    }
    let too_big = || {
        Error::Data(format!(
            "{} holds more than {} bytes, the most a data file may hold; split or subsample it",
            path.display(),
            MAX_DATA_BYTES
        ))
    };
    if meta.len() > MAX_DATA_BYTES {
        return Err(too_big());
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut bytes = Vec::new();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(file)
            .take(MAX_DATA_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::Data(format!("{} is not a complete gzip file ({e}); copy it again", path.display())))?;
    } else {
        std::io::BufReader::new(file)
            .take(MAX_DATA_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    }
    if bytes.len() as u64 > MAX_DATA_BYTES {
        return Err(too_big());
    }
    Ok(bytes)
}

/// What can be said of a job's data path without reading it: a path that exists must be what the data kind
/// reads (a regular file for text, a folder for MNIST). A path that does not exist here passes, since the job
/// may run where it does (a cluster's volume); loading it says so there.
pub fn check_path(spec: &crds::TrainingJobSpec) -> Result<()> {
    if spec.data.volume.is_some() {
        // Inside a volume: only the input workers, where it is mounted, can tell.
        return Ok(());
    }
    let path = Path::new(&spec.data.path);
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    let (ok, want) = match spec.data.kind {
        crds::DataKind::Mnist => (meta.is_dir(), "a folder of MNIST IDX files"),
        crds::DataKind::Arrays => (true, "a safetensors file or a folder of .npy files"),
        _ => (meta.is_file(), "a regular file"),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Data(format!("spec.data.path {} is not {want}", path.display())))
    }
}

/// Where a path of `spec.data` (`path`, `heldOutPath`, `tokenizer`) is read from. Without a volume it is a plain
/// path. With one, it is taken inside `root`, the folder the volume is mounted at (in a pod,
/// [`crds::contract::DATA_MOUNT`]; locally, `wsctl run --volume CLAIM=DIR`), and refused when it would leave it:
/// an absolute path, a `..`, or a symbolic link pointing out of the volume.
pub fn resolve(spec: &crds::TrainingJobSpec, root: Option<&Path>, path: &str) -> Result<std::path::PathBuf> {
    let Some(claim) = &spec.data.volume else { return Ok(Path::new(path).to_path_buf()) };
    let root = root.ok_or_else(|| {
        Error::Data(format!(
            "spec.data.volume names the claim '{claim}' but no volume is mounted here; locally, run with \
             `--volume {claim}=DIR` (the folder holding the claim's files)"
        ))
    })?;
    if crds::escapes(path) {
        return Err(Error::Data(format!(
            "spec.data path '{path}' leaves the volume '{claim}'; give a path relative to the volume's root, without '..'"
        )));
    }
    let root = root.canonicalize().map_err(|e| {
        Error::Data(format!("the volume '{claim}' mounted at {} cannot be read ({e}); check the claim", root.display()))
    })?;
    let joined = root.join(path);
    // A link inside the volume may point anywhere: what counts is where the path really leads.
    match joined.canonicalize() {
        Ok(real) if !real.starts_with(&root) => Err(Error::Data(format!(
            "spec.data path '{path}' leads out of the volume '{claim}' (through a symbolic link, to {}); copy the data into the volume",
            real.display()
        ))),
        Ok(real) => Ok(real),
        Err(e) => Err(Error::Data(format!(
            "cannot open '{path}' in the volume '{claim}' ({e}); check spec.data.path against the claim's files"
        ))),
    }
}

/// Loads the training and held-out splits a job names, its paths resolved by [`resolve`] against `root`. Input
/// workers call this (engines and MemoryX never open data files), so every worker agrees on what sample `i` is.
pub fn load(spec: &crds::TrainingJobSpec, root: Option<&Path>) -> Result<(Dataset, Dataset)> {
    let path = resolve(spec, root, &spec.data.path)?;
    let path = path.as_path();
    match spec.data.kind {
        crds::DataKind::Mnist => Ok((
            Dataset::Images(mnist::load(path, mnist::Split::Train)?),
            Dataset::Images(mnist::load(path, mnist::Split::Test)?),
        )),
        crds::DataKind::Text => {
            let context = spec.model.context_length.unwrap_or(0) as usize;
            let (train, test) = text::load(path, context)?;
            Ok((Dataset::Text(train), Dataset::Text(test)))
        }
        kind => Err(Error::Data(format!("spec.data.kind {kind:?} is not read yet"))),
    }
}

/// Labelled examples with their features as bytes, turned into engine activations on demand.
#[derive(Clone, Debug, PartialEq)]
pub struct Images {
    /// Features per sample.
    pub features: usize,
    /// Sample-major feature bytes (`samples × features`).
    pub pixels: Vec<u8>,
    /// One class per sample.
    pub labels: Vec<u8>,
}

impl Images {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shard of `indices` as the engine holds it: features first, scaled to MNIST's usual zero mean and
    /// unit variance.
    pub fn shard(&self, indices: &[u32]) -> Shard {
        const MEAN: f32 = 0.1307;
        const STD: f32 = 0.3081;
        let n = indices.len();
        let normalised: [f32; 256] = std::array::from_fn(|p| (p as f32 / 255.0 - MEAN) / STD);
        let images: Vec<&[u8]> =
            indices.iter().map(|&i| &self.pixels[i as usize * self.features..(i as usize + 1) * self.features]).collect();
        let mut inputs = Mat::zeros(self.features, n);
        // Feature by feature, so the writes run along a row of the features × samples matrix.
        for (f, row) in inputs.data.chunks_exact_mut(n.max(1)).enumerate() {
            for (x, image) in row.iter_mut().zip(&images) {
                *x = normalised[image[f] as usize];
            }
        }
        Shard { inputs, labels: indices.iter().map(|&i| u32::from(self.labels[i as usize])).collect() }
    }
}

/// Deals samples into batches: a fresh seeded permutation every epoch, full batches only.
#[derive(Clone, Debug)]
pub struct Sampler {
    samples: usize,
    batch: usize,
    seed: u64,
}

impl Sampler {
    /// Batches of `batch` from `samples` examples, ordered by `seed`.
    pub fn new(samples: usize, batch: usize, seed: u64) -> Self {
        Sampler { samples, batch, seed }
    }

    /// Full batches per epoch (a trailing partial batch is left out).
    pub fn steps_per_epoch(&self) -> u64 {
        (self.samples / self.batch.max(1)) as u64
    }

    /// The sample indices of global step `step` (0-based).
    pub fn batch(&self, step: u64) -> Vec<u32> {
        let per_epoch = self.steps_per_epoch().max(1);
        let epoch = step / per_epoch;
        let mut order: Vec<u32> = (0..self.samples as u32).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(self.seed.wrapping_add(epoch.wrapping_mul(0x2545_F491))));
        let start = (step % per_epoch) as usize * self.batch;
        order[start..start + self.batch].to_vec()
    }
}

/// Splits `indices` into `parts` contiguous shards whose sizes differ by at most one: engine `i` always takes
/// the `i`-th, so the split depends only on the engine count.
pub fn split_even(indices: &[u32], parts: usize) -> Vec<&[u32]> {
    let parts = parts.max(1);
    let (base, extra) = (indices.len() / parts, indices.len() % parts);
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        out.push(&indices[start..start + len]);
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_each_epoch_once_and_repeat_by_seed() {
        let s = Sampler::new(10, 3, 42);
        assert_eq!(s.steps_per_epoch(), 3);
        let mut seen: Vec<u32> = (0..3).flat_map(|k| s.batch(k)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 9, "one epoch draws distinct samples");
        assert_eq!(s.batch(4), Sampler::new(10, 3, 42).batch(4));
        assert_ne!(s.batch(0), s.batch(3), "a new epoch reshuffles");
    }

    #[test]
    fn shards_are_even() {
        let idx: Vec<u32> = (0..10).collect();
        let parts = split_even(&idx, 4);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
        assert_eq!(parts.concat(), idx);
    }
}
