//! Text for language models, tokenised as bytes: 256 tokens, no vocabulary to download, and any UTF-8 (or
//! other) text works. A sample is a window of `context` tokens and the `context` tokens that follow each of
//! them; windows tile the text without overlap, and the last 5% of the file is held out.

use std::path::Path;

use crate::engine::Shard;
use crate::error::{Error, Result};
use crate::tensor::Mat;

/// Share of the text held out for evaluation, taken from its end.
pub const HELD_OUT: f64 = 0.05;

/// Most held-out tokens an evaluation reads: enough for a loss within about 0.01 nats, few enough that a model
/// streamed at a small batch is evaluated in seconds.
pub const EVAL_TOKENS: usize = 16_384;

/// A text split cut into windows of `context` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct TextWindows {
    /// The bytes of the split.
    pub bytes: Vec<u8>,
    /// Tokens per window.
    pub context: usize,
}

impl TextWindows {
    /// Windows in the split: each needs one byte past its end for the last target.
    pub fn len(&self) -> usize {
        self.bytes.len().saturating_sub(1) / self.context.max(1)
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
            tokens.extend(self.bytes[start..start + t].iter().map(|&b| f32::from(b)));
            labels.extend(self.bytes[start + 1..start + t + 1].iter().map(|&b| u32::from(b)));
        }
        Shard { inputs: Mat::from_vec(1, tokens.len(), tokens), labels }
    }

    /// Cross-entropy (nats per token) of this split's targets under the byte frequencies of `train`, with
    /// add-one smoothing: the loss of the best model that ignores context, the bar a language model must clear.
    pub fn unigram_loss(&self, train: &TextWindows) -> f64 {
        let mut counts = [1.0f64; 256];
        train.bytes.iter().for_each(|&b| counts[b as usize] += 1.0);
        let total: f64 = counts.iter().sum();
        let targets = &self.bytes[1..(self.len() * self.context + 1).min(self.bytes.len())];
        let sum: f64 = targets.iter().map(|&b| -(counts[b as usize] / total).ln()).sum();
        sum / targets.len().max(1) as f64
    }
}

/// Reads a text file (gzip when it ends in `.gz`) and splits it into training and held-out windows.
pub fn load(path: &Path, context: usize) -> Result<(TextWindows, TextWindows)> {
    let bytes = super::read_data_file(path).map_err(|e| match e {
        Error::Data(m) if m.starts_with("cannot open") => Error::Data(format!(
            "{m}; point spec.data.path at a text file, e.g. examples/data/moby-dick/moby-dick.txt.gz"
        )),
        e => e,
    })?;
    split(bytes, context).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// Cuts `bytes` into the training part and the held-out tail.
pub fn split(mut bytes: Vec<u8>, context: usize) -> std::result::Result<(TextWindows, TextWindows), String> {
    let held_out = (bytes.len() as f64 * HELD_OUT) as usize;
    let cut = bytes.len() - held_out;
    let test = TextWindows { bytes: bytes.split_off(cut), context };
    let train = TextWindows { bytes, context };
    if context == 0 || train.is_empty() || test.is_empty() {
        return Err(format!(
            "{} bytes are too few for windows of {context} tokens in both the training part and the held-out 5%; \
             use a longer text or a shorter spec.model.contextLength",
            train.bytes.len() + test.bytes.len()
        ));
    }
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_predict_the_next_byte_and_hold_out_the_tail() {
        let text: Vec<u8> = (0..26_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let (train, test) = split(text.clone(), 8).expect("long enough");
        assert_eq!(train.bytes.len(), 24_700);
        assert_eq!(test.bytes, text[24_700..]);
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
        assert!(split(text[..20].to_vec(), 8).unwrap_err().contains("too few"));
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
