//! Hugging Face model folders, in and out of MemoryX: a `LlamaForCausalLM` folder (`config.json` and
//! `model.safetensors`, or shards named by `model.safetensors.index.json`) is read one stream unit at a time, so
//! a model larger than a weight server's memory never sits whole in one process; and the same names write a
//! job's checkpoint back out (`wsctl export`). The mapping between Hugging Face's parameters and the stream
//! units is [`unit_tensors`], the one place it is written.
//!
//! Nothing in the folder is trusted: every header is bounded before it is read, every tensor's byte range is
//! checked against its file, and every shape against the job's model before any value is used.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crds::pretrained::PretrainedShape;
use crds::ModelKind;
use plan::layout::{Arch, DecoderUnit, ModelLayout};
use safetensors::tensor::Dtype;
use wire::error::{Error, Result};

/// The folder's model description.
pub const CONFIG_FILE: &str = "config.json";
/// The weights of an unsharded model.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index naming each tensor's shard in a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
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
        return Err(bad(dir, format!("{name} is {} bytes, more than any model description ({MAX_JSON_BYTES})", meta.len())));
    }
    let text = std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&text).map_err(|e| bad(dir, format!("{name} is not JSON: {e}")))
}

/// The shape a folder's `config.json` describes, in the job's terms; an architecture the appliance cannot run
/// is an error naming it.
pub fn shape_of(dir: &Path) -> Result<PretrainedShape> {
    let c = read_json(dir, CONFIG_FILE)?;
    let arch = c["architectures"].get(0).and_then(|a| a.as_str()).or_else(|| c["model_type"].as_str()).unwrap_or("(none)");
    if c["model_type"].as_str() != Some("llama") && arch != "LlamaForCausalLM" {
        return Err(bad(
            dir,
            format!("its config.json describes {arch}, which the appliance cannot run: it loads LlamaForCausalLM (model_type llama)"),
        ));
    }
    let int = |key: &str| -> Result<u32> {
        c[key].as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| bad(dir, format!("config.json has no {key} (a whole number)")))
    };
    let heads = int("num_attention_heads")?;
    let width = int("hidden_size")?;
    if let Some(dh) = c["head_dim"].as_u64() {
        if heads == 0 || dh != u64::from(width / heads) {
            return Err(bad(dir, format!("head_dim {dh} is not hidden_size / num_attention_heads ({width} / {heads}); the appliance runs heads of that size only")));
        }
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
        return Err(bad(dir, format!("uses rotary scaling '{kind}'; the appliance runs the default rotary embedding only")));
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
    shape_of(dir).map(|s| Some((s, source))).map_err(|e| crds::ApiError::Invalid { field: "spec.model.from".into(), message: e.to_string() })
}

/// Stream unit `l` as Hugging Face names it: the matrices stacked by rows into its weights (in order; none
/// for a tied head, whose weights are the embedding's) and the tensor in its vector (a norm's gain).
#[derive(Clone, Debug, PartialEq)]
pub struct UnitTensors {
    /// The matrices whose rows make up the unit's weights, in order.
    pub weights: Vec<String>,
    /// The unit's vector: the gain of the norm its input passes through.
    pub vector: Option<String>,
}

/// The Hugging Face tensors of stream unit `l` of a Llama `layout` (`LlamaForCausalLM`'s names).
pub fn unit_tensors(layout: &ModelLayout, l: usize) -> Option<UnitTensors> {
    let Arch::Llama(g) = layout.arch else { return None };
    let layer = |b: usize, name: &str| format!("model.layers.{b}.{name}.weight");
    let unit = |weights: Vec<String>, vector: Option<String>| Some(UnitTensors { weights, vector });
    match g.unit(l) {
        DecoderUnit::Embed => unit(vec!["model.embed_tokens.weight".into()], None),
        DecoderUnit::Qkv(b) => unit(
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"].map(|n| layer(b, n)).to_vec(),
            Some(layer(b, "input_layernorm")),
        ),
        DecoderUnit::Proj(b) => unit(vec![layer(b, "self_attn.o_proj")], None),
        DecoderUnit::Up(b) => unit(["mlp.gate_proj", "mlp.up_proj"].map(|n| layer(b, n)).to_vec(), Some(layer(b, "post_attention_layernorm"))),
        DecoderUnit::Down(b) => unit(vec![layer(b, "mlp.down_proj")], None),
        DecoderUnit::Head => {
            let tied = layout.linears.get(l).is_some_and(|s| s.tied_to.is_some());
            unit(if tied { Vec::new() } else { vec!["lm_head.weight".into()] }, Some("model.norm.weight".into()))
        }
    }
}

/// Rows of each matrix [`unit_tensors`] names for unit `l`, in order: how its weights split back apart.
pub fn unit_rows(layout: &ModelLayout, l: usize) -> Vec<usize> {
    let Arch::Llama(g) = layout.arch else { return Vec::new() };
    let dh = g.head_dim();
    match g.unit(l) {
        DecoderUnit::Qkv(_) => vec![g.heads * dh, g.kv_heads * dh, g.kv_heads * dh],
        DecoderUnit::Up(_) => vec![g.intermediate, g.intermediate],
        DecoderUnit::Head if layout.linears[l].tied_to.is_some() => Vec::new(),
        _ => vec![layout.linears[l].outputs],
    }
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
            let map = index["weight_map"].as_object().ok_or_else(|| bad(dir, format!("{INDEX_FILE} has no weight_map")))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
                .into_iter()
                .map(|n| {
                    if n.contains('/') || n.contains("..") || n.is_empty() {
                        return Err(bad(dir, format!("{INDEX_FILE} names the shard '{n}', which is not a file of the folder")));
                    }
                    let p = dir.join(n);
                    if !p.is_file() {
                        return Err(bad(dir, format!("{INDEX_FILE} names the shard {n}, which is missing: copy the whole folder")));
                    }
                    Ok(p)
                })
                .collect::<Result<_>>()?
        } else if dir.join(WEIGHTS_FILE).is_file() {
            vec![dir.join(WEIGHTS_FILE)]
        } else {
            return Err(bad(dir, format!("has neither {WEIGHTS_FILE} nor {INDEX_FILE}: save the model with save_pretrained(..., safe_serialization=True)")));
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
            let Some(unit) = unit_tensors(layout, l) else {
                return Err(bad(&self.dir, "pretrained weights are read for a llama only"));
            };
            let cols = layout.linears[l].inputs;
            for (name, rows) in unit.weights.iter().zip(unit_rows(layout, l)) {
                self.entry(name, &[rows, cols])?;
            }
            if let Some(v) = &unit.vector {
                self.entry(v, &[layout.linears[l].vector_len()])?;
            }
        }
        Ok(())
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self.tensors.get(name).ok_or_else(|| bad(&self.dir, format!("has no tensor {name}: it is not a LlamaForCausalLM of this shape")))?;
        if e.shape != shape {
            return Err(bad(&self.dir, format!("tensor {name} is {:?} but config.json makes it {:?}", e.shape, shape)));
        }
        Ok(e)
    }

    /// One tensor's values as `f32`, its shape checked first.
    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entry(name, shape)?;
        let file = File::open(&e.file).map_err(|err| Error::io(format!("opening {}", e.file.display()), err))?;
        let mut bytes = vec![0u8; e.len as usize];
        file.read_exact_at(&mut bytes, e.start).map_err(|err| Error::io(format!("reading {name} from {}", e.file.display()), err))?;
        Ok(match e.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => return Err(bad(&self.dir, format!("tensor {name} is {other:?}; weights must be F32, BF16 or F16"))),
        })
    }

    /// Stream unit `l`'s weights (dense, row-major `outputs × inputs`, the matrices stacked; empty for a tied
    /// head) and vector, read from the folder.
    pub fn unit(&self, layout: &ModelLayout, l: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let unit = unit_tensors(layout, l).ok_or_else(|| bad(&self.dir, "pretrained weights are read for a llama only"))?;
        let cols = layout.linears[l].inputs;
        let mut weights = Vec::new();
        for (name, rows) in unit.weights.iter().zip(unit_rows(layout, l)) {
            weights.extend(self.read(name, &[rows, cols])?);
        }
        let vector = match &unit.vector {
            Some(v) => self.read(v, &[layout.linears[l].vector_len()])?,
            None => Vec::new(),
        };
        Ok((weights, vector))
    }
}

/// The tensors a safetensors file holds, from its header (bounded, and every byte range checked against the
/// file's length and the tensor's type and shape).
fn read_header(dir: &Path, file: &Path) -> Result<Vec<(String, Entry)>> {
    let f = File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
    let size = f.metadata().map_err(|e| Error::io(format!("reading {}", file.display()), e))?.len();
    let mut n = [0u8; 8];
    f.read_exact_at(&mut n, 0).map_err(|_| bad(dir, format!("{} is not a safetensors file (shorter than its header)", file.display())))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES || 8 + n > size {
        return Err(bad(dir, format!("{} has a header of {n} bytes in a file of {size}: it is damaged or not safetensors", file.display())));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact_at(&mut header, 8).map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    // The header alone (the crate's own reader wants the whole file in memory); each range is checked below.
    let meta: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| bad(dir, format!("{}: its header is not safetensors: {e}", file.display())))?;
    let data_start = 8 + n;
    meta.tensors()
        .into_iter()
        .map(|(name, info)| {
            let (a, b) = info.data_offsets;
            let len = (b - a) as u64;
            let want = info.shape.iter().product::<usize>() as u64 * info.dtype.bitsize() as u64 / 8;
            if len != want || data_start + b as u64 > size {
                return Err(bad(dir, format!("{}: tensor {name}'s bytes do not fit its shape or the file", file.display())));
            }
            Ok((name, Entry { file: file.to_path_buf(), dtype: info.dtype, shape: info.shape.clone(), start: data_start + a as u64, len }))
        })
        .collect()
}
