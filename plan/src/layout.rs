//! The layout of a model as the appliance sees it: a sequence of weight layers, each one *stream unit* that
//! MemoryX sends and the engine computes in turn. The plan sizes everything from it, and every role builds the
//! same layout from the same spec, so they agree on every unit's shape without telling each other.

use crds::{Activation, ModelKind, ModelSpec};

/// One weight layer: `outputs × inputs` weights plus a bias, dense or masked.
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
    /// The layer whose weights this one reuses instead of storing its own: a tied LM head reads the first
    /// `outputs × inputs` weights of the embedding, and its gradient adds to the embedding's.
    pub tied_to: Option<usize>,
    /// Standard deviation of the initial weights; `None` for He initialisation over the fan-in.
    pub init_std: Option<f32>,
}

impl LinearShape {
    /// A plain layer with a bias and He initialisation, as an MLP is made of.
    pub fn new(inputs: usize, outputs: usize, sparse: bool) -> Self {
        LinearShape { inputs, outputs, sparse, bias: true, tied_to: None, init_std: None }
    }

    /// Weights of the dense matrix, the unit every "dense-equivalent" figure is counted in.
    pub fn dense_weights(&self) -> usize {
        self.inputs * self.outputs
    }

    /// Bias values the layer stores and streams.
    pub fn bias_len(&self) -> usize {
        if self.bias { self.outputs } else { 0 }
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
}

/// What a GPT stream unit is, by its index: the embedding, then four units per block, then the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GptUnit {
    /// Token and position embedding rows.
    Embed,
    /// The block's query, key and value projection.
    Qkv(usize),
    /// The block's attention output projection.
    Proj(usize),
    /// The block's MLP up-projection.
    Up(usize),
    /// The block's MLP down-projection.
    Down(usize),
    /// The LM head.
    Head,
}

impl GptShape {
    /// Stream units: embedding, four per block, head.
    pub fn units(&self) -> usize {
        4 * self.blocks + 2
    }

    /// The unit at index `l`.
    pub fn unit(&self, l: usize) -> GptUnit {
        match l {
            0 => GptUnit::Embed,
            l if l + 1 == self.units() => GptUnit::Head,
            l => {
                let b = (l - 1) / 4;
                match (l - 1) % 4 {
                    0 => GptUnit::Qkv(b),
                    1 => GptUnit::Proj(b),
                    2 => GptUnit::Up(b),
                    _ => GptUnit::Down(b),
                }
            }
        }
    }

    /// Where the embedding rows of token `tok` at position `j` of the shard start (its token row, then its
    /// position's row, which follow the vocabulary's), in a `(vocab + context) × width` row-major matrix.
    pub fn embedding_rows(&self, j: usize, tok: u32) -> (usize, usize) {
        (tok as usize * self.width, (self.vocab + j % self.context.max(1)) * self.width)
    }

    /// Floats one token keeps resident on the engine from the forward pass until the backward pass has used
    /// them: the residual stream, per block the normalised inputs, Q/K/V, the attention probabilities, the
    /// attention output and the MLP's pre- and post-activation, the final norm, and the logits with their
    /// gradient; plus the backward pass's scratch.
    pub fn resident_floats_per_token(&self) -> usize {
        let (d, r) = (self.width, self.hidden);
        let block = 6 * d + 2 * r + self.heads * self.context + 2;
        1 + d + self.blocks * block + d + 1 + 2 * self.vocab + 2 * d + r
    }
}

/// The model family, with what the engine needs to run it beyond the weight layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arch {
    /// Linear layers with a non-linearity after every one but the last.
    Mlp,
    /// A decoder-only transformer over bytes.
    Gpt(GptShape),
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
}

impl ModelLayout {
    /// The layout a validated spec describes.
    pub fn from_spec(spec: &ModelSpec) -> Self {
        match spec.kind {
            ModelKind::Mlp => {
                let sparse = spec.sparsity > 0.0;
                let linears = spec
                    .layers
                    .windows(2)
                    .map(|w| LinearShape::new(w[0] as usize, w[1] as usize, sparse))
                    .collect();
                ModelLayout { linears, arch: Arch::Mlp, activation: spec.activation, sparsity: spec.sparsity }
            }
            ModelKind::Gpt => Self::gpt(spec),
        }
    }

    /// A GPT's stream units. Norms carry no parameters, so every weight sits in one of these matrices:
    /// embedding rows (token rows, then position rows), per block QKV, attention output, MLP up and down
    /// (masked when sparse), and the head, which reuses the token rows when embeddings are tied. Weights start
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
        };
        let sparse = spec.sparsity > 0.0;
        let std = 0.02 / ((1.0 - spec.sparsity) as f32).sqrt();
        let residual_std = std / (2.0 * g.blocks.max(1) as f32).sqrt();
        let unit = |inputs, outputs, sparse, init: f32| LinearShape {
            inputs,
            outputs,
            sparse,
            bias: true,
            tied_to: None,
            init_std: Some(init),
        };
        let mut linears = vec![LinearShape {
            bias: false,
            ..unit(g.width, g.vocab + g.context, false, 0.02)
        }];
        for _ in 0..g.blocks {
            linears.push(unit(g.width, 3 * g.width, sparse, std));
            linears.push(unit(g.width, g.width, sparse, residual_std));
            linears.push(unit(g.width, g.hidden, sparse, std));
            linears.push(unit(g.hidden, g.width, sparse, residual_std));
        }
        linears.push(LinearShape {
            bias: false,
            tied_to: spec.tied_embeddings.then_some(0),
            ..unit(g.width, g.vocab, false, 0.02)
        });
        ModelLayout { linears, arch: Arch::Gpt(g), activation: Activation::Gelu, sparsity: spec.sparsity }
    }

    /// A readable name for stream unit `l`, for plans and logs.
    pub fn unit_name(&self, l: usize) -> String {
        match self.arch {
            Arch::Mlp => format!("fc{}", l + 1),
            Arch::Gpt(g) => match g.unit(l) {
                GptUnit::Embed => "embedding".into(),
                GptUnit::Qkv(b) => format!("block{b}.qkv"),
                GptUnit::Proj(b) => format!("block{b}.attn_out"),
                GptUnit::Up(b) => format!("block{b}.mlp_up"),
                GptUnit::Down(b) => format!("block{b}.mlp_down"),
                GptUnit::Head if self.linears[l].tied_to.is_some() => "head (tied)".into(),
                GptUnit::Head => "head".into(),
            },
        }
    }

    /// Tokens per training sample: 1 for an MLP (a sample is one example), the context length for a GPT (a
    /// sample is one window of text).
    pub fn tokens_per_sample(&self) -> usize {
        match self.arch {
            Arch::Mlp => 1,
            Arch::Gpt(g) => g.context,
        }
    }

    /// Rows of a shard's input matrix: the features of an MLP's first layer, or 1 for a GPT, whose input is a
    /// row of token ids.
    pub fn inputs(&self) -> usize {
        match self.arch {
            Arch::Mlp => self.linears.first().map_or(0, |l| l.inputs),
            Arch::Gpt(_) => 1,
        }
    }

    /// Whether the model reads token ids (a GPT) rather than features.
    pub fn is_language_model(&self) -> bool {
        matches!(self.arch, Arch::Gpt(_))
    }

    /// Output features (classes) of the last layer.
    pub fn outputs(&self) -> usize {
        self.linears.last().map_or(0, |l| l.outputs)
    }

    /// Parameters of the dense model (weights and biases); a tied head counts once, with the embedding.
    pub fn dense_parameters(&self) -> usize {
        self.linears
            .iter()
            .map(|l| if l.tied_to.is_some() { 0 } else { l.dense_weights() } + l.bias_len())
            .sum()
    }

    /// Engine bytes for one shard's activations (`shard` samples), all kept resident from the forward pass
    /// until the backward pass has used them: for an MLP the input plus each layer's pre-activation and
    /// output; for a GPT see [`GptShape::resident_floats_per_token`].
    pub fn activation_bytes(&self, shard: usize) -> u64 {
        let per_token: usize = match self.arch {
            Arch::Mlp => self.inputs() + self.linears.iter().map(|l| 2 * l.outputs).sum::<usize>(),
            Arch::Gpt(g) => g.resident_floats_per_token(),
        };
        4 * (per_token * shard * self.tokens_per_sample()) as u64
    }

    /// Bytes of weights MemoryX stores for the model as the engines receive them (values, plus indices when
    /// sparse, plus biases): what would have to sit on the engine to run it without streaming.
    pub fn weight_bytes(&self) -> u64 {
        (0..self.linears.len()).filter(|&l| self.linears[l].tied_to.is_none()).map(|l| self.forward_stream_bytes(l)).sum()
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
        4 * nnz + index + 4 * shape.bias_len() as u64
    }
}
