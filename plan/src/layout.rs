//! The layout of a model as the appliance sees it: a sequence of weight layers, each one *stream unit* that
//! MemoryX sends and the engine computes in turn. The plan sizes everything from it, and every role builds the
//! same layout from the same spec, so they agree on every unit's shape without telling each other.

use std::sync::Arc;

use crate::program::{Program, UnitKind};
use crds::{Activation, LayerNorm, ModelKind, ModelSpec};

/// A Llama's rotary base when the job does not set one (`transformers`' default).
pub const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// A Llama's RMSNorm epsilon when the job does not set one.
pub const DEFAULT_NORM_EPS: f64 = 1e-5;

/// The learned parameters of the norm a unit's input passes through, which stream in the unit's vector after
/// its bias: so a stream unit stays one matrix and one vector, and MemoryX stores, updates and checkpoints
/// them like biases (no weight decay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InputNorm {
    /// No norm, or one without parameters.
    #[default]
    None,
    /// An RMSNorm's gain (`inputs` values, starting at 1): a Llama's.
    Gain,
    /// A layer norm's gain and then its bias (`inputs` values each, starting at 1 and 0): a GPT-2's.
    GainBias,
    /// The vector parameters a model program's stage reads (norm gains, biases other than the unit's own):
    /// this many values in all, whatever the unit's width. They start from the captured module's values.
    Values(usize),
}

impl InputNorm {
    /// Values per input feature.
    pub fn per_input(self) -> usize {
        match self {
            InputNorm::None => 0,
            InputNorm::Gain => 1,
            InputNorm::GainBias => 2,
            InputNorm::Values(_) => 0,
        }
    }

    /// Values in all for a unit of `inputs` input features.
    pub fn values(self, inputs: usize) -> usize {
        match self {
            InputNorm::Values(n) => n,
            other => other.per_input() * inputs,
        }
    }
}

/// One weight layer: `outputs × inputs` weights plus one vector (its bias, then the parameters of the norm its
/// input passes through), dense or masked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearShape {
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// Whether only a masked subset of the weights exists.
    pub sparse: bool,
    /// Whether the layer adds a bias (embeddings and LM heads do not).
    pub bias: bool,
    /// The parameters of the norm its input passes through, carried after the bias.
    pub norm: InputNorm,
    /// The layer whose weights this one reuses instead of storing its own: a tied LM head reads the first
    /// `outputs × inputs` weights of the embedding, and its gradient adds to the embedding's.
    pub tied_to: Option<usize>,
    /// Standard deviation of the initial weights; `None` for He initialisation over the fan-in.
    pub init_std: Option<f32>,
}

impl LinearShape {
    /// A plain layer with a bias and He initialisation, as an MLP is made of.
    pub fn new(inputs: usize, outputs: usize, sparse: bool) -> Self {
        LinearShape { inputs, outputs, sparse, bias: true, norm: InputNorm::None, tied_to: None, init_std: None }
    }

    /// Weights of the dense matrix, the unit every "dense-equivalent" figure is counted in.
    pub fn dense_weights(&self) -> usize {
        self.inputs * self.outputs
    }

    /// Values of the unit's bias: `outputs` when it has one.
    pub fn bias_len(&self) -> usize {
        if self.bias { self.outputs } else { 0 }
    }

    /// Values of the unit's vector, which it stores and streams beside the weights: its bias, then its input
    /// norm's parameters.
    pub fn vector_len(&self) -> usize {
        self.bias_len() + self.norm.values(self.inputs)
    }

    /// The vector a fresh model starts with: the bias at 0, a norm's gain at 1 (the identity) and its bias at 0.
    pub fn initial_vector(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.vector_len()];
        if matches!(self.norm, InputNorm::Gain | InputNorm::GainBias) {
            let gain = self.bias_len();
            v[gain..gain + self.inputs].fill(1.0);
        }
        v
    }
}

/// The shape of a GPT, what the engine needs beyond the list of stream units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptShape {
    /// Tokens (256 bytes).
    pub vocab: usize,
    /// Tokens per sequence.
    pub context: usize,
    /// Residual-stream features.
    pub width: usize,
    /// Attention heads.
    pub heads: usize,
    /// Transformer blocks.
    pub blocks: usize,
    /// Hidden features of each block's MLP.
    pub hidden: usize,
    /// Whether the layer norms learn a gain and a bias (GPT-2's), streamed with the unit that reads each.
    pub affine_norms: bool,
}

/// What a decoder's (GPT's or Llama's) stream unit is, by its index: the embedding, then four units per block,
/// then the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderUnit {
    /// Token and position embedding rows.
    Embed,
    /// The block's query, key and value projection.
    Qkv(usize),
    /// The block's attention output projection.
    Proj(usize),
    /// The block's MLP up-projection (a Llama's gate and up projections, stacked).
    Up(usize),
    /// The block's MLP down-projection.
    Down(usize),
    /// The LM head.
    Head,
}

impl DecoderUnit {
    /// Unit `l` of a decoder of `blocks` blocks.
    pub fn of(blocks: usize, l: usize) -> DecoderUnit {
        match l {
            0 => DecoderUnit::Embed,
            l if l == 4 * blocks + 1 => DecoderUnit::Head,
            l => {
                let b = (l - 1) / 4;
                match (l - 1) % 4 {
                    0 => DecoderUnit::Qkv(b),
                    1 => DecoderUnit::Proj(b),
                    2 => DecoderUnit::Up(b),
                    _ => DecoderUnit::Down(b),
                }
            }
        }
    }
}

impl GptShape {
    /// Stream units: embedding, four per block, head.
    pub fn units(&self) -> usize {
        4 * self.blocks + 2
    }

    /// The unit at index `l`.
    pub fn unit(&self, l: usize) -> DecoderUnit {
        DecoderUnit::of(self.blocks, l)
    }

    /// Where the embedding rows of token `tok` at position `j` of the shard start (its token row, then its
    /// position's row, which follow the vocabulary's), in a `(vocab + context) × width` row-major matrix.
    pub fn embedding_rows(&self, j: usize, tok: u32) -> (usize, usize) {
        (tok as usize * self.width, (self.vocab + j % self.context.max(1)) * self.width)
    }

    /// Floats one token keeps resident on the engine from the forward pass until the backward pass has used
    /// them: the residual stream, per block the normalised inputs (and with affine norms their copies before
    /// the gain), Q/K/V, the attention probabilities, the attention output and the MLP's pre- and
    /// post-activation, the final norm, and the logits with their gradient; plus the backward pass's scratch.
    pub fn resident_floats_per_token(&self) -> usize {
        let (d, r) = (self.width, self.hidden);
        let affine = usize::from(self.affine_norms);
        let block = (6 + 2 * affine) * d + 2 * r + self.heads * self.context + 2;
        1 + d + self.blocks * block + (1 + affine) * d + 1 + 2 * self.vocab + 2 * d + r
    }
}

/// The shape of a Llama-architecture decoder, what the engine needs beyond the list of stream units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaShape {
    /// Tokens of the vocabulary.
    pub vocab: usize,
    /// Tokens per sequence (rotary positions run from 0 to `context - 1` in each).
    pub context: usize,
    /// Residual-stream features.
    pub width: usize,
    /// Query heads; each attends over `width / heads` features.
    pub heads: usize,
    /// Key/value heads: query head `h` reads key/value head `h / (heads / kv_heads)`.
    pub kv_heads: usize,
    /// Transformer blocks.
    pub blocks: usize,
    /// Hidden features of each block's SwiGLU MLP.
    pub intermediate: usize,
    /// Base of the rotary position embedding.
    pub rope_theta: f64,
    /// Added to the mean square in every RMSNorm.
    pub norm_eps: f64,
}

impl LlamaShape {
    /// Features of one head.
    pub fn head_dim(&self) -> usize {
        self.width / self.heads.max(1)
    }

    /// Rows of the QKV unit's output: the queries of every head, then the keys and the values of every
    /// key/value head.
    pub fn qkv_rows(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim()
    }

    /// The unit at index `l`.
    pub fn unit(&self, l: usize) -> DecoderUnit {
        DecoderUnit::of(self.blocks, l)
    }

    /// Floats one token keeps resident on the engine from the forward pass until the backward pass has used
    /// them: the residual stream; per block the normalised inputs and their gained copies, Q/K/V, the attention
    /// probabilities and output, the MLP's gate and up outputs and their product; the final norm, the logits
    /// with their gradient, and the backward pass's scratch.
    pub fn resident_floats_per_token(&self) -> usize {
        let (d, r) = (self.width, self.intermediate);
        let block = 5 * d + self.qkv_rows() + self.heads * self.context + 3 * r + 2;
        1 + d + self.blocks * block + 2 * d + 1 + 2 * self.vocab + 2 * d + 2 * r
    }
}

/// The model family, with what the engine needs to run it beyond the weight layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arch {
    /// Linear layers with a non-linearity after every one but the last.
    Mlp,
    /// A decoder-only transformer over bytes.
    Gpt(GptShape),
    /// A Llama-architecture decoder.
    Llama(LlamaShape),
    /// A model program (its graph in [`ModelLayout::program`]).
    Program(ProgramShape),
}

/// What the roles need of a model program beyond its units: the sequences it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramShape {
    /// Tokens per sequence.
    pub context: usize,
    /// Tokens of the vocabulary.
    pub vocab: usize,
}

/// The model as a sequence of stream units, shared by MemoryX (what to store and send), the engine (what to
/// compute) and the plan (what it costs).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLayout {
    /// The weight layers in forward order.
    pub linears: Vec<LinearShape>,
    /// The family, and for a GPT its shape.
    pub arch: Arch,
    /// The non-linearity after every layer but the last.
    pub activation: Activation,
    /// The fraction of zeros in every sparse layer's mask.
    pub sparsity: f64,
    /// A model program's graph (with [`Arch::Program`]).
    pub program: Option<Arc<Program>>,
}

impl ModelLayout {
    /// The layout a validated spec describes.
    pub fn from_spec(spec: &ModelSpec) -> Self {
        match spec.kind {
            ModelKind::Mlp => {
                let sparse = spec.sparsity > 0.0;
                let linears =
                    spec.layers.windows(2).map(|w| LinearShape::new(w[0] as usize, w[1] as usize, sparse)).collect();
                ModelLayout {
                    linears,
                    arch: Arch::Mlp,
                    activation: spec.activation,
                    sparsity: spec.sparsity,
                    program: None,
                }
            }
            ModelKind::Gpt => Self::gpt(spec),
            ModelKind::Llama => Self::llama(spec),
            ModelKind::Program => match crate::program::for_spec(spec) {
                Ok(program) => Self::of_program(spec, program),
                // The roles load the program before they lay it out and report why it failed; a layout without
                // units is what any other reader of a program that cannot be read gets.
                Err(_) => Self::of_program(spec, Arc::new(Program::empty(spec))),
            },
        }
    }

    /// A model program's stream units: its units in order, linear ones masked when the job is sparse (an
    /// embedding and a tied head never), each with its bias and its stage's vector parameters.
    pub fn of_program(spec: &ModelSpec, program: Arc<Program>) -> Self {
        let linears = (0..program.units.len())
            .map(|u| {
                let unit = &program.units[u];
                let bias = unit.bias.is_some();
                let own = program.vector_len(u) - if bias { unit.outputs } else { 0 };
                LinearShape {
                    inputs: unit.inputs,
                    outputs: unit.outputs,
                    sparse: spec.sparsity > 0.0 && unit.kind == UnitKind::Linear && unit.tied_to.is_none(),
                    bias,
                    norm: if own > 0 { InputNorm::Values(own) } else { InputNorm::None },
                    tied_to: unit.tied_to,
                    init_std: Some(0.02),
                }
            })
            .collect();
        let shape = ProgramShape { context: program.context, vocab: program.vocab };
        ModelLayout {
            linears,
            arch: Arch::Program(shape),
            activation: Activation::Gelu,
            sparsity: spec.sparsity,
            program: Some(program),
        }
    }

    /// A Llama's stream units: the token embedding; per block QKV (queries, keys and values stacked, with the
    /// attention norm's gain), attention output, gate and up stacked (with the MLP norm's gain) and down (the
    /// four masked when sparse); the head (with the final norm's gain), which reuses the embedding when tied.
    /// No biases. Weights start as `transformers` starts them (σ = 0.02), widened by 1/√density for masked
    /// layers; gains at 1.
    fn llama(spec: &ModelSpec) -> Self {
        let heads = spec.heads.unwrap_or(1).max(1) as usize;
        let g = LlamaShape {
            vocab: spec.vocab_size as usize,
            context: spec.context_length.unwrap_or(0) as usize,
            width: spec.width.unwrap_or(0) as usize,
            heads,
            kv_heads: spec.kv_heads.map_or(heads, |k| k.max(1) as usize),
            blocks: spec.blocks.unwrap_or(0) as usize,
            intermediate: spec.intermediate_size.unwrap_or(0) as usize,
            rope_theta: spec.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
            norm_eps: spec.norm_eps.unwrap_or(DEFAULT_NORM_EPS),
        };
        let sparse = spec.sparsity > 0.0;
        let std = 0.02 / ((1.0 - spec.sparsity) as f32).sqrt();
        let unit = |inputs, outputs, sparse, norm, init: f32| LinearShape {
            inputs,
            outputs,
            sparse,
            bias: false,
            norm,
            tied_to: None,
            init_std: Some(init),
        };
        let (none, gain) = (InputNorm::None, InputNorm::Gain);
        let mut linears = vec![unit(g.width, g.vocab, false, none, 0.02)];
        for _ in 0..g.blocks {
            linears.push(unit(g.width, g.qkv_rows(), sparse, gain, std));
            linears.push(unit(g.heads * g.head_dim(), g.width, sparse, none, std));
            linears.push(unit(g.width, 2 * g.intermediate, sparse, gain, std));
            linears.push(unit(g.intermediate, g.width, sparse, none, std));
        }
        linears.push(LinearShape {
            tied_to: spec.tied_embeddings.then_some(0),
            ..unit(g.width, g.vocab, false, gain, 0.02)
        });
        ModelLayout {
            linears,
            arch: Arch::Llama(g),
            activation: Activation::Gelu,
            sparsity: spec.sparsity,
            program: None,
        }
    }

    /// A GPT's stream units: embedding rows (token rows, then position rows), per block QKV, attention output,
    /// MLP up and down (masked when sparse), and the head, which reuses the token rows when embeddings are
    /// tied. Plain norms carry no parameters, so every weight sits in one of these matrices; affine norms
    /// (GPT-2's) stream their gain and bias with the unit that reads them (QKV, MLP up, head). Weights start
    /// as in GPT-2 (σ = 0.02, residual projections scaled down by √(2·blocks)), widened by 1/√density for
    /// masked layers so their outputs keep the same variance.
    fn gpt(spec: &ModelSpec) -> Self {
        let g = GptShape {
            vocab: spec.vocab_size as usize,
            context: spec.context_length.unwrap_or(0) as usize,
            width: spec.width.unwrap_or(0) as usize,
            heads: spec.heads.unwrap_or(1).max(1) as usize,
            blocks: spec.blocks.unwrap_or(0) as usize,
            hidden: (spec.mlp_ratio * spec.width.unwrap_or(0)) as usize,
            affine_norms: spec.layer_norm == Some(LayerNorm::Affine),
        };
        let read_norm = if g.affine_norms { InputNorm::GainBias } else { InputNorm::None };
        let sparse = spec.sparsity > 0.0;
        let std = 0.02 / ((1.0 - spec.sparsity) as f32).sqrt();
        let residual_std = std / (2.0 * g.blocks.max(1) as f32).sqrt();
        let unit = |inputs, outputs, sparse, init: f32| LinearShape {
            inputs,
            outputs,
            sparse,
            bias: true,
            norm: InputNorm::None,
            tied_to: None,
            init_std: Some(init),
        };
        let mut linears = vec![LinearShape { bias: false, ..unit(g.width, g.vocab + g.context, false, 0.02) }];
        for _ in 0..g.blocks {
            linears.push(LinearShape { norm: read_norm, ..unit(g.width, 3 * g.width, sparse, std) });
            linears.push(unit(g.width, g.width, sparse, residual_std));
            linears.push(LinearShape { norm: read_norm, ..unit(g.width, g.hidden, sparse, std) });
            linears.push(unit(g.hidden, g.width, sparse, residual_std));
        }
        linears.push(LinearShape {
            bias: false,
            norm: read_norm,
            tied_to: spec.tied_embeddings.then_some(0),
            ..unit(g.width, g.vocab, false, 0.02)
        });
        ModelLayout {
            linears,
            arch: Arch::Gpt(g),
            activation: Activation::Gelu,
            sparsity: spec.sparsity,
            program: None,
        }
    }

    /// A readable name for stream unit `l`, for plans and logs.
    pub fn unit_name(&self, l: usize) -> String {
        match self.arch {
            Arch::Program(_) => match &self.program {
                Some(p) if p.units[l].tied_to.is_some() => format!("{} (tied)", p.units[l].name),
                Some(p) => p.units[l].name.clone(),
                None => format!("unit{l}"),
            },
            Arch::Mlp => format!("fc{}", l + 1),
            Arch::Llama(g) => match g.unit(l) {
                DecoderUnit::Embed => "embedding".into(),
                DecoderUnit::Qkv(b) => format!("block{b}.norm+qkv"),
                DecoderUnit::Proj(b) => format!("block{b}.attn_out"),
                DecoderUnit::Up(b) => format!("block{b}.norm+gate_up"),
                DecoderUnit::Down(b) => format!("block{b}.mlp_down"),
                DecoderUnit::Head if self.linears[l].tied_to.is_some() => "norm+head (tied)".into(),
                DecoderUnit::Head => "norm+head".into(),
            },
            Arch::Gpt(g) => match g.unit(l) {
                DecoderUnit::Embed => "embedding".into(),
                DecoderUnit::Qkv(b) => format!("block{b}.qkv"),
                DecoderUnit::Proj(b) => format!("block{b}.attn_out"),
                DecoderUnit::Up(b) => format!("block{b}.mlp_up"),
                DecoderUnit::Down(b) => format!("block{b}.mlp_down"),
                DecoderUnit::Head if self.linears[l].tied_to.is_some() => "head (tied)".into(),
                DecoderUnit::Head => "head".into(),
            },
        }
    }

    /// Tokens per training sample: 1 for an MLP (a sample is one example), the context length for a GPT (a
    /// sample is one window of text).
    pub fn tokens_per_sample(&self) -> usize {
        match self.arch {
            Arch::Mlp => 1,
            Arch::Gpt(g) => g.context,
            Arch::Llama(g) => g.context,
            Arch::Program(p) => p.context,
        }
    }

    /// Rows of a shard's input matrix: the features of an MLP's first layer, or 1 for a GPT, whose input is a
    /// row of token ids.
    pub fn inputs(&self) -> usize {
        match self.arch {
            Arch::Mlp => self.linears.first().map_or(0, |l| l.inputs),
            Arch::Gpt(_) | Arch::Llama(_) | Arch::Program(_) => 1,
        }
    }

    /// Whether the model reads token ids (a GPT or a Llama) rather than features.
    pub fn is_language_model(&self) -> bool {
        matches!(self.arch, Arch::Gpt(_) | Arch::Llama(_) | Arch::Program(_))
    }

    /// Output features (classes) of the last layer.
    pub fn outputs(&self) -> usize {
        self.linears.last().map_or(0, |l| l.outputs)
    }

    /// Engine bytes for one shard's activations (`shard` samples), all kept resident from the forward pass
    /// until the backward pass has used them: for an MLP the input plus each layer's pre-activation and
    /// output; for a GPT see [`GptShape::resident_floats_per_token`]; for a program every value its graph computes
    /// and its gradient.
    pub fn activation_bytes(&self, shard: usize) -> u64 {
        let per_token: usize = match self.arch {
            Arch::Mlp => self.inputs() + self.linears.iter().map(|l| 2 * l.outputs).sum::<usize>(),
            Arch::Gpt(g) => g.resident_floats_per_token(),
            Arch::Llama(g) => g.resident_floats_per_token(),
            Arch::Program(p) => {
                let per_sequence = self.program.as_ref().map_or(0, |program| program.resident_floats(1));
                // Values and, during the backward pass, their gradients.
                return 8 * (per_sequence * shard) as u64 + 4 * (p.context * shard) as u64;
            }
        };
        4 * (per_token * shard * self.tokens_per_sample()) as u64
    }

    /// Bytes of weights MemoryX stores for the model as the engines receive them (values, plus indices when
    /// sparse, plus biases): what would have to sit on the engine to run it without streaming.
    pub fn weight_bytes(&self) -> u64 {
        (0..self.linears.len())
            .filter(|&l| self.linears[l].tied_to.is_none())
            .map(|l| self.forward_stream_bytes(l))
            .sum()
    }
}

impl ModelLayout {
    /// Weights layer `l` is expected to keep: all of them when dense, `1 − sparsity` of them when masked.
    pub fn expected_weights(&self, l: usize) -> usize {
        let shape = self.linears[l];
        if shape.sparse {
            ((1.0 - self.sparsity) * shape.dense_weights() as f64).round() as usize
        } else {
            shape.dense_weights()
        }
    }

    /// Expected bytes of layer `l`'s forward stream: values (and a 4-byte index each plus line pointers when
    /// sparse) and the bias. The engine reserves this much for the layer it prefetches.
    pub fn forward_stream_bytes(&self, l: usize) -> u64 {
        let shape = self.linears[l];
        let nnz = self.expected_weights(l) as u64;
        let index = if shape.sparse { 4 * nnz + 4 * (2 * shape.outputs as u64 + 1) } else { 0 };
        4 * nnz + index + 4 * shape.vector_len() as u64
    }
}
