//! A pretrained model a job starts from (`spec.model.from`): the shape its `config.json` gives, and how that
//! shape fills in the job's model. Reading the folder is the runtime's business
//! (`runtime::memoryx::huggingface`); deciding what the job then is happens here, once, so a local run, a
//! submission and a test all get the same spec and the same errors.

use crate::spec::{ModelKind, ModelSpec};
use crate::error::ApiError;

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
    /// SwiGLU hidden features (`intermediate_size`).
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
    /// The longest sequence the model was trained for (`max_position_embeddings`): the job's context may not
    /// exceed it.
    pub max_context: u32,
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
            return Err(clash("kind", format!("{:?}", self.kind).to_lowercase(), format!("{:?}", shape.kind).to_lowercase()));
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
        agree("kvHeads", &mut self.kv_heads, shape.kv_heads)?;
        agree("blocks", &mut self.blocks, shape.blocks)?;
        agree("intermediateSize", &mut self.intermediate_size, shape.intermediate_size)?;
        let agree_f = |field: &str, have: &mut Option<f64>, want: f64| match *have {
            Some(v) if (v - want).abs() > 1e-9 * want.abs() => Err(clash(field, v.to_string(), want.to_string())),
            _ => {
                *have = Some(want);
                Ok(())
            }
        };
        agree_f("ropeTheta", &mut self.rope_theta, shape.rope_theta)?;
        agree_f("normEps", &mut self.norm_eps, shape.norm_eps)?;
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
        }
    }

    fn llama() -> ModelSpec {
        ModelSpec { kind: ModelKind::Llama, ..ModelSpec::mlp(Vec::new(), Activation::Relu, 0.0) }
    }

    #[test]
    fn an_empty_model_takes_the_whole_shape() {
        let mut m = llama();
        m.adopt(&smollm2(), "smol/config.json").unwrap();
        assert_eq!((m.width, m.heads, m.kv_heads, m.blocks, m.intermediate_size), (Some(576), Some(9), Some(3), Some(30), Some(1536)));
        assert_eq!((m.vocab_size, m.context_length, m.rope_theta, m.tied_embeddings), (49_152, Some(1024), Some(100_000.0), true));
    }

    #[test]
    fn a_field_that_disagrees_is_named_with_both_values() {
        let mut m = ModelSpec { width: Some(512), ..llama() };
        let e = m.adopt(&smollm2(), "smol/config.json").unwrap_err().to_string();
        assert!(e.contains("spec.model.width") && e.contains("512") && e.contains("576") && e.contains("smol/config.json"), "{e}");
        let mut m = ModelSpec { context_length: Some(9000), ..llama() };
        assert!(m.adopt(&smollm2(), "c").unwrap_err().to_string().contains("contextLength"));
        let mut m = ModelSpec { kind: ModelKind::Gpt, ..llama() };
        assert!(m.adopt(&smollm2(), "c").unwrap_err().to_string().contains("the job says gpt but c says llama"));
        let mut m = ModelSpec { width: Some(576), context_length: Some(256), ..llama() };
        m.adopt(&smollm2(), "c").unwrap();
        assert_eq!(m.context_length, Some(256), "a shorter context than the model's is the job's choice");
    }
}
