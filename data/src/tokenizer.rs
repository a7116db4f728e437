//! Hugging Face tokenizers (`tokenizer.json`, as `tokenizer.save(...)` writes it) for `text` and `jsonl` data:
//! the vocabulary a user's model was meant for, rather than bytes. The ids it produces must fit
//! `spec.model.vocabSize`, which is checked once against the tokenizer's vocabulary and again for every id.

use std::io::Read;
use std::path::Path;

use tokenizers::Tokenizer;

use super::text::MAX_VOCAB;
use errors::{Error, Result};

/// The largest `tokenizer.json` read: real ones are a few MiB (GPT-2's is 1.4 MiB, large multilingual ones
/// tens), and the file is parsed in memory, so anything bigger is refused before it is read.
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// Text is encoded in pieces of about this many bytes, each ending at a line break, so no single encoding (and
/// its offsets and alignments, several times the text's size) holds the whole corpus.
const CHUNK_BYTES: usize = 64 << 10;

/// Pieces encoded per batch: enough to keep both cores busy, few enough that the batch's encodings stay small.
const BATCH_CHUNKS: usize = 32;

/// A tokenizer read from a `tokenizer.json`, with the vocabulary size the model must hold.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Ids the tokenizer can produce, added tokens included.
    pub vocab: usize,
    /// Where it was read from, for error messages.
    pub path: String,
}

impl TextTokenizer {
    /// Reads `path` (at most [`MAX_TOKENIZER_BYTES`]) and checks its vocabulary fits `model_vocab`
    /// (`spec.model.vocabSize`): a model too small for its tokenizer would index past its embedding.
    pub fn load(path: &Path, model_vocab: usize) -> Result<Self> {
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::Data(format!("cannot open the tokenizer {shown} ({e}); check spec.data.tokenizer")))?;
        if !meta.is_file() {
            return Err(Error::Data(format!(
                "the tokenizer {shown} is not a regular file; point spec.data.tokenizer at a tokenizer.json"
            )));
        }
        if meta.len() > MAX_TOKENIZER_BYTES {
            return Err(Error::Data(format!(
                "the tokenizer {shown} holds {} bytes, more than the {MAX_TOKENIZER_BYTES} a tokenizer.json may; \
                 point spec.data.tokenizer at a tokenizer.json",
                meta.len()
            )));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_TOKENIZER_BYTES).read_to_end(&mut bytes))
            .map_err(|e| Error::io(format!("reading the tokenizer {shown}"), e))?;
        let mut inner = Tokenizer::from_bytes(&bytes).map_err(|e| {
            Error::Data(format!(
                "the tokenizer {shown} is not a Hugging Face tokenizer.json ({e}); save one with \
                 `tokenizer.save(\"tokenizer.json\")` (Python `tokenizers`) or `AutoTokenizer.save_pretrained` and \
                 point spec.data.tokenizer at it"
            ))
        })?;
        // A tokenizer saved for a model's inputs may truncate or pad each encoding; a corpus is one stream of
        // pieces, so neither may apply (truncation would drop text silently, padding insert tokens).
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| {
            Error::Data(format!(
                "the tokenizer {shown}'s truncation cannot be turned off ({e}); save it without truncation"
            ))
        })?;
        let vocab = inner.get_vocab_size(true);
        if vocab > model_vocab || vocab > MAX_VOCAB {
            return Err(Error::Data(format!(
                "tokenizer {shown} has a vocabulary of {vocab}; set spec.model.vocabSize to at least {vocab}{}",
                if vocab > MAX_VOCAB {
                    format!(" (at most {MAX_VOCAB} is supported: use a smaller tokenizer)")
                } else {
                    String::new()
                }
            )));
        }
        Ok(TextTokenizer { inner, vocab, path: shown.to_string() })
    }

    /// Encodes `text` (the contents of `source`) into token ids, piece by piece at line breaks, without
    /// special tokens: a corpus is one stream, not a sequence of model inputs.
    pub fn encode(&self, text: &[u8], source: &Path, model_vocab: usize) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(text).map_err(|e| {
            Error::Data(format!(
                "{} is not UTF-8 text (at byte {}); a tokenizer reads UTF-8: convert the file, or drop \
                 spec.data.tokenizer to train on bytes",
                source.display(),
                e.valid_up_to()
            ))
        })?;
        let pieces = chunks(text, CHUNK_BYTES);
        // Most tokenizers give 3–5 bytes a token; the capacity is a hint and grows if needed.
        let mut ids: Vec<u32> = Vec::with_capacity(text.len() / 3);
        let limit = model_vocab.min(MAX_VOCAB);
        for batch in pieces.chunks(BATCH_CHUNKS) {
            let encodings = self.inner.encode_batch(batch.to_vec(), false).map_err(|e| {
                Error::Data(format!(
                    "the tokenizer {} failed on {} ({e}); check the tokenizer",
                    self.path,
                    source.display()
                ))
            })?;
            for encoding in &encodings {
                for &id in encoding.get_ids() {
                    if id as usize >= limit {
                        return Err(Error::Data(format!(
                            "the tokenizer {} produced the id {id} for {}, beyond the vocabulary of {limit}; set \
                             spec.model.vocabSize to at least {}",
                            self.path,
                            source.display(),
                            id as usize + 1
                        )));
                    }
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// The text of token ids, special tokens left out: what a person reads of a generated continuation.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Data(format!("the tokenizer {} cannot decode ({e})", self.path)))
    }
}

/// Cuts `text` into pieces of at least `size` bytes that end just after a line break (or, in a line longer than
/// four pieces, after a space or at any character boundary), so that encoding the pieces one by one gives the
/// tokens of the whole text for tokenizers that split at whitespace.
fn chunks(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / size.max(1) + 1);
    let mut rest = text;
    while rest.len() > size {
        let bytes = rest.as_bytes();
        let far = (4 * size).min(bytes.len());
        let cut = bytes[size..far]
            .iter()
            .position(|&b| b == b'\n')
            .or_else(|| bytes[size..far].iter().position(|&b| b == b' '))
            .map(|p| size + p + 1)
            .unwrap_or_else(|| (size..=far).find(|&i| rest.is_char_boundary(i)).unwrap_or(bytes.len()));
        let (piece, tail) = rest.split_at(cut);
        out.push(piece);
        rest = tail;
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A word-level tokenizer of a handful of words, written out as `tokenizer.json`: ids known by heart.
    pub(crate) fn word_level_json() -> String {
        serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {
                "type": "WordLevel",
                "vocab": {"[UNK]": 0, "call": 1, "me": 2, "ishmael": 3, ".": 4, "whale": 5},
                "unk_token": "[UNK]"
            }
        })
        .to_string()
    }

    pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ws-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_word_level_tokenizer_encodes_known_ids() {
        let dir = temp_dir("tok-words");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, word_level_json()).unwrap();
        let tok = TextTokenizer::load(&path, 6).unwrap();
        assert_eq!(tok.vocab, 6);
        let ids = tok.encode(b"call me ishmael .\nwhale whale dog\n", &path, 6).unwrap();
        assert_eq!(ids, vec![1, 2, 3, 4, 5, 5, 0]);
        let err = TextTokenizer::load(&path, 5).err().unwrap().to_string();
        assert!(err.contains("has a vocabulary of 6; set spec.model.vocabSize to at least 6"), "{err}");
        let err = tok.encode(b"call \xff me", &path, 6).unwrap_err().to_string();
        assert!(err.contains("not UTF-8") && err.contains("at byte 5"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_tokenizer_saved_with_truncation_and_padding_keeps_every_token() {
        let dir = temp_dir("tok-trunc");
        let path = dir.join("tokenizer.json");
        let mut json: serde_json::Value = serde_json::from_str(&word_level_json()).unwrap();
        json["truncation"] =
            serde_json::json!({"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0});
        json["padding"] = serde_json::json!({"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "[UNK]"});
        std::fs::write(&path, json.to_string()).unwrap();
        let tok = TextTokenizer::load(&path, 6).unwrap();
        assert_eq!(tok.encode(b"call me ishmael .\nwhale", &path, 6).unwrap(), vec![1, 2, 3, 4, 5]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_corrupt_or_oversized_tokenizer_is_one_clear_error() {
        let dir = temp_dir("tok-bad");
        let path = dir.join("tokenizer.json");
        let json = word_level_json();
        std::fs::write(&path, &json[..json.len() / 2]).unwrap();
        let err = TextTokenizer::load(&path, 1024).err().unwrap().to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("not a Hugging Face tokenizer.json"),
            "{err}"
        );
        assert!(err.contains("spec.data.tokenizer"), "{err}");
        std::fs::write(&path, b"{\"model\": {\"type\": \"Nonsense\"}}").unwrap();
        let err = TextTokenizer::load(&path, 1024).err().unwrap().to_string();
        assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");
        // Too big is refused from the file's size, before a byte is read.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_TOKENIZER_BYTES + 1).unwrap();
        let err = TextTokenizer::load(&path, 1024).err().unwrap().to_string();
        assert!(err.contains("more than"), "{err}");
        let err = TextTokenizer::load(&dir.join("missing.json"), 1024).err().unwrap().to_string();
        assert!(err.contains("cannot open the tokenizer"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_moby_dick_bpe_tokenizer_round_trips_in_pieces() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/moby-dick/tokenizer.json");
        let tok = TextTokenizer::load(&path, 1024).unwrap();
        assert_eq!(tok.vocab, 1024);
        let text = super::super::text::read(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/moby-dick/moby-dick.txt.gz"),
        )
        .unwrap();
        let text = &text[..300_000];
        let ids = tok.encode(text, &path, 1024).unwrap();
        // BPE compresses English several-fold, and decoding gives the text back.
        assert!(ids.len() * 2 < text.len(), "{} ids for {} bytes", ids.len(), text.len());
        let decoded = tok.inner.decode(&ids, false).unwrap();
        assert_eq!(decoded.as_bytes(), text);
        // Pieces cut at line breaks encode as the whole text does.
        let whole = tok.inner.encode(std::str::from_utf8(text).unwrap(), false).unwrap();
        assert_eq!(whole.get_ids().to_vec(), ids);
    }

    #[test]
    fn pieces_end_at_line_breaks_and_cover_the_text() {
        let text = "ab\ncd ef\n".repeat(100) + &"é".repeat(300);
        let pieces = chunks(&text, 10);
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| p.ends_with('\n') || p.ends_with('é')), "{pieces:?}");
        assert!(pieces.iter().filter(|p| p.ends_with('\n')).count() >= 40, "{pieces:?}");
        assert!(pieces.iter().all(|p| p.len() <= 42));
    }
}
