//! Text for language models as windows of token ids. Without a tokenizer the tokens are bytes: 256 tokens, no
//! vocabulary to download, and any UTF-8 (or other) text works; with one (see [`super::tokenizer`]) or from a
//! pre-tokenized file (see [`super::tokens`]) they are ids below the model's vocabulary. A sample is a window of
//! `context` tokens and the `context` tokens that follow each of them; windows tile the text without overlap,
//! and unless a held-out file is named the last 5% of the tokens is held out.

use std::path::Path;

use crate::shard::Shard;
use errors::{Error, Result};
use kernels::tensor::Mat;

/// Share of the text held out for evaluation, taken from its end.
pub const HELD_OUT: f64 = 0.05;

/// Most held-out tokens an evaluation reads: enough for a loss within about 0.01 nats, few enough that a model
/// streamed at a small batch is evaluated in seconds.
pub const EVAL_TOKENS: usize = 16_384;

/// The largest vocabulary a token store holds: `spec.model.vocabSize`'s ceiling ([`crds::MAX_VOCAB`]).
pub const MAX_VOCAB: usize = crds::MAX_VOCAB as usize;

/// The token ids of a split, stored as narrowly as their vocabulary allows: a byte corpus stays one byte a
/// token (as large as the file, no more), any other vocabulary four (Llama 3's and Gemma's exceed `u16`).
#[derive(Clone, Debug, PartialEq)]
pub enum Tokens {
    /// Byte-level text: each byte is its own token (vocabulary 256).
    Bytes(Vec<u8>),
    /// Ids from a tokenizer or a token file, each below [`MAX_VOCAB`].
    Ids(Vec<u32>),
}

impl Tokens {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Tokens::Bytes(b) => b.len(),
            Tokens::Ids(t) => t.len(),
        }
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cuts the store at `at`, keeping `[0, at)` and returning the rest: how the held-out tail is taken
    /// without copying the training part.
    fn split_off(&mut self, at: usize) -> Tokens {
        match self {
            Tokens::Bytes(b) => Tokens::Bytes(b.split_off(at)),
            Tokens::Ids(t) => Tokens::Ids(t.split_off(at)),
        }
    }
}

/// A text split cut into windows of `context` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct TextWindows {
    /// The token ids of the split.
    pub tokens: Tokens,
    /// Ids the tokens are drawn from (256 for bytes): the size of the unigram table.
    pub vocab: usize,
    /// Tokens per window.
    pub context: usize,
}

impl TextWindows {
    /// Windows in the split: each needs one token past its end for the last target.
    pub fn len(&self) -> usize {
        self.tokens.len().saturating_sub(1) / self.context.max(1)
    }

    /// True when the split holds no whole window.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Windows `indices` side by side: a row of token ids (`1 × n·context`) and each token's successor as its
    /// label.
    pub fn shard(&self, indices: &[u32]) -> Shard {
        let t = self.context;
        let mut tokens = Vec::with_capacity(indices.len() * t);
        let mut labels = Vec::with_capacity(indices.len() * t);
        for &i in indices {
            let start = i as usize * t;
            match &self.tokens {
                Tokens::Bytes(b) => {
                    tokens.extend(b[start..start + t].iter().map(|&b| f32::from(b)));
                    labels.extend(b[start + 1..start + t + 1].iter().map(|&b| u32::from(b)));
                }
                Tokens::Ids(ids) => {
                    // Exact: every id is below MAX_VOCAB, far below f32's 2^24 integers.
                    tokens.extend(ids[start..start + t].iter().map(|&b| b as f32));
                    labels.extend_from_slice(&ids[start + 1..start + t + 1]);
                }
            }
        }
        Shard { inputs: Mat::from_vec(1, tokens.len(), tokens), labels }
    }

    /// Cross-entropy (nats per token) of this split's targets under the token frequencies of `train`, with
    /// add-one smoothing: the loss of the best model that ignores context, the bar a language model must clear.
    pub fn unigram_loss(&self, train: &TextWindows) -> f64 {
        let vocab = self.vocab.max(train.vocab).clamp(1, MAX_VOCAB);
        let mut counts = vec![1.0f64; vocab];
        let end = (self.len() * self.context + 1).min(self.tokens.len());
        // Out-of-table ids cannot occur (loading checks every id), but a lookup must not panic if one did.
        let mut sum = 0.0;
        let mut n = 0usize;
        match &train.tokens {
            Tokens::Bytes(b) => b.iter().for_each(|&b| counts[usize::from(b) % vocab] += 1.0),
            Tokens::Ids(t) => t.iter().for_each(|&b| counts[b as usize % vocab] += 1.0),
        }
        let total: f64 = counts.iter().sum();
        match &self.tokens {
            Tokens::Bytes(b) if end > 1 => {
                sum = b[1..end].iter().map(|&b| -(counts[usize::from(b) % vocab] / total).ln()).sum();
                n = end - 1;
            }
            Tokens::Ids(t) if end > 1 => {
                sum = t[1..end].iter().map(|&b| -(counts[b as usize % vocab] / total).ln()).sum();
                n = end - 1;
            }
            _ => {}
        }
        sum / n.max(1) as f64
    }
}

/// Reads a text file (gzip when it ends in `.gz`) whole, as bytes.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    crate::file::read_data_file(path).map_err(|e| match e {
        Error::Data(m) if m.starts_with("cannot open") => Error::Data(format!(
            "{m}; point spec.data.path at a text file, e.g. examples/data/moby-dick/moby-dick.txt.gz"
        )),
        e => e,
    })
}

/// Reads a text file (gzip when it ends in `.gz`) as bytes and splits it into training and held-out windows.
pub fn load(path: &Path, context: usize) -> Result<(TextWindows, TextWindows)> {
    let bytes = read(path)?;
    split(Tokens::Bytes(bytes), 256, context).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// Cuts `tokens` into the training part and the held-out tail (the last [`HELD_OUT`] of them).
pub fn split(
    mut tokens: Tokens,
    vocab: usize,
    context: usize,
) -> std::result::Result<(TextWindows, TextWindows), String> {
    let held_out = (tokens.len() as f64 * HELD_OUT) as usize;
    let cut = tokens.len() - held_out;
    let test = TextWindows { tokens: tokens.split_off(cut), vocab, context };
    let train = TextWindows { tokens, vocab, context };
    if context == 0 || train.is_empty() || test.is_empty() {
        return Err(format!(
            "{} tokens are too few for windows of {context} tokens in both the training part and the held-out 5%; \
             use a longer text or a shorter spec.model.contextLength",
            train.tokens.len() + test.tokens.len()
        ));
    }
    Ok((train, test))
}

/// Pairs a training split with a held-out split read from its own file (`spec.data.heldOutPath`), each needing
/// at least one whole window.
pub fn pair(
    train: Tokens,
    test: Tokens,
    vocab: usize,
    context: usize,
) -> std::result::Result<(TextWindows, TextWindows), String> {
    let (train, test) = (TextWindows { tokens: train, vocab, context }, TextWindows { tokens: test, vocab, context });
    for (split, name) in [(&train, "spec.data.path"), (&test, "spec.data.heldOutPath")] {
        if context == 0 || split.is_empty() {
            return Err(format!(
                "{name} holds {} tokens, too few for one window of {context} tokens and its next token; use a \
                 longer text or a shorter spec.model.contextLength",
                split.tokens.len()
            ));
        }
    }
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(t: &TextWindows) -> &[u8] {
        match &t.tokens {
            Tokens::Bytes(b) => b,
            Tokens::Ids(_) => panic!("expected bytes"),
        }
    }

    #[test]
    fn windows_predict_the_next_byte_and_hold_out_the_tail() {
        let text: Vec<u8> = (0..26_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let (train, test) = split(Tokens::Bytes(text.clone()), 256, 8).expect("long enough");
        assert_eq!(bytes(&train).len(), 24_700);
        assert_eq!(bytes(&test), &text[24_700..]);
        assert_eq!(train.len(), 24_699 / 8);
        let shard = train.shard(&[0, 2]);
        assert_eq!(shard.inputs.cols, 16);
        assert_eq!(shard.inputs.data[0], f32::from(b'a'));
        assert_eq!(shard.labels[0], u32::from(b'b'));
        assert_eq!(shard.inputs.data[8], f32::from(text[16]));
        assert_eq!(shard.labels[15], u32::from(text[24]));
        // A uniform alphabet of 26 letters: the unigram loss is about ln 26.
        let u = test.unigram_loss(&train);
        assert!((u - 26f64.ln()).abs() < 0.02, "{u}");
        assert!(split(Tokens::Bytes(text[..20].to_vec()), 256, 8).unwrap_err().contains("too few"));
    }

    #[test]
    fn id_windows_shard_like_byte_windows() {
        let text: Vec<u8> = (0..5_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let ids: Vec<u32> = text.iter().map(|&b| u32::from(b)).collect();
        let (bt, bh) = split(Tokens::Bytes(text), 256, 16).unwrap();
        let (it, ih) = split(Tokens::Ids(ids), 256, 16).unwrap();
        assert_eq!(bt.len(), it.len());
        let idx = [0u32, 5, 17];
        assert_eq!(bt.shard(&idx), it.shard(&idx));
        assert_eq!(bh.unigram_loss(&bt), ih.unigram_loss(&it));
        // Ids above a byte are held and shifted like any other.
        let (t, _) = split(Tokens::Ids((0..4_000u32).map(|i| 300 + i % 700).collect()), 1000, 4).unwrap();
        let s = t.shard(&[1]);
        assert_eq!(s.inputs.data, vec![304.0, 305.0, 306.0, 307.0]);
        assert_eq!(s.labels, vec![305, 306, 307, 308]);
    }

    #[test]
    fn a_held_out_file_is_paired_whole() {
        let (train, test) = pair(Tokens::Ids(vec![1; 100]), Tokens::Ids(vec![2; 9]), 4, 8).unwrap();
        assert_eq!((train.len(), test.len()), (12, 1));
        let err = pair(Tokens::Ids(vec![1; 100]), Tokens::Ids(vec![2; 8]), 4, 8).unwrap_err();
        assert!(err.contains("heldOutPath") && err.contains("too few"), "{err}");
    }

    #[test]
    fn missing_and_truncated_files_are_reported() {
        let err = load(Path::new("/nonexistent/text.txt"), 8).unwrap_err().to_string();
        assert!(err.contains("cannot open"), "{err}");
        let dir = std::env::temp_dir().join(format!("ws-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.txt.gz");
        std::fs::write(&path, b"not gzip at all").unwrap();
        let err = load(&path, 8).unwrap_err().to_string();
        assert!(err.contains("gzip"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
        // A device that never ends and a folder are refused before a byte is read.
        for path in ["/dev/zero", "/tmp"] {
            let err = load(Path::new(path), 8).unwrap_err().to_string();
            assert!(err.contains("not a regular file") && err.contains(path), "{err}");
        }
    }
}
