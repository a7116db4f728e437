//! `wsctl export CHECKPOINT --format huggingface|safetensors -o DIR`: a checkpoint in formats other tools load.
//!
//! - `huggingface` (Llamas): `config.json` and `model.safetensors` as `LlamaForCausalLM`, under the names
//!   `runtime::memoryx::huggingface` reads a pretrained folder with, so a model imported and exported without a
//!   training step comes back value for value. The tokenizer of the folder it came from travels with it.
//! - `huggingface` (GPTs): `config.json` and `model.safetensors` that Hugging Face `transformers` loads as
//!   `GPT2LMHeadModel` and that compute exactly our model's function. Our GPT is GPT-2's architecture (token
//!   plus position embedding, pre-norm blocks of causal attention scaled by 1/√head_dim and a `gelu_new` MLP,
//!   a final norm, an LM head tied to the token embedding or not); plain layer norms are written as gains 1
//!   and biases 0 (with the same ε), affine ones as they are, and our `outputs × inputs` matrices transposed
//!   to GPT-2's `Conv1D` order. The names are those the import reads, so a GPT-2 imported and exported with no
//!   step comes back value for value. A sparse layer's non-zeros are put back in place from its mask, drawn again from
//!   the seed the checkpoint records (or, for a model pruned by magnitude, from the folder it started from).
//! - `safetensors` (any model, meant for MLPs): every layer as `layers.{i}.weight` (`outputs × inputs`) and
//!   `layers.{i}.bias`, and a `config.json` with the widths and the activation.
//!
//! The checkpoint is read whole and its checksum verified before anything is written; the files are written
//! into a temporary folder beside `DIR` and moved into place only once all are complete, so a failed export
//! leaves nothing half-written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use crds::{ModelKind, ModelSpec};
use plan::layout::{Arch, GptShape, LlamaShape, ModelLayout};
use runtime::memoryx::checkpoint::{self, Tensors};
use runtime::memoryx::huggingface;
use runtime::memoryx::manifest;
use runtime::memoryx::weight_server::Masking;
use safetensors::tensor::{Dtype, TensorView};

/// GPT-2's layer-norm ε, which is also ours ([`runtime::model::norm::EPS`]).
const LAYER_NORM_EPSILON: f64 = 1e-5;
/// Most bytes of a safetensors header read to learn the model before the checkpoint itself is read: the
/// `safetensors` format's own limit.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The formats `wsctl export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A GPT as Hugging Face `GPT2LMHeadModel` (`config.json` + `model.safetensors`).
    Huggingface,
    /// Any model as plainly named safetensors (`layers.{i}.weight`, `layers.{i}.bias`) + `config.json`.
    Safetensors,
}

/// The model a checkpoint holds, from its metadata, or from the job manifest `job` for a checkpoint written
/// before checkpoints recorded it.
pub(crate) fn model_of(path: &Path, job: Option<&Path>) -> Result<(ModelSpec, Option<u64>)> {
    if manifest::is_manifest(path) {
        let m = manifest::read_manifest(path)?;
        if let Some(model) = m.model {
            return Ok((model, Some(m.seed)));
        }
    }
    let meta = if manifest::is_manifest(path) { HashMap::new() } else { header_metadata(path)? };
    if let Some(json) = meta.get(checkpoint::MODEL_KEY) {
        let model = serde_json::from_str(json)
            .with_context(|| format!("{} records a model this wsctl cannot read", path.display()))?;
        return Ok((model, meta.get(checkpoint::SEED_KEY).and_then(|s| s.parse().ok())));
    }
    let Some(job) = job else {
        bail!(
            "{} does not record its model (written by an older weightstream); give the job's manifest with --job JOB.yaml",
            path.display()
        );
    };
    let text = std::fs::read_to_string(job).with_context(|| format!("cannot read {}", job.display()))?;
    let job = crds::parse_training_job_with(&text, &runtime::memoryx::huggingface::resolve)
        .with_context(|| job.display().to_string())?;
    Ok((job.spec.model, Some(job.spec.training.seed)))
}

/// The `__metadata__` of the safetensors file at `path`, reading only its header (bounded).
fn header_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let unusable = |why: String| anyhow!("{} is not a usable checkpoint: {why}", path.display());
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata().with_context(|| format!("cannot read {}", path.display()))?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| unusable(format!("no safetensors header ({e})")))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES || n > size.saturating_sub(8) {
        return Err(unusable(format!("its header claims {n} bytes of a {size}-byte file")));
    }
    let mut header = Vec::with_capacity(n as usize);
    file.take(n).read_to_end(&mut header).map_err(|e| unusable(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| unusable(format!("its header is not JSON ({e})")))?;
    let meta = value.get("__metadata__").cloned().unwrap_or_default();
    Ok(serde_json::from_value(meta).unwrap_or_default())
}

/// Layer `l`'s weights as a dense row-major `outputs × inputs` matrix: a sparse layer's non-zeros put back in
/// place from its mask, a tied layer read from its target's first rows.
fn dense_weights(layout: &ModelLayout, tensors: &Tensors, masking: Option<&Masking>, l: usize) -> Result<Vec<f32>> {
    let shape = layout.linears[l];
    let l = shape.tied_to.unwrap_or(l);
    let name = checkpoint::tensor_name(l, "weight");
    let values = tensors
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .ok_or_else(|| anyhow!("the checkpoint has no {name}"))?;
    let want = shape.dense_weights();
    if layout.linears[l].sparse {
        let masking = masking.ok_or_else(|| {
            anyhow!("the checkpoint of a sparse model records no seed to draw its masks from; give --job JOB.yaml")
        })?;
        if let Masking::Magnitude(dir) = masking
            && !dir.join(huggingface::CONFIG_FILE).is_file()
        {
            bail!(
                "this sparse model was pruned by magnitude from {}, which is not here: export where that folder is \
                     (the masks are chosen from it again)",
                dir.display()
            );
        }
        let mask = runtime::memoryx::weight_server::mask(layout, masking, l)?
            .ok_or_else(|| anyhow!("layer {l} has no mask"))?;
        if mask.nnz() != values.len() {
            bail!(
                "{name} has {} values but its mask {}: the checkpoint is not of this model and seed",
                values.len(),
                mask.nnz()
            );
        }
        return Ok(mask.to_dense(values).data);
    }
    if values.len() < want || (shape.tied_to.is_none() && values.len() != want) {
        bail!(
            "{name} has {} values; the model's layer needs {want}: the checkpoint is not of the model it records",
            values.len()
        );
    }
    Ok(values[..want].to_vec())
}

/// Layer `l`'s vector (a bias, or a norm's gain), of the length the layout gives it.
fn vector(layout: &ModelLayout, tensors: &Tensors, l: usize) -> Result<Vec<f32>> {
    let want = layout.linears[l].vector_len();
    let name = checkpoint::tensor_name(l, "bias");
    match tensors.iter().find(|(n, _)| *n == name) {
        Some((_, v)) if v.len() == want => Ok(v.clone()),
        Some((_, v)) => bail!("{name} has {} values; the layer has {want}", v.len()),
        None if want == 0 => Ok(Vec::new()),
        None => bail!("the checkpoint has no {name}"),
    }
}

/// A decoder's tensors under Hugging Face's names ([`huggingface::unit_tensors`], the mapping the import
/// reads with): each unit's weights split back into its matrices (transposed where GPT-2 stores them so), its
/// vector into its tensors, and the tensors a plain GPT's norms stand for at their identity values.
fn hugging_face_tensors(layout: &ModelLayout, tensors: &Tensors, masking: Option<&Masking>) -> Result<Out> {
    let mut out = Out::default();
    for l in 0..layout.linears.len() {
        let unit = huggingface::unit_tensors(layout, l).ok_or_else(|| anyhow!("layer {l} is not a decoder's"))?;
        let cols = layout.linears[l].inputs;
        if !unit.weights.is_empty() {
            let weights = dense_weights(layout, tensors, masking, l)?;
            let mut rows_done = 0;
            for m in &unit.weights {
                let block = weights
                    .get(rows_done * cols..(rows_done + m.rows) * cols)
                    .ok_or_else(|| anyhow!("layer {l} is smaller than {}", m.name))?;
                if m.transposed {
                    out.put(m.name.clone(), &[cols, m.rows], transpose(block, m.rows, cols));
                } else {
                    out.put(m.name.clone(), &[m.rows, cols], block.to_vec());
                }
                rows_done += m.rows;
            }
        }
        let values = vector(layout, tensors, l)?;
        let mut done = 0;
        for (name, len) in &unit.vector {
            let part =
                values.get(done..done + len).ok_or_else(|| anyhow!("layer {l}'s vector is shorter than {name}"))?;
            out.put(name.clone(), &huggingface::vector_shape(layout, name, *len), part.to_vec());
            done += len;
        }
        for (name, len, value) in &unit.constants {
            out.put(name.clone(), &[*len], vec![*value; *len]);
        }
    }
    Ok(out)
}

/// The `config.json` of the model `model` was imported from, when it is at hand: the fields the export does not
/// decide (token ids, the tokenizer's needs) come from it.
fn source_config(model: &ModelSpec) -> serde_json::Value {
    let source = model.from.as_deref().and_then(|f| std::fs::read(Path::new(f).join(huggingface::CONFIG_FILE)).ok());
    match source.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()) {
        Some(c) if c.is_object() => c,
        _ => serde_json::json!({}),
    }
}

/// `fields` written over `config`, with what no longer describes the written weights removed.
fn over(mut config: serde_json::Value, fields: serde_json::Value) -> serde_json::Value {
    for (k, v) in fields.as_object().into_iter().flatten() {
        config[k] = v.clone();
    }
    for stale in ["quantization_config", "dtype", "_name_or_path", "_model_name_or_path"] {
        config.as_object_mut().map(|c| c.remove(stale));
    }
    config
}

/// A Llama's `config.json` as `LlamaForCausalLM`.
fn llama_config(layout: &ModelLayout, g: LlamaShape, model: &ModelSpec) -> serde_json::Value {
    let config = source_config(model);
    let tied = layout.linears.last().is_some_and(|h| h.tied_to.is_some());
    let fields = serde_json::json!({
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": g.vocab,
        "hidden_size": g.width,
        "intermediate_size": g.intermediate,
        "num_hidden_layers": g.blocks,
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads,
        "head_dim": g.head_dim(),
        "max_position_embeddings": config["max_position_embeddings"].as_u64().unwrap_or(g.context as u64).max(g.context as u64),
        "rms_norm_eps": g.norm_eps,
        "rope_theta": g.rope_theta,
        "rope_parameters": { "rope_theta": g.rope_theta, "rope_type": "default" },
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    });
    over(config, fields)
}

/// Layer `l`'s bias (zeros when the layer has none).
fn bias(layout: &ModelLayout, tensors: &Tensors, l: usize) -> Result<Vec<f32>> {
    let shape = layout.linears[l];
    let name = checkpoint::tensor_name(l, "bias");
    match tensors.iter().find(|(n, _)| *n == name) {
        Some((_, v)) if v.len() == shape.outputs => Ok(v.clone()),
        Some((_, v)) => bail!("{name} has {} values; the layer has {} outputs", v.len(), shape.outputs),
        None if shape.bias => bail!("the checkpoint has no {name}"),
        None => Ok(vec![0.0; shape.outputs]),
    }
}

/// A row-major `rows × cols` matrix transposed: `Linear`'s `[out, in]` to GPT-2 `Conv1D`'s `[in, out]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

/// Named tensors with their shapes, to be written as one safetensors file.
#[derive(Default)]
struct Out(Vec<(String, Vec<usize>, Vec<f32>)>);

impl Out {
    fn put(&mut self, name: impl Into<String>, shape: &[usize], values: Vec<f32>) {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        self.0.push((name.into(), shape.to_vec(), values));
    }

    fn serialize(&self, metadata: HashMap<String, String>) -> Result<Vec<u8>> {
        let bytes: Vec<Vec<u8>> =
            self.0.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let views = self
            .0
            .iter()
            .zip(&bytes)
            .map(|((name, shape, _), data)| {
                TensorView::new(Dtype::F32, shape.clone(), data)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| anyhow!("tensor {name}: {e}"))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| anyhow!("serialising the export: {e}"))
    }
}

/// A GPT's `config.json` as `GPT2LMHeadModel` (over its source's, when it was imported).
fn gpt2_config(layout: &ModelLayout, g: GptShape, model: &ModelSpec) -> serde_json::Value {
    let (w, v, t) = (g.width, g.vocab, g.context);
    let tied = layout.linears.last().is_some_and(|h| h.tied_to.is_some());
    let fields = serde_json::json!({
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": v,
        "n_positions": t,
        "n_ctx": t,
        "n_embd": w,
        "n_layer": g.blocks,
        "n_head": g.heads,
        "n_inner": g.hidden,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "tie_word_embeddings": tied,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    });
    let mut config = over(source_config(model), fields);
    // Token ids a byte-level model does not have.
    for id in ["bos_token_id", "eos_token_id"] {
        if config[id].as_u64().is_none_or(|i| i >= v as u64) {
            config[id] = serde_json::Value::Null;
        }
    }
    config
}

/// Any model's layers under plain names, and a `config.json` saying how to run them.
fn plain(
    layout: &ModelLayout,
    model: &ModelSpec,
    tensors: &Tensors,
    masking: Option<&Masking>,
) -> Result<(Out, serde_json::Value)> {
    let mut out = Out::default();
    for (l, shape) in layout.linears.iter().enumerate() {
        out.put(
            format!("layers.{l}.weight"),
            &[shape.outputs, shape.inputs],
            dense_weights(layout, tensors, masking, l)?,
        );
        if shape.bias {
            out.put(format!("layers.{l}.bias"), &[shape.outputs], bias(layout, tensors, l)?);
        }
    }
    let mut widths: Vec<usize> = layout.linears.first().map(|l| l.inputs).into_iter().collect();
    widths.extend(layout.linears.iter().map(|l| l.outputs));
    let config = serde_json::json!({
        "model_type": huggingface::MLP_MODEL_TYPE,
        "layers": widths,
        "activation": model.activation,
        "forward": "y = layers.{i}.weight @ x + layers.{i}.bias, the activation after every layer but the last",
        "model": model,
    });
    Ok((out, config))
}

/// The few rules the layout needs to be well-formed (the manifest's validation ran when the job started; this
/// guards against a checkpoint whose metadata was edited).
fn check_model(m: &ModelSpec) -> std::result::Result<(), String> {
    match m.kind {
        ModelKind::Mlp if m.layers.len() < 2 || m.layers.contains(&0) => Err(format!("mlp layers {:?}", m.layers)),
        ModelKind::Gpt => {
            let (w, h) = (m.width.unwrap_or(0), m.heads.unwrap_or(0));
            if w == 0
                || h == 0
                || w % h != 0
                || m.blocks.unwrap_or(0) == 0
                || m.context_length.unwrap_or(0) == 0
                || m.vocab_size == 0
            {
                return Err(format!(
                    "gpt width {w}, heads {h}, blocks {:?}, contextLength {:?}",
                    m.blocks, m.context_length
                ));
            }
            Ok(())
        }
        ModelKind::Llama => {
            let (w, h, kv) = (m.width.unwrap_or(0), m.heads.unwrap_or(0), m.kv_heads.or(m.heads).unwrap_or(0));
            if w == 0
                || h == 0
                || kv == 0
                || w % h != 0
                || h % kv != 0
                || m.blocks.unwrap_or(0) == 0
                || m.intermediate_size.unwrap_or(0) == 0
            {
                return Err(format!(
                    "llama width {w}, heads {h}, kvHeads {kv}, blocks {:?}, intermediateSize {:?}",
                    m.blocks, m.intermediate_size
                ));
            }
            Ok(())
        }
        _ if !(0.0..1.0).contains(&m.sparsity) => Err(format!("sparsity {}", m.sparsity)),
        _ => Ok(()),
    }
}

/// Exports the checkpoint at `path` in `format` into the folder `out` (created; an existing one gets the files
/// added), taking the model from `job` when the checkpoint does not record it. Returns the files written.
pub fn export(
    path: &Path,
    format: Format,
    out: &Path,
    job: Option<&Path>,
    tokenizer: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let (model, seed) = model_of(path, job)?;
    // The masks as the run chose them: by magnitude from the pretrained folder it started from, else from its seed.
    let masking = match &model.from {
        Some(from) => Some(Masking::Magnitude(PathBuf::from(from))),
        None => seed.map(Masking::Random),
    };
    // The tokenizer travels with the model, so `AutoTokenizer.from_pretrained` finds it beside the weights; it is
    // read as the input workers read it, and must fit the model's vocabulary.
    // A model imported from a Hugging Face folder takes that folder's tokenizer when none is named.
    let from_tokenizer =
        model.from.as_deref().map(|f| Path::new(f).join(crds::pretrained::TOKENIZER_FILE)).filter(|t| t.is_file());
    let tokenizer = match tokenizer.or(from_tokenizer.as_deref()) {
        Some(t) if !model.kind.is_language_model() => {
            bail!("--tokenizer {}: only a language model reads tokens; leave it out for an MLP", t.display())
        }
        Some(t) => {
            data::tokenizer::TextTokenizer::load(t, model.vocab_size as usize)?;
            Some(std::fs::read(t).with_context(|| format!("cannot read {}", t.display()))?)
        }
        None => None,
    };
    if format == Format::Huggingface && !model.kind.is_language_model() {
        bail!(
            "{} holds an MLP (layers {:?}), not a language model: --format huggingface writes GPT-2 and Llama models \
             only; export it with --format safetensors",
            path.display(),
            model.layers
        );
    }
    check_model(&model).map_err(|why| anyhow!("{}: the model it records is not valid: {why}", path.display()))?;
    let layout = ModelLayout::from_spec(&model);
    // The whole state with Adam's two moments beside every weight: the most a checkpoint of this model holds.
    let max_bytes = plan::limits::Limits::new(&layout, 1, 2).state_bytes();
    let (info, tensors) = manifest::read_checkpoint(path, max_bytes)?;
    let (tensors_out, mut config) = match (format, layout.arch) {
        (Format::Huggingface, Arch::Gpt(g)) => {
            (hugging_face_tensors(&layout, &tensors, masking.as_ref())?, gpt2_config(&layout, g, &model))
        }
        (Format::Huggingface, Arch::Llama(g)) => {
            (hugging_face_tensors(&layout, &tensors, masking.as_ref())?, llama_config(&layout, g, &model))
        }
        (Format::Huggingface, Arch::Mlp) => bail!("an MLP cannot be exported as a Hugging Face GPT-2"),
        // A program's tensors keep its module's state-dict names in either format: `to_torch` loads them into
        // the user's own module.
        (_, Arch::Program(_)) => {
            if layout.linears.is_empty() {
                plan::program::for_spec(&model)?;
            }
            let module = layout.program.as_ref().map(|p| p.module.clone()).unwrap_or_default();
            let config = serde_json::json!({"model_type": "weightstream-program", "module": module});
            (hugging_face_tensors(&layout, &tensors, masking.as_ref())?, config)
        }
        (Format::Safetensors, _) => plain(&layout, &model, &tensors, masking.as_ref())?,
    };
    config["weightstream"] = serde_json::json!({
        "checkpoint": path.file_name().map(|n| n.to_string_lossy().to_string()),
        "job": info.job,
        "step": info.step,
        "tokenizer": match (model.kind, &tokenizer) {
            (ModelKind::Mlp, _) => None,
            (_, Some(_)) => Some("tokenizer.json (the job's spec.data.tokenizer)"),
            _ if model.vocab_size == 256 => Some("bytes: token id = byte value"),
            _ => Some("not included: export with --tokenizer (the job's spec.data.tokenizer)"),
        },
    });
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = tensors_out.serialize(meta)?;
    let config = serde_json::to_vec_pretty(&config)?;
    let mut files: Vec<(&str, &[u8])> = vec![("config.json", &config), ("model.safetensors", &weights)];
    let tokenizer_config = serde_json::to_vec_pretty(&serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model.context_length,
    }))?;
    if let Some(t) = &tokenizer {
        files.extend([("tokenizer.json", t.as_slice()), ("tokenizer_config.json", tokenizer_config.as_slice())]);
    }
    write_all(out, &files)
}

/// Writes `files` into `out` all or nothing: into a fresh temporary folder beside `out`, then moved into place
/// (the folder renamed when `out` does not exist yet, else each file renamed into it). On failure the
/// temporary folder is removed and `out` is as it was.
fn write_all(out: &Path, files: &[(&str, &[u8])]) -> Result<Vec<PathBuf>> {
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let base = out.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "export".into());
    let staging = parent.join(format!(".{base}.export-{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let result = (|| -> Result<Vec<PathBuf>> {
        std::fs::create_dir(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
        for (name, bytes) in files {
            let p = staging.join(name);
            let f = std::fs::File::create(&p).with_context(|| format!("cannot create {}", p.display()))?;
            std::io::Write::write_all(&mut std::io::BufWriter::new(&f), bytes)
                .with_context(|| format!("cannot write {}", p.display()))?;
            f.sync_all().with_context(|| format!("cannot write {}", p.display()))?;
        }
        if !out.exists() {
            std::fs::rename(&staging, out).with_context(|| format!("cannot move the export to {}", out.display()))?;
        } else {
            for (name, _) in files {
                std::fs::rename(staging.join(name), out.join(name))
                    .with_context(|| format!("cannot move {name} into {}", out.display()))?;
            }
        }
        Ok(files.iter().map(|(name, _)| out.join(name)).collect())
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// `wsctl export`: prints the files written.
pub fn command(path: &Path, format: Format, out: &Path, job: Option<&Path>, tokenizer: Option<&Path>) -> Result<()> {
    for file in export(path, format, out, job, tokenizer)? {
        println!("{}", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_swaps_rows_and_columns() {
        assert_eq!(super::transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
