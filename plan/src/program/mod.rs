//! The model program: the one description of a model every part reads — a graph of operations over
//! activations whose parameters are *stream units* (the matrices MemoryX streams to the engines, one per
//! `linear` or `embedding`) and *vectors* (biases, norm gains, anything else learned), each vector streamed in
//! the vector of the unit whose stage first reads it.
//!
//! A program runs in stages, one per unit: the stage of unit `u` is the operations after unit `u − 1`'s up to
//! and including unit `u`'s own (the last stage also holds everything after it). The engine runs a stage when
//! its unit's weights arrive, forward in unit order and backward in reverse, so activations stay resident and
//! weights come and go as for the built-in families.
//!
//! - [`capture`]: the file the Python package writes from `torch.export`.
//! - [`import`]: that file checked and mapped onto [`Op`]s, or refused naming the operation and its line.

pub mod capture;
pub mod import;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crds::ModelSpec;
use errors::{Error, Result};

/// One size of a value's shape: fixed by the program, or the batch (sequences per engine), known at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// Sequences in the engine's shard.
    Batch,
    /// This many values per sequence of the shard (the batch flattened with other dimensions).
    PerBatch(usize),
    /// A size the program fixes.
    Fixed(usize),
}

impl Dim {
    /// The size for a shard of `batch` sequences.
    pub fn at(self, batch: usize) -> usize {
        match self {
            Dim::Batch => batch,
            Dim::PerBatch(k) => k * batch,
            Dim::Fixed(n) => n,
        }
    }
}

/// A value's shape, row-major as PyTorch's.
pub type Shape = Vec<Dim>;

/// The shape for a shard of `batch` sequences.
pub fn resolve(shape: &[Dim], batch: usize) -> Vec<usize> {
    shape.iter().map(|d| d.at(batch)).collect()
}

/// Element-wise functions of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    /// −x.
    Neg,
    /// max(0, x).
    Relu,
    /// x·σ(x).
    Silu,
    /// x·Φ(x), exactly.
    Gelu,
    /// GELU's tanh approximation.
    GeluTanh,
    /// eˣ.
    Exp,
    /// cos x.
    Cos,
    /// sin x.
    Sin,
    /// 1/√x.
    Rsqrt,
    /// √x.
    Sqrt,
    /// 1/x.
    Reciprocal,
    /// tanh x.
    Tanh,
    /// σ(x).
    Sigmoid,
    /// erf x.
    Erf,
    /// ln x.
    Log,
    /// |x|.
    Abs,
    /// x, unchanged (`contiguous`, `clone`, dtype casts between floats).
    Identity,
}

/// Element-wise functions of two values (broadcast as NumPy does), or of a value and a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// a + b.
    Add,
    /// a − b.
    Sub,
    /// a · b.
    Mul,
    /// a / b.
    Div,
    /// aᵇ (with a number on one side only).
    Pow,
}

/// Comparisons, giving 1 where they hold and 0 elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// a = b.
    Eq,
    /// a ≠ b.
    Ne,
    /// a < b.
    Lt,
    /// a ≤ b.
    Le,
    /// a > b.
    Gt,
    /// a ≥ b.
    Ge,
}

impl Cmp {
    /// Whether `a` and `b` compare so.
    pub fn holds(self, a: f32, b: f32) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
}

/// How an attention mask input reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Booleans: a key is attended where the mask is true.
    Keep,
    /// Numbers added to the scores (−∞ masks).
    Additive,
}

/// One operation of a program. Its inputs are other nodes' outputs, in the order each variant names.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The shard's token ids, `[batch, context]`.
    Tokens,
    /// A buffer of the module (a rotary table, a mask), by its name in the weights file.
    Constant {
        /// Its state-dict name.
        name: String,
    },
    /// A learned parameter that is not a unit's matrix: streamed in its stage's unit vector at `offset`.
    Vector {
        /// The parameter.
        param: usize,
        /// Where its values start in the unit's vector.
        offset: usize,
    },
    /// `x · Wᵀ (+ b)` over the last dimension, `W` being unit `unit`'s matrix. Input: `x`.
    Linear {
        /// The unit.
        unit: usize,
    },
    /// Rows of unit `unit`'s matrix looked up by index. Input: the indices.
    Embedding {
        /// The unit.
        unit: usize,
    },
    /// Layer norm over the last dimension. Inputs: `x`, then the gain and the bias when present.
    LayerNorm {
        /// Added to the variance.
        eps: f32,
        /// Whether a gain input follows.
        gain: bool,
        /// Whether a bias input follows.
        bias: bool,
    },
    /// RMS norm over the last dimension. Inputs: `x`, then the gain when present.
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
        /// Whether a gain input follows.
        gain: bool,
    },
    /// An element-wise function. Input: `x`.
    Unary(Unary),
    /// An element-wise function of two inputs, broadcast.
    Binary(Binary),
    /// An element-wise function of `x` and a number: `x ∘ value`, or `value ∘ x` when `reversed`.
    Scalar {
        /// The function.
        op: Binary,
        /// The number.
        value: f32,
        /// Whether the number is the left operand.
        reversed: bool,
    },
    /// Mean over `dims`. Input: `x`.
    Mean {
        /// The dimensions reduced.
        dims: Vec<usize>,
        /// Whether they stay as size 1.
        keep: bool,
    },
    /// Sum over `dims`. Input: `x`.
    Sum {
        /// The dimensions reduced.
        dims: Vec<usize>,
        /// Whether they stay as size 1.
        keep: bool,
    },
    /// Softmax along the last dimension. Input: `x`.
    Softmax,
    /// The same values in the node's shape (`view`, `reshape`, `unsqueeze`, `flatten`). Input: `x`.
    Reshape,
    /// Dimensions reordered: output dimension `i` is input dimension `dims[i]`. Input: `x`.
    Permute {
        /// The order.
        dims: Vec<usize>,
    },
    /// Every `step`-th index from `start` up to `end` along `dim`. Input: `x`.
    Slice {
        /// The dimension.
        dim: usize,
        /// The first index.
        start: usize,
        /// One past the last index.
        end: usize,
        /// The stride.
        step: usize,
    },
    /// The inputs joined along `dim`.
    Cat {
        /// The dimension.
        dim: usize,
    },
    /// The input broadcast to the node's shape. Input: `x`.
    Expand,
    /// Each index along `dim` repeated `repeats` times in place. Input: `x`.
    RepeatInterleave {
        /// Copies of each.
        repeats: usize,
        /// The dimension.
        dim: usize,
    },
    /// Scaled dot-product attention over `[.., heads, tokens, head_dim]`. Inputs: queries, keys, values, and
    /// the mask when there is one (broadcast to `[.., heads, tokens, keys]`).
    Attention {
        /// Whether each token attends only to itself and earlier ones.
        causal: bool,
        /// The scale of the scores; `None` for 1/√head_dim.
        scale: Option<f32>,
        /// How the fourth input masks the scores, when there is one.
        mask: Option<Mask>,
    },
    /// A batched matrix product over the last two dimensions, leading ones broadcast. Inputs: `a`, `b`.
    MatMul,
    /// `start, start + step, …` in the node's (one-dimensional) shape.
    Arange {
        /// The first value.
        start: f32,
        /// The difference between neighbours.
        step: f32,
    },
    /// 1 where `x` compares so with `value` (or, without one, with the second input, broadcast), else 0.
    Compare {
        /// The comparison.
        cmp: Cmp,
        /// The number compared with; `None` for a second input.
        value: Option<f32>,
    },
    /// Running sums along `dim`. Input: `x`.
    Cumsum {
        /// The dimension.
        dim: usize,
    },
    /// `value` everywhere, in the node's shape.
    Fill {
        /// The value.
        value: f32,
    },
    /// `x[i₀, i₁, …]` with index tensors for its leading dimensions, broadcast together. Inputs: `x`, the indices.
    Index,
    /// `a` where the condition is non-zero, else `b`, broadcast. Inputs: the condition, `a`, `b`.
    Where,
    /// `x` limited to `[min, max]` (either bound optional). Input: `x`.
    Clamp {
        /// The lower bound.
        min: Option<f32>,
        /// The upper bound.
        max: Option<f32>,
    },
    /// `x` with the elements of its last two dimensions on one side of a diagonal set to 0: below it kept
    /// (`tril`), or above it (`triu`). Input: `x`.
    Triangle {
        /// Whether the upper triangle is kept (`triu`).
        upper: bool,
        /// The diagonal, 0 the main one, positive above it.
        diagonal: i64,
    },
    /// Log-softmax along the last dimension. Input: `x`.
    LogSoftmax,
    /// The largest value over `dims` (its gradient goes to the first position holding it). Input: `x`.
    Amax {
        /// The dimensions reduced.
        dims: Vec<usize>,
        /// Whether they stay as size 1.
        keep: bool,
    },
    /// `value` where the mask is non-zero, else `x`. Inputs: `x`, the mask (broadcast).
    MaskedFill {
        /// The value written.
        value: f32,
    },
}

/// One node: an operation, its inputs and the shape of its output.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it computes.
    pub op: Op,
    /// The nodes whose outputs it reads.
    pub inputs: Vec<usize>,
    /// Its output's shape.
    pub shape: Shape,
    /// Whether a gradient flows back through its output (it depends on a learned parameter).
    pub learns: bool,
    /// Where the model's source makes it.
    pub source: String,
}

/// What kind of matrix a unit holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitKind {
    /// `outputs × inputs` weights applied to the last dimension.
    Linear,
    /// `rows × width` rows looked up by index (`outputs` = rows, `inputs` = width, as a tied head reads it).
    Embedding,
}

/// A stream unit: one matrix, plus the vector it streams beside it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// The state-dict name of its matrix.
    pub name: String,
    /// Linear or embedding.
    pub kind: UnitKind,
    /// Columns of the matrix (input features, or the embedding's width).
    pub inputs: usize,
    /// Rows of the matrix (output features, or the embedding's rows).
    pub outputs: usize,
    /// The state-dict name of its bias, which leads its vector.
    pub bias: Option<String>,
    /// The unit whose matrix it reads instead of its own (a head tied to the embedding).
    pub tied_to: Option<usize>,
    /// Whether the module stores the matrix `inputs × outputs` (`x @ W`, GPT-2's `Conv1D`) rather than
    /// `outputs × inputs` (`nn.Linear`); the unit streams it `outputs × inputs` either way.
    pub transposed: bool,
    /// The node that applies it.
    pub node: usize,
    /// The vector parameters its stage reads (after the bias), in the order they sit in its vector.
    pub vectors: Vec<usize>,
}

/// A learned parameter that is not a matrix of a unit.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Its state-dict name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl Param {
    /// Its number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A checked model program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    /// The module's class name.
    pub module: String,
    /// Nodes in execution order; a node's inputs always come before it.
    pub nodes: Vec<Node>,
    /// The stream units, in the order the engine computes them.
    pub units: Vec<Unit>,
    /// The vector parameters.
    pub params: Vec<Param>,
    /// The buffers the program reads, by name, with their shapes.
    pub constants: Vec<Param>,
    /// The node holding the logits, `[batch, context, vocab]`.
    pub output: usize,
    /// Tokens per sequence.
    pub context: usize,
    /// The vocabulary the logits cover.
    pub vocab: usize,
    /// The folder it was read from, whose weights file holds its buffers.
    pub folder: PathBuf,
}

impl Program {
    /// The nodes unit `u`'s stage runs.
    pub fn stage(&self, u: usize) -> Range<usize> {
        let start = if u == 0 { 0 } else { self.units[u - 1].node + 1 };
        let end = if u + 1 == self.units.len() { self.nodes.len() } else { self.units[u].node + 1 };
        start..end
    }

    /// Values in unit `u`'s vector: its bias, then its stage's vector parameters.
    pub fn vector_len(&self, u: usize) -> usize {
        let unit = &self.units[u];
        let bias = if unit.bias.is_some() { unit.outputs } else { 0 };
        bias + unit.vectors.iter().map(|&p| self.params[p].len()).sum::<usize>()
    }

    /// Floats of activations one sequence keeps from the forward pass to the backward pass: every value a
    /// node computes that depends on the batch (the rest, such as rotary tables, is counted once).
    pub fn resident_floats(&self, batch: usize) -> usize {
        self.nodes.iter().map(|n| resolve(&n.shape, batch).iter().product::<usize>()).sum()
    }
}

impl Program {
    /// A program with no nodes or units, shaped as `spec` says: the layout of a program that could not be read.
    pub fn empty(spec: &ModelSpec) -> Program {
        Program {
            module: String::new(),
            nodes: Vec::new(),
            units: Vec::new(),
            params: Vec::new(),
            constants: Vec::new(),
            output: 0,
            context: spec.context_length.unwrap_or(0) as usize,
            vocab: spec.vocab_size as usize,
            folder: PathBuf::new(),
        }
    }
}

/// Programs read so far in this process, by folder: every role lays the model out more than once.
fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<Program>>> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Arc<Program>>>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// The program in `folder`, read once per process.
pub fn load(folder: &Path) -> Result<Arc<Program>> {
    if let Some(p) = cache().lock().ok().and_then(|c| c.get(folder).cloned()) {
        return Ok(p);
    }
    let program = Arc::new(Program { folder: folder.to_path_buf(), ..import::read(folder)? });
    if let Ok(mut c) = cache().lock() {
        c.insert(folder.to_path_buf(), program.clone());
    }
    Ok(program)
}

/// The program a job of kind `program` names in `spec.model.from`, checked to read the sequences the job says
/// (`contextLength`, `vocabSize`).
pub fn for_spec(spec: &ModelSpec) -> Result<Arc<Program>> {
    let from =
        spec.from.as_deref().ok_or_else(|| Error::Plan("a program job names its folder in spec.model.from".into()))?;
    let program = load(Path::new(from))?;
    let context = spec.context_length.unwrap_or(0) as usize;
    if (program.context, program.vocab) != (context, spec.vocab_size as usize) {
        return Err(Error::Plan(format!(
            "the program in {from} reads sequences of {} tokens of a vocabulary of {}, but the job says \
             contextLength {context} and vocabSize {}: set them to the program's (wsctl model {from} prints them)",
            program.context, program.vocab, spec.vocab_size
        )));
    }
    Ok(program)
}
