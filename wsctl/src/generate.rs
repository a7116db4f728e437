//! `wsctl generate CHECKPOINT|HF_DIR --prompt TEXT`: what a language model says, without leaving the tool. The
//! model is a checkpoint a job wrote (its model and seed recorded in it) or a Hugging Face Llama folder; MemoryX
//! holds it in this process and streams it to a local engine once per generated token, as in training.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use crds::{ModelKind, ModelSpec, OptimizerKind};
use plan::layout::ModelLayout;
use runtime::coordinator::sample::{self, Decoding};
use runtime::memoryx::checkpoint;
use runtime::memoryx::huggingface;
use runtime::memoryx::store::MemoryX;
use runtime::memoryx::weight_server::Storage;
use runtime::optim::Recipe;

/// What to generate and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The text the model continues.
    pub prompt: String,
    /// Most tokens generated.
    pub tokens: usize,
    /// Sample at this temperature; greedy when `None`.
    pub temperature: Option<f64>,
    /// Seed of the samples.
    pub seed: u64,
    /// The tokenizer (default: the model folder's, or bytes for a 256-token model).
    pub tokenizer: Option<PathBuf>,
    /// The job manifest, for a checkpoint that does not record its model.
    pub job: Option<PathBuf>,
}

/// Text in, token ids out, and back: a Hugging Face tokenizer, or bytes.
enum Codec {
    Tokenizer(Box<data::tokenizer::TextTokenizer>),
    Bytes,
}

impl Codec {
    fn load(path: Option<&Path>, vocab: usize) -> Result<Codec> {
        match path {
            Some(p) => Ok(Codec::Tokenizer(Box::new(data::tokenizer::TextTokenizer::load(p, vocab)?))),
            None if vocab == 256 => Ok(Codec::Bytes),
            None => bail!("the model reads {vocab} tokens, not bytes: name its tokenizer with --tokenizer FILE"),
        }
    }

    fn encode(&self, text: &str, vocab: usize) -> Result<Vec<u32>> {
        Ok(match self {
            Codec::Tokenizer(t) => t.encode(text.as_bytes(), Path::new("the prompt"), vocab)?,
            Codec::Bytes => text.bytes().map(u32::from).collect(),
        })
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(match self {
            Codec::Tokenizer(t) => t.decode(ids)?,
            Codec::Bytes => String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned(),
        })
    }
}

/// A Llama's window need only hold the prompt and the continuation (rotary positions are relative); a GPT's
/// is the one its position embedding was trained for.
fn window(model: &mut ModelSpec, prompt: usize, tokens: usize) {
    if model.kind == ModelKind::Llama {
        let want = (prompt + tokens).max(2) as u32;
        model.context_length = Some(model.context_length.map_or(want, |c| c.min(want)));
    }
}

/// The model at `path` in memory, its tokenizer, and the layout it runs with.
fn load(path: &Path, opts: &Options) -> Result<(MemoryX, ModelLayout, Codec, Vec<u32>)> {
    // No step is taken: plain SGD keeps no moments beside the weights.
    let sgd = crds::OptimizerSpec {
        kind: OptimizerKind::Sgd,
        learning_rate: 0.0,
        weight_decay: 0.0,
        momentum: 0.0,
        beta1: 0.0,
        beta2: 0.0,
        epsilon: 0.0,
    };
    let schedule = crds::ScheduleSpec::default();
    if path.is_dir() {
        let shape = huggingface::shape_of(path)?;
        let mut model = ModelSpec { kind: ModelKind::Llama, ..ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, 0.0) };
        model.from = Some(path.display().to_string());
        model.context_length = Some(shape.max_context.min(crds::pretrained::DEFAULT_PRETRAINED_CONTEXT));
        model.adopt(&shape, &path.join(huggingface::CONFIG_FILE).display().to_string())?;
        let tokenizer =
            opts.tokenizer.clone().or_else(|| shape.has_tokenizer.then(|| path.join(crds::pretrained::TOKENIZER_FILE)));
        let codec = Codec::load(tokenizer.as_deref(), model.vocab_size as usize)?;
        let prompt = codec.encode(&opts.prompt, model.vocab_size as usize)?;
        window(&mut model, prompt.len(), opts.tokens);
        let layout = ModelLayout::from_spec(&model);
        let recipe = Recipe { optimizer: sgd, schedule, total_steps: 1, seed: 0, from: Some(path.to_path_buf()) };
        let store = MemoryX::sharded(layout.clone(), &recipe, 1, &|_| Storage::default())?;
        return Ok((store, layout, codec, prompt));
    }
    let (mut model, seed) = crate::export::model_of(path, opts.job.as_deref())?;
    if !model.kind.is_language_model() {
        bail!("{} holds an MLP, which does not generate text", path.display());
    }
    let from_tokenizer =
        model.from.as_deref().map(|f| Path::new(f).join(crds::pretrained::TOKENIZER_FILE)).filter(|t| t.is_file());
    let codec = Codec::load(opts.tokenizer.as_deref().or(from_tokenizer.as_deref()), model.vocab_size as usize)?;
    let prompt = codec.encode(&opts.prompt, model.vocab_size as usize)?;
    let trained = ModelLayout::from_spec(&model);
    window(&mut model, prompt.len(), opts.tokens);
    let layout = ModelLayout::from_spec(&model);
    let max_bytes = plan::limits::Limits::new(&trained, 1, 2).state_bytes();
    let (info, tensors) = runtime::memoryx::manifest::read_checkpoint(path, max_bytes)?;
    let step = info.step;
    // The weights and vectors only: the optimizer's moments play no part in generating.
    let values: checkpoint::Tensors =
        tensors.into_iter().filter(|(n, _)| n.ends_with(".weight") || n.ends_with(".bias")).collect();
    let from = model.from.as_ref().map(PathBuf::from);
    let recipe = Recipe { optimizer: sgd, schedule, total_steps: 1, seed: seed.unwrap_or(0), from };
    if trained.linears.iter().any(|l| l.sparse) && seed.is_none() && recipe.from.is_none() {
        bail!(
            "{} is of a sparse model and records no seed to draw its masks from; give --job JOB.yaml",
            path.display()
        );
    }
    let store = MemoryX::replica(layout.clone(), &recipe)?;
    store
        .restore(step, &values)
        .with_context(|| format!("{} is not a checkpoint of the model it records", path.display()))?;
    Ok((store, layout, codec, prompt))
}

/// `wsctl generate`: prints the prompt and its continuation.
pub fn command(path: &Path, opts: &Options) -> Result<()> {
    if opts.tokens == 0 {
        bail!("--tokens 0 generates nothing: ask for at least one token");
    }
    if let Some(t) = opts.temperature.filter(|t| !(t.is_finite() && *t > 0.0)) {
        bail!("--temperature {t}: use a positive number (e.g. 0.8), or leave it out for greedy decoding");
    }
    let (store, layout, codec, prompt) = load(path, opts)?;
    if prompt.is_empty() {
        bail!("the prompt is empty: give the text to continue with --prompt");
    }
    let decoding = match opts.temperature {
        Some(temperature) => Decoding::Sampled { temperature, seed: opts.seed },
        None => Decoding::Greedy,
    };
    let out = sample::continuation(&store, &layout, &prompt, opts.tokens, decoding, None).map_err(|e| anyhow!(e))?;
    println!("{}{}", opts.prompt, codec.decode(&out)?);
    Ok(())
}
