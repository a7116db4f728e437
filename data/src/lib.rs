//! Training data: readers for the data sets a job can name, and the seeded order in which samples are dealt
//! into batches and the batches into per-engine shards ([`shard::Shard`]). Input workers load it; engines and
//! MemoryX never open a data file.
#![warn(missing_docs)]

pub mod array;
pub mod arrays;
pub mod file;
pub mod images;
pub mod jsonl;
pub mod mnist;
pub mod npy;
pub mod shard;
pub mod text;
pub mod tokenizer;
pub mod tokens;

use std::path::Path;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use errors::{Error, Result};
use images::Images;
use shard::Shard;

/// One split of a job's data, as the engines read their shards from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Dataset {
    /// Labelled images (MNIST).
    Images(Images),
    /// Windows of a text corpus's token ids (bytes, a tokenizer's ids, or a token file's).
    Text(text::TextWindows),
    /// Named arrays of features and classes (`arrays`), for MLPs of any width.
    Arrays(arrays::Arrays),
}

impl Dataset {
    /// Number of samples (images, or windows of text).
    pub fn len(&self) -> usize {
        match self {
            Dataset::Images(d) => d.len(),
            Dataset::Text(d) => d.len(),
            Dataset::Arrays(d) => d.len(),
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
            Dataset::Arrays(d) => (0..d.len() as u32).collect(),
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
            Dataset::Arrays(d) => d.shard(indices),
        }
    }

    /// The held-out loss of the best context-free model, called on the held-out split with the training split:
    /// the bar a language model must clear (see [`text::TextWindows::unigram_loss`]). `None` for data that is
    /// not language (or splits of different kinds).
    pub fn unigram_loss(&self, train: &Dataset) -> Option<f64> {
        match (self, train) {
            (Dataset::Text(test), Dataset::Text(train)) => Some(test.unigram_loss(train)),
            _ => None,
        }
    }
}

/// What can be said of a job's data paths without reading them: a path that exists must be what the data kind
/// reads (a regular file for text, tokens and JSON Lines, a folder for MNIST, a safetensors file or a folder of
/// `.npy` files for arrays) and a tokenizer a regular file. A path that does not exist here passes, since the
/// job may run where it does (a cluster's volume); loading it says so there.
pub fn check_path(spec: &crds::TrainingJobSpec) -> Result<()> {
    if spec.data.volume.is_some() {
        // Inside a volume: only the input workers, where it is mounted, can tell.
        return Ok(());
    }
    let data = [("spec.data.path", Some(&spec.data.path)), ("spec.data.heldOutPath", spec.data.held_out_path.as_ref())];
    for (field, path) in data {
        let Some(path) = path else { continue };
        let path = Path::new(path);
        let Ok(meta) = std::fs::metadata(path) else { continue };
        let (ok, want) = match spec.data.kind {
            crds::DataKind::Mnist => (meta.is_dir(), "a folder of MNIST IDX files"),
            crds::DataKind::Arrays => (meta.is_file() || meta.is_dir(), "a safetensors file or a folder of .npy files"),
            _ => (meta.is_file(), "a regular file"),
        };
        if !ok {
            return Err(Error::Data(format!("{field} {} is not {want}", path.display())));
        }
    }
    if let Some(tokenizer) = &spec.data.tokenizer {
        let path = Path::new(tokenizer);
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            return Err(Error::Data(format!(
                "spec.data.tokenizer {} is not a regular file (a tokenizer.json)",
                path.display()
            )));
        }
    }
    Ok(())
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
/// The held-out split is `spec.data.heldOutPath` when given, else the last 5% of the tokens or samples (for
/// MNIST, its `t10k-` files).
pub fn load(spec: &crds::TrainingJobSpec, root: Option<&Path>) -> Result<(Dataset, Dataset)> {
    let path = resolve(spec, root, &spec.data.path)?;
    let path = path.as_path();
    let held_out = match &spec.data.held_out_path {
        Some(p) if spec.data.kind != crds::DataKind::Mnist => Some(resolve(spec, root, p)?),
        _ => None,
    };
    match spec.data.kind {
        crds::DataKind::Mnist => Ok((
            Dataset::Images(mnist::load(path, mnist::Split::Train)?),
            Dataset::Images(mnist::load(path, mnist::Split::Test)?),
        )),
        crds::DataKind::Text | crds::DataKind::Jsonl | crds::DataKind::Tokens => {
            let (train, test) = load_text(spec, root, path, held_out.as_deref())?;
            Ok((Dataset::Text(train), Dataset::Text(test)))
        }
        crds::DataKind::Arrays => {
            let train = arrays::load(path, spec)?;
            let (train, test) = match &held_out {
                Some(h) => (train, arrays::load(h, spec)?),
                None => train.hold_out_tail(path)?,
            };
            Ok((Dataset::Arrays(train), Dataset::Arrays(test)))
        }
    }
}

/// The token windows of a `text`, `jsonl` or `tokens` job: bytes, a tokenizer's ids, or a token file's ids.
fn load_text(
    spec: &crds::TrainingJobSpec,
    root: Option<&Path>,
    path: &Path,
    held_out: Option<&Path>,
) -> Result<(text::TextWindows, text::TextWindows)> {
    let context = spec.model.context_length.unwrap_or(0) as usize;
    let model_vocab = spec.model.vocab_size as usize;
    let kind = spec.data.kind;
    let tokenizer = match (&spec.data.tokenizer, kind) {
        (Some(t), crds::DataKind::Text | crds::DataKind::Jsonl) => {
            Some(tokenizer::TextTokenizer::load(&resolve(spec, root, t)?, model_vocab)?)
        }
        _ => None,
    };
    let vocab = match (&tokenizer, kind) {
        (Some(t), _) => t.vocab,
        (None, crds::DataKind::Tokens) => model_vocab.min(text::MAX_VOCAB),
        (None, _) => 256,
    };
    let read = |p: &Path| -> Result<text::Tokens> {
        if kind == crds::DataKind::Tokens {
            return Ok(text::Tokens::Ids(tokens::read(p, spec.data.token_type, model_vocab)?));
        }
        let bytes = if kind == crds::DataKind::Jsonl { jsonl::read(p, &spec.data.text_field)? } else { text::read(p)? };
        match &tokenizer {
            Some(t) => Ok(text::Tokens::Ids(t.encode(&bytes, p, model_vocab)?)),
            None => Ok(text::Tokens::Bytes(bytes)),
        }
    };
    let train = read(path)?;
    match held_out {
        None => text::split(train, vocab, context).map_err(|e| Error::Data(format!("{}: {e}", path.display()))),
        Some(h) => text::pair(train, read(h)?, vocab, context)
            .map_err(|e| Error::Data(format!("{} and {}: {e}", path.display(), h.display()))),
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
pub(crate) mod tests {
    use super::*;
    use crate::file::read_data_file;

    fn repo() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The spec of `examples/jobs/NAME`, its data paths taken from the repository's root.
    pub(crate) fn example(name: &str) -> crds::TrainingJobSpec {
        let text = std::fs::read_to_string(repo().join("examples/jobs").join(name)).unwrap();
        let mut spec = crds::parse_training_job(&text).unwrap().spec;
        if spec.data.volume.is_none() {
            spec.data.path = repo().join(&spec.data.path).to_string_lossy().into_owned();
            if let Some(t) = &spec.data.tokenizer {
                spec.data.tokenizer = Some(repo().join(t).to_string_lossy().into_owned());
            }
        }
        spec
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ws-data-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn text_spec(kind: crds::DataKind, path: &Path, context: u32) -> crds::TrainingJobSpec {
        let mut spec = example("gpt-small.yaml");
        spec.model.context_length = Some(context);
        spec.data = crds::DataSpec::local(kind, path.to_string_lossy());
        spec
    }

    fn ids(d: &Dataset) -> Vec<u32> {
        match d {
            Dataset::Text(text::TextWindows { tokens: text::Tokens::Ids(t), .. }) => t.clone(),
            other => panic!("expected token ids, got {other:?}"),
        }
    }

    #[test]
    fn byte_text_of_moby_dick_is_unchanged() {
        let spec = example("gpt-small.yaml");
        let (train, test) = load(&spec, None).unwrap();
        let bytes = read_data_file(Path::new(&spec.data.path)).unwrap();
        let cut = bytes.len() - (bytes.len() as f64 * text::HELD_OUT) as usize;
        let (Dataset::Text(tr), Dataset::Text(te)) = (&train, &test) else { panic!("text") };
        assert_eq!(tr.tokens, text::Tokens::Bytes(bytes[..cut].to_vec()));
        assert_eq!(te.tokens, text::Tokens::Bytes(bytes[cut..].to_vec()));
        assert_eq!((tr.vocab, tr.context), (256, 128));
        let shard = train.shard(&[3, 1000]);
        let expect: Vec<f32> = bytes[384..512].iter().chain(&bytes[128_000..128_128]).map(|&b| f32::from(b)).collect();
        assert_eq!(shard.inputs.data, expect);
        let labels: Vec<u32> = bytes[385..513].iter().chain(&bytes[128_001..128_129]).map(|&b| u32::from(b)).collect();
        assert_eq!(shard.labels, labels);
        // The unigram bar the e2e tests quote for Moby-Dick.
        let u = test.unigram_loss(&train).unwrap();
        assert!((u - 3.156).abs() < 0.001, "{u}");
        assert_eq!(test.eval_samples().len(), text::EVAL_TOKENS / 128);
    }

    #[test]
    fn the_bpe_example_tokenizes_moby_dick() {
        let spec = example("gpt-bpe.yaml");
        assert_eq!(spec.model.vocab_size, 1024);
        let (train, test) = load(&spec, None).unwrap();
        let (tr, te) = (ids(&train), ids(&test));
        assert!(tr.iter().chain(&te).all(|&i| i < 1024));
        let bytes = read_data_file(Path::new(&spec.data.path)).unwrap();
        let n = tr.len() + te.len();
        assert!(n * 2 < bytes.len(), "BPE packs several bytes a token: {n} tokens for {} bytes", bytes.len());
        assert_eq!(te.len(), (n as f64 * text::HELD_OUT) as usize);
        // A held-out loss with a 1024-token table is well above the byte one, and below uniform.
        let u = test.unigram_loss(&train).unwrap();
        assert!(u > 4.0 && u < 1024f64.ln(), "{u}");
        let shard = train.shard(&[2]);
        assert_eq!(shard.inputs.data, tr[256..384].iter().map(|&i| i as f32).collect::<Vec<_>>());
        assert_eq!(shard.labels, tr[257..385].to_vec());
        // The PVC variant reads the same files inside a volume: locally, `--volume weightstream-data=examples/data`.
        let pvc = example("gpt-bpe-pvc.yaml");
        assert_eq!(pvc.data.volume.as_deref(), Some("weightstream-data"));
        let (pvc_train, pvc_test) = load(&pvc, Some(&repo().join("examples/data"))).unwrap();
        assert_eq!((pvc_train, pvc_test), (train.clone(), test.clone()));
        // Too small a model for the tokenizer is one clear error.
        let mut small = spec.clone();
        small.model.vocab_size = 512;
        let err = load(&small, None).unwrap_err().to_string();
        assert!(err.contains("has a vocabulary of 1024; set spec.model.vocabSize to at least 1024"), "{err}");
    }

    #[test]
    fn text_jsonl_and_tokens_round_trip_with_a_held_out_file() {
        let dir = temp("kinds");
        let words = crate::tokenizer::tests::word_level_json();
        std::fs::write(dir.join("tokenizer.json"), &words).unwrap();
        std::fs::write(dir.join("train.txt"), "call me ishmael .\n".repeat(50)).unwrap();
        std::fs::write(dir.join("val.txt"), "whale whale .\n".repeat(5)).unwrap();
        let mut spec = text_spec(crds::DataKind::Text, &dir.join("train.txt"), 4);
        spec.model.vocab_size = 6;
        spec.data.tokenizer = Some(dir.join("tokenizer.json").to_string_lossy().into_owned());
        spec.data.held_out_path = Some(dir.join("val.txt").to_string_lossy().into_owned());
        let (train, test) = load(&spec, None).unwrap();
        assert_eq!(ids(&train), [1u32, 2, 3, 4].repeat(50));
        assert_eq!(ids(&test), [5u32, 5, 4].repeat(5));
        assert_eq!((train.len(), test.len()), (49, 3));

        // The same documents as JSON Lines (joined by line breaks) give the same ids.
        let lines: String = (0..50).map(|_| "{\"body\": \"call me ishmael .\"}\n").collect();
        std::fs::write(dir.join("train.jsonl"), lines).unwrap();
        let mut j = spec.clone();
        j.data.kind = crds::DataKind::Jsonl;
        j.data.path = dir.join("train.jsonl").to_string_lossy().into_owned();
        j.data.text_field = "body".into();
        j.data.held_out_path = None;
        let (jt, jh) = load(&j, None).unwrap();
        let all = [ids(&jt), ids(&jh)].concat();
        assert_eq!(all, [1u32, 2, 3, 4].repeat(50));
        assert_eq!(ids(&jh).len(), 10, "the last 5% of 200 tokens");
        // Without a tokenizer, JSON Lines are bytes.
        j.data.tokenizer = None;
        let (Dataset::Text(bt), _) = load(&j, None).unwrap() else { panic!("text") };
        assert_eq!(bt.vocab, 256);
        assert!(matches!(&bt.tokens, text::Tokens::Bytes(b) if b.starts_with(b"call me ishmael .\ncall me")));

        // Pre-tokenized files: uint32 ids of the same stream.
        let le: Vec<u8> = [1u32, 2, 3, 4].repeat(50).iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(dir.join("train.bin"), le).unwrap();
        let mut t = text_spec(crds::DataKind::Tokens, &dir.join("train.bin"), 4);
        t.model.vocab_size = 6;
        t.data.token_type = crds::TokenType::Uint32;
        let (tt, th) = load(&t, None).unwrap();
        assert_eq!([ids(&tt), ids(&th)].concat(), all);
        assert_eq!(tt.shard(&[1]), train.shard(&[1]));
        assert!(th.unigram_loss(&tt).is_some());
        t.model.vocab_size = 4;
        let err = load(&t, None).unwrap_err().to_string();
        assert!(
            err.contains("train.bin") && err.contains("token id 4 at position 3 is beyond the vocabulary of 4"),
            "{err}"
        );
        t.data.token_type = crds::TokenType::Uint16;
        std::fs::write(dir.join("train.bin"), [0u8; 401]).unwrap();
        let err = load(&t, None).unwrap_err().to_string();
        assert!(err.contains("401 bytes is not a whole number of uint16"), "{err}");

        // A corrupt tokenizer is one error naming the file.
        std::fs::write(dir.join("tokenizer.json"), &words[..40]).unwrap();
        let err = load(&spec, None).unwrap_err().to_string();
        assert!(err.contains("tokenizer.json is not a Hugging Face tokenizer.json"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn arrays_hold_out_their_tail_or_a_named_file() {
        let dir = temp("arrays");
        let (x, y): (Vec<f32>, Vec<u8>) = ((0..80).map(|i| i as f32).collect(), (0..40).map(|i| i % 4).collect());
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        crate::npy::tests::write_npy(&dir.join("inputs.npy"), "<f4", false, &[40, 2], &xb);
        crate::npy::tests::write_npy(&dir.join("labels.npy"), "|u1", false, &[40], &y);
        let mut spec = example("fc-mnist.yaml");
        spec.model.layers = vec![2, 16, 4];
        spec.data = crds::DataSpec::local(crds::DataKind::Arrays, dir.to_string_lossy());
        check_path(&spec).unwrap();
        let (train, test) = load(&spec, None).unwrap();
        assert_eq!((train.len(), test.len()), (38, 2));
        assert_eq!(test.eval_samples(), vec![0, 1]);
        assert_eq!(test.shard(&[1]).inputs.data, vec![78.0, 79.0]);
        assert_eq!(test.unigram_loss(&train), None);
        spec.data.held_out_path = Some(dir.to_string_lossy().into_owned());
        let (train, test) = load(&spec, None).unwrap();
        assert_eq!((train.len(), test.len()), (40, 40));
        spec.model.layers = vec![3, 4];
        let err = load(&spec, None).unwrap_err().to_string();
        assert!(err.contains("2 features but the model's first layer takes 3"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn paths_stay_inside_the_volume() {
        let root = temp("volume");
        let outside = temp("outside");
        std::fs::create_dir_all(root.join("corpus")).unwrap();
        std::fs::write(root.join("corpus/train.txt"), "x".repeat(1000)).unwrap();
        std::fs::write(outside.join("secret.txt"), "y".repeat(1000)).unwrap();
        std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("corpus/link.txt")).unwrap();
        let mut spec = text_spec(crds::DataKind::Text, Path::new("corpus/train.txt"), 8);
        spec.data.volume = Some("weightstream-data".into());
        let real = resolve(&spec, Some(&root), "corpus/train.txt").unwrap();
        assert_eq!(real, root.canonicalize().unwrap().join("corpus/train.txt"));
        assert_eq!(load(&spec, Some(&root)).unwrap().0.len(), (950 - 1) / 8);
        let err = resolve(&spec, Some(&root), "../outside/secret.txt").unwrap_err().to_string();
        assert!(err.contains("leaves the volume 'weightstream-data'"), "{err}");
        let err = resolve(&spec, Some(&root), "/etc/passwd").unwrap_err().to_string();
        assert!(err.contains("leaves the volume"), "{err}");
        let err = resolve(&spec, Some(&root), "corpus/link.txt").unwrap_err().to_string();
        assert!(err.contains("through a symbolic link"), "{err}");
        // The held-out file and the tokenizer are held to the same rule.
        spec.data.held_out_path = Some("corpus/link.txt".into());
        assert!(load(&spec, Some(&root)).unwrap_err().to_string().contains("symbolic link"));
        spec.data.held_out_path = None;
        spec.data.tokenizer = Some("../tokenizer.json".into());
        assert!(load(&spec, Some(&root)).unwrap_err().to_string().contains("leaves the volume"));
        let err = load(&spec, None).unwrap_err().to_string();
        assert!(err.contains("--volume weightstream-data=DIR"), "{err}");
        std::fs::remove_dir_all(&root).ok();
        std::fs::remove_dir_all(&outside).ok();
    }

    #[test]
    fn check_path_knows_each_kind() {
        let dir = temp("check");
        std::fs::write(dir.join("train.bin"), [0u8; 4]).unwrap();
        let spec = text_spec(crds::DataKind::Tokens, &dir.join("train.bin"), 4);
        check_path(&spec).unwrap();
        let err = check_path(&text_spec(crds::DataKind::Jsonl, &dir, 4)).unwrap_err().to_string();
        assert!(err.contains("is not a regular file"), "{err}");
        let mut s = spec.clone();
        s.data.tokenizer = Some(dir.to_string_lossy().into_owned());
        assert!(check_path(&s).unwrap_err().to_string().contains("spec.data.tokenizer"));
        s = spec.clone();
        s.data.held_out_path = Some(dir.to_string_lossy().into_owned());
        assert!(check_path(&s).unwrap_err().to_string().contains("spec.data.heldOutPath"));
        s = text_spec(crds::DataKind::Arrays, &dir.join("train.bin"), 4);
        check_path(&s).unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }

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
