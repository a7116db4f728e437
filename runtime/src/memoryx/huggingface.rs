//! Hugging Face model folders, in and out of MemoryX: a `LlamaForCausalLM` or `GPT2LMHeadModel` folder
//! (`config.json` and `model.safetensors`, or shards named by `model.safetensors.index.json`) is read one
//! stream unit at a time, so
//! a model larger than a weight server's memory never sits whole in one process; and the same names write a
//! job's checkpoint back out (`wsctl export`). The mapping between Hugging Face's parameters and the stream
//! units is [`unit_tensors`], the one place it is written. An MLP's folder is the one `wsctl export --format
//! safetensors` writes (`config.json` of model type [`MLP_MODEL_TYPE`], `layers.{i}.weight` and
//! `layers.{i}.bias`), so a model exported, or built in PyTorch and saved alike, is a folder a job starts from.
//!
//! Nothing in the folder is trusted: every header is bounded before it is read, every tensor's byte range is
//! checked against its file, and every shape against the job's model before any value is used.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crds::ModelKind;
use crds::pretrained::PretrainedShape;
use errors::{Error, Result};
use plan::layout::{Arch, DecoderUnit, ModelLayout};
use safetensors::tensor::Dtype;

/// The folder's model description.
pub const CONFIG_FILE: &str = "config.json";
/// The weights of an unsharded model.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index naming each tensor's shard in a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The `model_type` of an MLP's `config.json`, as `wsctl export --format safetensors` writes it.
pub const MLP_MODEL_TYPE: &str = "weightstream-mlp";
/// Most bytes of a `config.json` or an index read: far more than any real one.
const MAX_JSON_BYTES: u64 = 16 << 20;
/// Most bytes of a safetensors header: the format's own limit.
const MAX_HEADER_BYTES: u64 = 100_000_000;

fn bad(dir: &Path, what: impl std::fmt::Display) -> Error {
    Error::Data(format!("pretrained model {}: {what}", dir.display()))
}

/// Reads a small JSON file of the folder, bounded.
fn read_json(dir: &Path, name: &str) -> Result<serde_json::Value> {
    let path = dir.join(name);
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => bad(dir, format!("has no {name}: spec.model.from must name a Hugging Face model folder (config.json and model.safetensors, as save_pretrained writes it)")),
        _ => Error::io(format!("reading {}", path.display()), e),
    })?;
    if meta.len() > MAX_JSON_BYTES {
        return Err(bad(
            dir,
            format!("{name} is {} bytes, more than any model description ({MAX_JSON_BYTES})", meta.len()),
        ));
    }
    let text = std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&text).map_err(|e| bad(dir, format!("{name} is not JSON: {e}")))
}

/// The shape a folder's `config.json` describes, in the job's terms; an architecture the appliance cannot run
/// is an error naming it.
pub fn shape_of(dir: &Path) -> Result<PretrainedShape> {
    let c = read_json(dir, CONFIG_FILE)?;
    let arch =
        c["architectures"].get(0).and_then(|a| a.as_str()).or_else(|| c["model_type"].as_str()).unwrap_or("(none)");
    let int = |key: &str| -> Result<u32> {
        c[key]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad(dir, format!("config.json has no {key} (a whole number)")))
    };
    if c["model_type"].as_str() == Some(MLP_MODEL_TYPE) {
        return mlp_shape(dir, &c);
    }
    if c["model_type"].as_str() == Some("gpt2") || arch == "GPT2LMHeadModel" {
        return gpt2_shape(dir, &c, &int);
    }
    if c["model_type"].as_str() != Some("llama") && arch != "LlamaForCausalLM" {
        return Err(bad(
            dir,
            format!(
                "its config.json describes {arch}, which the appliance cannot run: it loads LlamaForCausalLM (model_type \
                 llama) and GPT2LMHeadModel (model_type gpt2)"
            ),
        ));
    }
    let heads = int("num_attention_heads")?;
    let width = int("hidden_size")?;
    if let Some(dh) = c["head_dim"].as_u64()
        && (heads == 0 || dh != u64::from(width / heads))
    {
        return Err(bad(
            dir,
            format!(
                "head_dim {dh} is not hidden_size / num_attention_heads ({width} / {heads}); the appliance runs heads of that size only"
            ),
        ));
    }
    for (key, want) in [("hidden_act", "silu")] {
        if let Some(v) = c[key].as_str().filter(|v| *v != want) {
            return Err(bad(dir, format!("{key} is {v}; a llama here uses {want}")));
        }
    }
    for key in ["attention_bias", "mlp_bias"] {
        if c[key].as_bool() == Some(true) {
            return Err(bad(dir, format!("{key} is true; the appliance's llama has no biases")));
        }
    }
    // `transformers` 5 keeps the rotary settings in `rope_parameters`, earlier versions at the top level.
    let rope = if c["rope_parameters"].is_object() { &c["rope_parameters"] } else { &c };
    if let Some(kind) = rope["rope_type"].as_str().filter(|t| *t != "default") {
        return Err(bad(
            dir,
            format!("uses rotary scaling '{kind}'; the appliance runs the default rotary embedding only"),
        ));
    }
    if !c["rope_scaling"].is_null() {
        return Err(bad(dir, "sets rope_scaling; the appliance runs the default rotary embedding only"));
    }
    Ok(PretrainedShape {
        kind: ModelKind::Llama,
        vocab_size: int("vocab_size")?,
        width,
        heads,
        kv_heads: c["num_key_value_heads"].as_u64().map_or(Ok(heads), |_| int("num_key_value_heads"))?,
        blocks: int("num_hidden_layers")?,
        intermediate_size: int("intermediate_size")?,
        rope_theta: rope["rope_theta"].as_f64().unwrap_or(plan::layout::DEFAULT_ROPE_THETA),
        norm_eps: c["rms_norm_eps"].as_f64().unwrap_or(plan::layout::DEFAULT_NORM_EPS),
        tied_embeddings: c["tie_word_embeddings"].as_bool().unwrap_or(false),
        max_context: int("max_position_embeddings")?,
        has_tokenizer: dir.join(crds::pretrained::TOKENIZER_FILE).is_file(),
        layers: Vec::new(),
        activation: crds::Activation::default(),
    })
}

/// An MLP's shape: its `config.json`'s `layers` (the widths from input to output) and `activation`.
fn mlp_shape(dir: &Path, c: &serde_json::Value) -> Result<PretrainedShape> {
    let widths = c["layers"]
        .as_array()
        .map(|a| a.iter().map(|w| w.as_u64().and_then(|w| u32::try_from(w).ok())).collect::<Option<Vec<u32>>>());
    let layers = widths.flatten().filter(|l| l.len() >= 2 && !l.contains(&0)).ok_or_else(|| {
        bad(dir, "config.json has no layers: an mlp's are its widths from input to output, e.g. [784, 512, 10]")
    })?;
    let activation = serde_json::from_value(c["activation"].clone()).map_err(|_| {
        bad(dir, format!("config.json's activation is {}: an mlp's is \"relu\" or \"gelu\"", c["activation"]))
    })?;
    Ok(PretrainedShape {
        kind: ModelKind::Mlp,
        vocab_size: 0,
        width: 0,
        heads: 0,
        kv_heads: 0,
        blocks: 0,
        intermediate_size: 0,
        rope_theta: 0.0,
        norm_eps: 0.0,
        tied_embeddings: false,
        max_context: 0,
        has_tokenizer: false,
        layers,
        activation,
    })
}

/// A `GPT2LMHeadModel`'s shape: GPT-2 as the appliance's `gpt` runs it (tanh-GELU, attention scaled by
/// 1/√head_dim, layer norms with ε = [`crate::model::norm::EPS`]), anything else named.
fn gpt2_shape(dir: &Path, c: &serde_json::Value, int: &dyn Fn(&str) -> Result<u32>) -> Result<PretrainedShape> {
    if let Some(act) = c["activation_function"].as_str().filter(|a| !matches!(*a, "gelu_new" | "gelu_pytorch_tanh")) {
        return Err(bad(
            dir,
            format!("activation_function is {act}; a gpt here uses gelu_new (GELU's tanh approximation)"),
        ));
    }
    let eps = c["layer_norm_epsilon"].as_f64().unwrap_or(1e-5);
    if (eps - f64::from(crate::model::norm::EPS)).abs() > 1e-12 {
        return Err(bad(
            dir,
            format!("layer_norm_epsilon is {eps}; a gpt here normalises with {}", crate::model::norm::EPS),
        ));
    }
    for (key, want) in [("scale_attn_weights", true), ("scale_attn_by_inverse_layer_idx", false)] {
        if c[key].as_bool().is_some_and(|v| v != want) {
            return Err(bad(dir, format!("{key} is {}; a gpt here has it {want}", !want)));
        }
    }
    let (width, heads) = (int("n_embd")?, int("n_head")?);
    let hidden = match c["n_inner"].as_u64() {
        Some(_) => int("n_inner")?,
        None => width.saturating_mul(4),
    };
    Ok(PretrainedShape {
        kind: ModelKind::Gpt,
        vocab_size: int("vocab_size")?,
        width,
        heads,
        kv_heads: heads,
        blocks: int("n_layer")?,
        intermediate_size: hidden,
        rope_theta: plan::layout::DEFAULT_ROPE_THETA,
        norm_eps: eps,
        tied_embeddings: c["tie_word_embeddings"].as_bool().unwrap_or(true),
        max_context: int("n_positions")?,
        has_tokenizer: dir.join(crds::pretrained::TOKENIZER_FILE).is_file(),
        layers: Vec::new(),
        activation: crds::Activation::default(),
    })
}

/// The resolver [`crds::parse_training_job_with`] takes: the shape of the folder `from` names, when it is
/// on this machine (`None` when the path does not exist here, e.g. a path inside a cluster volume).
pub fn resolve(from: &str) -> std::result::Result<Option<(PretrainedShape, String)>, crds::ApiError> {
    let dir = Path::new(from);
    if !dir.exists() {
        return Ok(None);
    }
    let source = dir.join(CONFIG_FILE).display().to_string();
    shape_of(dir)
        .map(|s| Some((s, source)))
        .map_err(|e| crds::ApiError::Invalid { field: "spec.model.from".into(), message: e.to_string() })
}

/// One Hugging Face matrix stacked into a stream unit's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Its tensor's name.
    pub name: String,
    /// The unit's rows it gives (the tensor's outputs).
    pub rows: usize,
    /// Whether the tensor is stored `inputs × outputs` (GPT-2's `Conv1D`) rather than `outputs × inputs`
    /// (`nn.Linear`, and the unit's own order).
    pub transposed: bool,
}

/// Where this component finds the folder `spec.model.from` names: inside the data volume mounted at `root`
/// when the job names one (the path taken inside it and never outside, as the data's paths are), else as
/// given. The folder's `config.json` is held to the job's model, so a folder that is not the model the job was
/// planned for is one error naming the field and both values (in a cluster the shape comes with the job).
pub fn locate(spec: &crds::TrainingJobSpec, root: Option<&Path>) -> Result<Option<PathBuf>> {
    let Some(from) = &spec.model.from else { return Ok(None) };
    let dir = data::resolve(spec, root, from)?;
    if spec.model.kind == crds::ModelKind::Program {
        // A program's folder is held to the job where the program is read (`plan::program::for_spec`).
        return Ok(Some(dir));
    }
    let shape = shape_of(&dir)?;
    let mut model = spec.model.clone();
    model.adopt(&shape, &dir.join(CONFIG_FILE).display().to_string()).map_err(|e| bad(&dir, e))?;
    Ok(Some(dir))
}

/// Stream unit `l` as Hugging Face names it.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitTensors {
    /// The matrices whose rows make up the unit's weights, in order (none for a tied head, whose weights are
    /// the embedding's).
    pub weights: Vec<Matrix>,
    /// The tensors whose values, in order, make up the unit's vector: its bias, then the gain (and bias) of
    /// the norm its input passes through; each with its length.
    pub vector: Vec<(String, usize)>,
    /// Tensors the Hugging Face model has that the unit does not carry, each with its length and the one value
    /// it holds: a plain GPT's norm gains (1) and biases (0), written so the export computes the same.
    pub constants: Vec<(String, usize, f32)>,
}

/// The tensors of stream unit `l` of `layout` in a model folder: `LlamaForCausalLM`'s names for a Llama,
/// `GPT2LMHeadModel`'s for a GPT, `layers.{l}.weight` and `layers.{l}.bias` for an MLP (as `wsctl export
/// --format safetensors` names them); `None` past the last unit.
pub fn unit_tensors(layout: &ModelLayout, l: usize) -> Option<UnitTensors> {
    let shape = layout.linears.get(l)?;
    let tied = shape.tied_to.is_some();
    let matrix = |name: String, rows: usize, transposed: bool| Matrix { name, rows, transposed };
    let unit = |weights: Vec<Matrix>, vector: Vec<(String, usize)>, constants: Vec<(String, usize, f32)>| {
        Some(UnitTensors { weights, vector, constants })
    };
    match layout.arch {
        Arch::Program(_) => {
            let program = layout.program.as_ref()?;
            let u = program.units.get(l)?;
            let weights = if tied { Vec::new() } else { vec![matrix(u.name.clone(), u.outputs, u.transposed)] };
            let mut vector: Vec<(String, usize)> = u.bias.iter().map(|b| (b.clone(), u.outputs)).collect();
            vector.extend(u.vectors.iter().map(|&p| (program.params[p].name.clone(), program.params[p].len())));
            unit(weights, vector, Vec::new())
        }
        Arch::Mlp => unit(
            vec![matrix(format!("layers.{l}.weight"), shape.outputs, false)],
            vec![(format!("layers.{l}.bias"), shape.outputs)],
            Vec::new(),
        ),
        Arch::Llama(g) => {
            let layer = |b: usize, name: &str| format!("model.layers.{b}.{name}.weight");
            let (d, dh) = (g.width, g.head_dim());
            match g.unit(l) {
                DecoderUnit::Embed => {
                    unit(vec![matrix("model.embed_tokens.weight".into(), g.vocab, false)], Vec::new(), Vec::new())
                }
                DecoderUnit::Qkv(b) => unit(
                    [
                        ("self_attn.q_proj", g.heads * dh),
                        ("self_attn.k_proj", g.kv_heads * dh),
                        ("self_attn.v_proj", g.kv_heads * dh),
                    ]
                    .map(|(n, rows)| matrix(layer(b, n), rows, false))
                    .to_vec(),
                    vec![(layer(b, "input_layernorm"), d)],
                    Vec::new(),
                ),
                DecoderUnit::Proj(b) => {
                    unit(vec![matrix(layer(b, "self_attn.o_proj"), d, false)], Vec::new(), Vec::new())
                }
                DecoderUnit::Up(b) => unit(
                    ["mlp.gate_proj", "mlp.up_proj"].map(|n| matrix(layer(b, n), g.intermediate, false)).to_vec(),
                    vec![(layer(b, "post_attention_layernorm"), d)],
                    Vec::new(),
                ),
                DecoderUnit::Down(b) => unit(vec![matrix(layer(b, "mlp.down_proj"), d, false)], Vec::new(), Vec::new()),
                DecoderUnit::Head => unit(
                    if tied { Vec::new() } else { vec![matrix("lm_head.weight".into(), g.vocab, false)] },
                    vec![("model.norm.weight".into(), d)],
                    Vec::new(),
                ),
            }
        }
        Arch::Gpt(g) => {
            let d = g.width;
            let h = |b: usize, name: &str| format!("transformer.h.{b}.{name}");
            // A layer norm's gain and bias: in the unit's vector when they are learned, else written at identity.
            let norm = |prefix: String, mut vector: Vec<(String, usize)>| {
                let (gain, bias) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
                if g.affine_norms {
                    vector.extend([(gain, d), (bias, d)]);
                    (vector, Vec::new())
                } else {
                    (vector, vec![(gain, d, 1.0), (bias, d, 0.0)])
                }
            };
            let conv = |b: usize, name: &str, rows: usize| {
                (vec![matrix(h(b, &format!("{name}.weight")), rows, true)], vec![(h(b, &format!("{name}.bias")), rows)])
            };
            match g.unit(l) {
                DecoderUnit::Embed => unit(
                    vec![
                        matrix("transformer.wte.weight".into(), g.vocab, false),
                        matrix("transformer.wpe.weight".into(), g.context, false),
                    ],
                    Vec::new(),
                    Vec::new(),
                ),
                DecoderUnit::Qkv(b) => {
                    let (weights, bias) = conv(b, "attn.c_attn", 3 * d);
                    let (vector, constants) = norm(h(b, "ln_1"), bias);
                    unit(weights, vector, constants)
                }
                DecoderUnit::Proj(b) => {
                    let (weights, bias) = conv(b, "attn.c_proj", d);
                    unit(weights, bias, Vec::new())
                }
                DecoderUnit::Up(b) => {
                    let (weights, bias) = conv(b, "mlp.c_fc", g.hidden);
                    let (vector, constants) = norm(h(b, "ln_2"), bias);
                    unit(weights, vector, constants)
                }
                DecoderUnit::Down(b) => {
                    let (weights, bias) = conv(b, "mlp.c_proj", d);
                    unit(weights, bias, Vec::new())
                }
                DecoderUnit::Head => {
                    let weights = if tied { Vec::new() } else { vec![matrix("lm_head.weight".into(), g.vocab, false)] };
                    let (vector, constants) = norm("transformer.ln_f".into(), Vec::new());
                    unit(weights, vector, constants)
                }
            }
        }
    }
}

/// The shape a unit's vector tensor `name` of `len` values has in a folder: a model program's parameter keeps its
/// own (a learned position table may be `1 × context × width`); every other is a vector.
pub fn vector_shape(layout: &ModelLayout, name: &str, len: usize) -> Vec<usize> {
    let param = layout.program.as_ref().and_then(|p| p.params.iter().find(|q| q.name == name));
    param.map_or_else(|| vec![len], |q| q.shape.clone())
}

/// Rows of each matrix [`unit_tensors`] names for unit `l`, in order: how its weights split back apart.
pub fn unit_rows(layout: &ModelLayout, l: usize) -> Vec<usize> {
    unit_tensors(layout, l).map(|u| u.weights.iter().map(|m| m.rows).collect()).unwrap_or_default()
}

/// Where one tensor's bytes are.
#[derive(Clone, Debug)]
struct Entry {
    file: PathBuf,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte offset in the file and length.
    start: u64,
    len: u64,
}

/// An opened Hugging Face folder: every tensor's file, type, shape and byte range, from the headers alone.
#[derive(Debug)]
pub struct Folder {
    dir: PathBuf,
    tensors: HashMap<String, Entry>,
}

impl Folder {
    /// Reads the headers of the folder's weights (one file, or the shards its index names), bounded.
    pub fn open(dir: &Path) -> Result<Folder> {
        let files: Vec<PathBuf> = if dir.join(INDEX_FILE).exists() {
            let index = read_json(dir, INDEX_FILE)?;
            let map =
                index["weight_map"].as_object().ok_or_else(|| bad(dir, format!("{INDEX_FILE} has no weight_map")))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
                .into_iter()
                .map(|n| {
                    if n.contains('/') || n.contains("..") || n.is_empty() {
                        return Err(bad(
                            dir,
                            format!("{INDEX_FILE} names the shard '{n}', which is not a file of the folder"),
                        ));
                    }
                    let p = dir.join(n);
                    if !p.is_file() {
                        return Err(bad(
                            dir,
                            format!("{INDEX_FILE} names the shard {n}, which is missing: copy the whole folder"),
                        ));
                    }
                    Ok(p)
                })
                .collect::<Result<_>>()?
        } else if dir.join(WEIGHTS_FILE).is_file() {
            vec![dir.join(WEIGHTS_FILE)]
        } else {
            return Err(bad(
                dir,
                format!(
                    "has neither {WEIGHTS_FILE} nor {INDEX_FILE}: save the model with save_pretrained(..., safe_serialization=True)"
                ),
            ));
        };
        let mut tensors = HashMap::new();
        for file in files {
            for (name, entry) in read_header(dir, &file)? {
                tensors.insert(name, entry);
            }
        }
        Ok(Folder { dir: dir.to_path_buf(), tensors })
    }

    /// Checks that every tensor `layout` needs is in the folder with the shape the model has, before any
    /// value is read: a folder of another model fails here, naming the tensor and both shapes.
    pub fn check(&self, layout: &ModelLayout) -> Result<()> {
        for l in 0..layout.linears.len() {
            let unit = unit_tensors(layout, l)
                .ok_or_else(|| bad(&self.dir, "pretrained weights are read for a gpt or a llama only"))?;
            let cols = layout.linears[l].inputs;
            for m in &unit.weights {
                self.entry(&m.name, &stored_shape(m, cols))?;
            }
            for (name, len) in &unit.vector {
                self.entry(name, &vector_shape(layout, name, *len))?;
            }
        }
        Ok(())
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self.tensors.get(name).ok_or_else(|| {
            bad(&self.dir, format!("has no tensor {name}: it is not a model of the shape its config.json gives"))
        })?;
        if e.shape != shape {
            return Err(bad(&self.dir, format!("tensor {name} is {:?} but config.json makes it {:?}", e.shape, shape)));
        }
        Ok(e)
    }

    /// One tensor's values as `f32`, its shape checked first (a model program's buffers are read this way).
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.read(name, shape)
    }

    /// One tensor's values as `f32`, its shape checked first.
    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entry(name, shape)?;
        let file = File::open(&e.file).map_err(|err| Error::io(format!("opening {}", e.file.display()), err))?;
        let mut bytes = vec![0u8; e.len as usize];
        file.read_exact_at(&mut bytes, e.start)
            .map_err(|err| Error::io(format!("reading {name} from {}", e.file.display()), err))?;
        Ok(match e.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => {
                return Err(bad(&self.dir, format!("tensor {name} is {other:?}; weights must be F32, BF16 or F16")));
            }
        })
    }

    /// Stream unit `l`'s weights (dense, row-major `outputs × inputs`, the matrices stacked; empty for a tied
    /// head) and vector, read from the folder.
    pub fn unit(&self, layout: &ModelLayout, l: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let unit = unit_tensors(layout, l)
            .ok_or_else(|| bad(&self.dir, "pretrained weights are read for a gpt or a llama only"))?;
        let cols = layout.linears[l].inputs;
        let mut weights = Vec::new();
        for m in &unit.weights {
            let values = self.read(&m.name, &stored_shape(m, cols))?;
            weights.extend(if m.transposed { kernels::small::transpose(&values, cols, m.rows) } else { values });
        }
        let mut vector = Vec::new();
        for (name, len) in &unit.vector {
            vector.extend(self.read(name, &vector_shape(layout, name, *len))?);
        }
        Ok((weights, vector))
    }
}

/// The shape matrix `m` of a unit with `cols` inputs has in the folder.
fn stored_shape(m: &Matrix, cols: usize) -> [usize; 2] {
    if m.transposed { [cols, m.rows] } else { [m.rows, cols] }
}

/// The tensors a safetensors file holds, from its header (bounded, and every byte range checked against the
/// file's length and the tensor's type and shape).
fn read_header(dir: &Path, file: &Path) -> Result<Vec<(String, Entry)>> {
    let f = File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
    let size = f.metadata().map_err(|e| Error::io(format!("reading {}", file.display()), e))?.len();
    let mut n = [0u8; 8];
    f.read_exact_at(&mut n, 0)
        .map_err(|_| bad(dir, format!("{} is not a safetensors file (shorter than its header)", file.display())))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES || 8 + n > size {
        return Err(bad(
            dir,
            format!(
                "{} has a header of {n} bytes in a file of {size}: it is damaged or not safetensors",
                file.display()
            ),
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact_at(&mut header, 8).map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    // The header alone (the crate's own reader wants the whole file in memory); each range is checked below.
    let meta: safetensors::tensor::Metadata = serde_json::from_slice(&header)
        .map_err(|e| bad(dir, format!("{}: its header is not safetensors: {e}", file.display())))?;
    let data_start = 8 + n;
    meta.tensors()
        .into_iter()
        .map(|(name, info)| {
            let (a, b) = info.data_offsets;
            let len = (b - a) as u64;
            let want = info.shape.iter().product::<usize>() as u64 * info.dtype.bitsize() as u64 / 8;
            if len != want || data_start + b as u64 > size {
                return Err(bad(
                    dir,
                    format!("{}: tensor {name}'s bytes do not fit its shape or the file", file.display()),
                ));
            }
            Ok((
                name,
                Entry {
                    file: file.to_path_buf(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + a as u64,
                    len,
                },
            ))
        })
        .collect()
}
