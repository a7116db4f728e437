//! A pretrained model a job starts from (`spec.model.from`): the shape its `config.json` gives, and how that
//! shape fills in the job's model (a Hugging Face GPT-2 or Llama, or an MLP as `wsctl export --format
//! safetensors` writes it). Reading the folder is the runtime's business
//! (`runtime::memoryx::huggingface`); deciding what the job then is happens here, once, so a local run, a
//! submission and a test all get the same spec and the same errors.

use crate::error::ApiError;
use crate::spec::{Activation, LayerNorm, ModelKind, ModelSpec};

/// What a pretrained model's `config.json` says about its shape, in the job's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct PretrainedShape {
    /// The family the architecture maps to.
    pub kind: ModelKind,
    /// Tokens of the vocabulary (`vocab_size`).
    pub vocab_size: u32,
    /// Residual-stream features (`hidden_size`).
    pub width: u32,
    /// Query heads (`num_attention_heads`).
    pub heads: u32,
    /// Key/value heads (`num_key_value_heads`).
    pub kv_heads: u32,
    /// Blocks (`num_hidden_layers`).
    pub blocks: u32,
    /// Hidden features of each block's MLP: a Llama's SwiGLU (`intermediate_size`), a GPT-2's (`n_inner`, else
    /// four times the width).
    pub intermediate_size: u32,
    /// Rotary base (`rope_theta`).
    pub rope_theta: f64,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub norm_eps: f64,
    /// Whether the head reuses the embedding (`tie_word_embeddings`).
    pub tied_embeddings: bool,
    /// Whether the folder holds its tokenizer ([`TOKENIZER_FILE`]), which a job reading text then uses unless
    /// it names another.
    pub has_tokenizer: bool,
    /// The longest sequence the model was trained for (`max_position_embeddings`, GPT-2's `n_positions`): the
    /// job's context may not exceed it.
    pub max_context: u32,
    /// An `mlp`'s widths from input to output (its `config.json`'s `layers`); empty for a decoder. An mlp's
    /// folder has none of the decoder's fields above: they are 0 (and `false`) for it.
    pub layers: Vec<u32>,
    /// An `mlp`'s non-linearity (its `config.json`'s `activation`); the default, and not read, for a decoder.
    pub activation: Activation,
}

impl PretrainedShape {
    /// The parameters its layer norms have, for a GPT (GPT-2's learn a gain and a bias); `None` for a Llama,
    /// whose RMSNorms always learn a gain.
    pub fn layer_norm(&self) -> Option<LayerNorm> {
        (self.kind == ModelKind::Gpt).then_some(LayerNorm::Affine)
    }
}

/// The tokenizer file of a Hugging Face model folder, which a job reading text uses unless it names another.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The context a job trains at when it does not set one: the model's own, up to this many tokens (a
/// pretrained model's maximum is often far longer than a fine-tuning run needs).
pub const DEFAULT_PRETRAINED_CONTEXT: u32 = 1024;

impl ModelSpec {
    /// Fills in the shape of the pretrained model `shape` read from `source` (its `config.json`). Every field
    /// the job already sets must agree with it; one that does not is an error naming both values.
    pub fn adopt(&mut self, shape: &PretrainedShape, source: &str) -> Result<(), ApiError> {
        let clash = |field: &str, job: String, config: String| ApiError::Invalid {
            field: format!("spec.model.{field}"),
            message: format!(
                "the job says {job} but {source} says {config}: leave spec.model.{field} out (the pretrained model's \
                 shape is taken from its config) or make them agree"
            ),
        };
        if self.kind != shape.kind {
            return Err(clash(
                "kind",
                format!("{:?}", self.kind).to_lowercase(),
                format!("{:?}", shape.kind).to_lowercase(),
            ));
        }
        if shape.kind == ModelKind::Mlp {
            return self.adopt_mlp(shape, &clash);
        }
        let agree = |field: &str, have: &mut Option<u32>, want: u32| match *have {
            Some(v) if v != want => Err(clash(field, v.to_string(), want.to_string())),
            _ => {
                *have = Some(want);
                Ok(())
            }
        };
        agree("width", &mut self.width, shape.width)?;
        agree("heads", &mut self.heads, shape.heads)?;
        agree("blocks", &mut self.blocks, shape.blocks)?;
        if shape.kind == ModelKind::Gpt {
            self.adopt_gpt2(shape, &clash)?;
        } else {
            agree("kvHeads", &mut self.kv_heads, shape.kv_heads)?;
            agree("intermediateSize", &mut self.intermediate_size, shape.intermediate_size)?;
            self.adopt_rope_and_eps(shape, &clash)?;
        }
        // Fields with defaults: the default yields to the config; anything else must agree.
        if self.vocab_size != 256 && self.vocab_size != shape.vocab_size {
            return Err(clash("vocabSize", self.vocab_size.to_string(), shape.vocab_size.to_string()));
        }
        self.vocab_size = shape.vocab_size;
        if !self.tied_embeddings && shape.tied_embeddings {
            return Err(clash("tiedEmbeddings", "false".into(), "true".into()));
        }
        self.tied_embeddings = shape.tied_embeddings;
        match self.context_length {
            // A GPT's position table is part of its weights: the job reads all of it.
            Some(c) if shape.kind == ModelKind::Gpt && c != shape.max_context => {
                return Err(clash(
                    "contextLength",
                    c.to_string(),
                    format!("{} positions (n_positions)", shape.max_context),
                ));
            }
            None if shape.kind == ModelKind::Gpt => self.context_length = Some(shape.max_context),
            Some(c) if c > shape.max_context => {
                return Err(ApiError::Invalid {
                    field: "spec.model.contextLength".into(),
                    message: format!("{c} is longer than {source} allows ({}): use at most that", shape.max_context),
                });
            }
            Some(_) => {}
            None => self.context_length = Some(shape.max_context.min(DEFAULT_PRETRAINED_CONTEXT)),
        }
        Ok(())
    }

    /// An MLP's widths and activation: taken when the job leaves them out, else they must agree.
    fn adopt_mlp(
        &mut self,
        shape: &PretrainedShape,
        clash: &dyn Fn(&str, String, String) -> ApiError,
    ) -> Result<(), ApiError> {
        if !self.layers.is_empty() && self.layers != shape.layers {
            return Err(clash("layers", format!("{:?}", self.layers), format!("{:?}", shape.layers)));
        }
        self.layers = shape.layers.clone();
        // The default yields to the folder's; another the job names must agree.
        if self.activation != Activation::default() && self.activation != shape.activation {
            let name = |a: Activation| format!("{a:?}").to_lowercase();
            return Err(clash("activation", name(self.activation), name(shape.activation)));
        }
        self.activation = shape.activation;
        Ok(())
    }

    /// A GPT-2's MLP width (a whole multiple of the width, `mlpRatio`) and its affine layer norms.
    fn adopt_gpt2(
        &mut self,
        shape: &PretrainedShape,
        clash: &dyn Fn(&str, String, String) -> ApiError,
    ) -> Result<(), ApiError> {
        let width = shape.width.max(1);
        if !shape.intermediate_size.is_multiple_of(width) {
            return Err(ApiError::Invalid {
                field: "spec.model.from".into(),
                message: format!(
                    "its MLP has {} features, not a whole multiple of the width {width}: the appliance's gpt sizes it by mlpRatio",
                    shape.intermediate_size
                ),
            });
        }
        let ratio = shape.intermediate_size / width;
        if self.mlp_ratio != crate::spec::default_mlp_ratio() && self.mlp_ratio != ratio {
            return Err(clash("mlpRatio", self.mlp_ratio.to_string(), ratio.to_string()));
        }
        self.mlp_ratio = ratio;
        if self.layer_norm == Some(LayerNorm::Plain) {
            return Err(clash("layerNorm", "plain".into(), "affine (GPT-2's norms learn a gain and a bias)".into()));
        }
        self.layer_norm = shape.layer_norm();
        Ok(())
    }

    /// A Llama's rotary base and norm epsilon.
    fn adopt_rope_and_eps(
        &mut self,
        shape: &PretrainedShape,
        clash: &dyn Fn(&str, String, String) -> ApiError,
    ) -> Result<(), ApiError> {
        let agree_f = |field: &str, have: &mut Option<f64>, want: f64| match *have {
            Some(v) if (v - want).abs() > 1e-9 * want.abs() => Err(clash(field, v.to_string(), want.to_string())),
            _ => {
                *have = Some(want);
                Ok(())
            }
        };
        agree_f("ropeTheta", &mut self.rope_theta, shape.rope_theta)?;
        agree_f("normEps", &mut self.norm_eps, shape.norm_eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Activation;

    fn smollm2() -> PretrainedShape {
        PretrainedShape {
            kind: ModelKind::Llama,
            vocab_size: 49_152,
            width: 576,
            heads: 9,
            kv_heads: 3,
            blocks: 30,
            intermediate_size: 1536,
            rope_theta: 100_000.0,
            norm_eps: 1e-5,
            tied_embeddings: true,
            max_context: 8192,
            has_tokenizer: true,
            layers: Vec::new(),
            activation: Activation::Relu,
        }
    }

    fn gpt2() -> PretrainedShape {
        PretrainedShape {
            kind: ModelKind::Gpt,
            vocab_size: 50_257,
            width: 768,
            heads: 12,
            kv_heads: 12,
            blocks: 12,
            intermediate_size: 3072,
            max_context: 1024,
            ..smollm2()
        }
    }

    #[test]
    fn a_gpt2_takes_its_mlp_ratio_affine_norms_and_whole_position_table() {
        let mut m = ModelSpec { kind: ModelKind::Gpt, ..llama() };
        m.adopt(&gpt2(), "g").unwrap();
        assert_eq!(
            (m.mlp_ratio, m.layer_norm, m.context_length, m.kv_heads),
            (4, Some(LayerNorm::Affine), Some(1024), None)
        );
        let mut m = ModelSpec { kind: ModelKind::Gpt, context_length: Some(256), ..llama() };
        assert!(m.adopt(&gpt2(), "g").unwrap_err().to_string().contains("n_positions"));
        let mut m = ModelSpec { kind: ModelKind::Gpt, layer_norm: Some(LayerNorm::Plain), ..llama() };
        assert!(m.adopt(&gpt2(), "g").unwrap_err().to_string().contains("spec.model.layerNorm"));
        let mut m = ModelSpec { kind: ModelKind::Gpt, ..llama() };
        assert!(
            m.adopt(&PretrainedShape { intermediate_size: 1000, ..gpt2() }, "g")
                .unwrap_err()
                .to_string()
                .contains("whole multiple")
        );
    }

    #[test]
    fn an_mlp_takes_its_widths_and_activation_and_refuses_others() {
        let folder = PretrainedShape {
            kind: ModelKind::Mlp,
            layers: vec![784, 64, 10],
            activation: Activation::Gelu,
            ..smollm2()
        };
        let mut m = ModelSpec::mlp(Vec::new(), Activation::Relu, 0.0);
        m.adopt(&folder, "net/config.json").unwrap();
        assert_eq!(
            (m.layers.as_slice(), m.activation, m.width, m.vocab_size),
            (&[784, 64, 10][..], Activation::Gelu, None, 256)
        );
        let e = ModelSpec::mlp(vec![784, 32, 10], Activation::Relu, 0.0)
            .adopt(&folder, "net/config.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.model.layers") && e.contains("[784, 32, 10]") && e.contains("[784, 64, 10]"), "{e}");
        let relu = PretrainedShape { activation: Activation::Relu, ..folder.clone() };
        let e = ModelSpec::mlp(Vec::new(), Activation::Gelu, 0.0).adopt(&relu, "n").unwrap_err().to_string();
        assert!(e.contains("spec.model.activation") && e.contains("the job says gelu but n says relu"), "{e}");
        assert!(llama().adopt(&folder, "n").unwrap_err().to_string().contains("the job says llama but n says mlp"));
    }

    fn llama() -> ModelSpec {
        ModelSpec { kind: ModelKind::Llama, ..ModelSpec::mlp(Vec::new(), Activation::Relu, 0.0) }
    }

    #[test]
    fn an_empty_model_takes_the_whole_shape() {
        let mut m = llama();
        m.adopt(&smollm2(), "smol/config.json").unwrap();
        assert_eq!(
            (m.width, m.heads, m.kv_heads, m.blocks, m.intermediate_size),
            (Some(576), Some(9), Some(3), Some(30), Some(1536))
        );
        assert_eq!(
            (m.vocab_size, m.context_length, m.rope_theta, m.tied_embeddings),
            (49_152, Some(1024), Some(100_000.0), true)
        );
    }

    #[test]
    fn a_field_that_disagrees_is_named_with_both_values() {
        let mut m = ModelSpec { width: Some(512), ..llama() };
        let e = m.adopt(&smollm2(), "smol/config.json").unwrap_err().to_string();
        assert!(
            e.contains("spec.model.width") && e.contains("512") && e.contains("576") && e.contains("smol/config.json"),
            "{e}"
        );
        let mut m = ModelSpec { context_length: Some(9000), ..llama() };
        assert!(m.adopt(&smollm2(), "c").unwrap_err().to_string().contains("contextLength"));
        let mut m = ModelSpec { kind: ModelKind::Gpt, ..llama() };
        assert!(m.adopt(&smollm2(), "c").unwrap_err().to_string().contains("the job says gpt but c says llama"));
        let mut m = ModelSpec { width: Some(576), context_length: Some(256), ..llama() };
        m.adopt(&smollm2(), "c").unwrap();
        assert_eq!(m.context_length, Some(256), "a shorter context than the model's is the job's choice");
    }
}
