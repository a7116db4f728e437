//! Pre-tokenized text: a flat little-endian array of `uint16` or `uint32` token ids, as nanoGPT's `prepare.py`
//! writes `train.bin` and `val.bin`, so a corpus tokenized once elsewhere trains without its tokenizer.

use std::path::Path;

use super::text::MAX_VOCAB;
use errors::{Error, Result};

/// Reads a token file (gzip when it ends in `.gz`, bounded like any data file) and checks every id is below
/// `vocab` (`spec.model.vocabSize`): an id past the embedding would otherwise fail deep inside a training step.
pub fn read(path: &Path, token_type: crds::TokenType, vocab: usize) -> Result<Vec<u32>> {
    let bytes = crate::file::read_data_file(path)?;
    decode(&bytes, token_type, vocab).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// The ids of a token file's bytes, each checked against `vocab`.
pub fn decode(bytes: &[u8], token_type: crds::TokenType, vocab: usize) -> std::result::Result<Vec<u32>, String> {
    let (width, name) = match token_type {
        crds::TokenType::Uint16 => (2, "uint16"),
        crds::TokenType::Uint32 => (4, "uint32"),
    };
    if !bytes.len().is_multiple_of(width) {
        return Err(format!(
            "{} bytes is not a whole number of {name} token ids ({width} bytes each); the file is truncated or \
             spec.data.tokenType is not the width it was written with",
            bytes.len()
        ));
    }
    let limit = vocab.min(MAX_VOCAB);
    let mut ids = Vec::with_capacity(bytes.len() / width);
    let beyond = |id: u32, position: usize| {
        format!(
            "token id {id} at position {position} is beyond the vocabulary of {limit}; set spec.model.vocabSize to \
             at least {} (at most {MAX_VOCAB}), or check spec.data.tokenType ({name})",
            u64::from(id) + 1
        )
    };
    if width == 2 {
        for (position, pair) in bytes.chunks_exact(2).enumerate() {
            let id = u32::from(u16::from_le_bytes([pair[0], pair[1]]));
            if id as usize >= limit {
                return Err(beyond(id, position));
            }
            ids.push(id);
        }
    } else {
        for (position, quad) in bytes.chunks_exact(4).enumerate() {
            let id = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
            if id as usize >= limit {
                return Err(beyond(id, position));
            }
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint16_and_uint32_files_round_trip() {
        let ids: Vec<u32> = (0..1000u32).map(|i| i * 37 % 1024).collect();
        let le16: Vec<u8> = ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
        let le32: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(decode(&le16, crds::TokenType::Uint16, 1024).unwrap(), ids);
        assert_eq!(decode(&le32, crds::TokenType::Uint32, 1024).unwrap(), ids);
        // The full 16-bit range fits a 65,536-token vocabulary; Llama 3's 128,256 tokens need 32-bit ids.
        assert_eq!(decode(&[0xff, 0xff], crds::TokenType::Uint16, 65_536).unwrap(), vec![65_535]);
        assert_eq!(decode(&128_255u32.to_le_bytes(), crds::TokenType::Uint32, 128_256).unwrap(), vec![128_255]);
    }

    #[test]
    fn ragged_files_and_ids_beyond_the_vocabulary_are_refused() {
        let err = decode(&[1, 0, 2], crds::TokenType::Uint16, 256).unwrap_err();
        assert!(err.contains("3 bytes is not a whole number of uint16") && err.contains("tokenType"), "{err}");
        let err = decode(&[1, 0, 0, 0, 2, 0], crds::TokenType::Uint32, 256).unwrap_err();
        assert!(err.contains("uint32"), "{err}");
        let mut le: Vec<u8> = [5u16, 7, 300, 9].iter().flat_map(|i| i.to_le_bytes()).collect();
        let err = decode(&le, crds::TokenType::Uint16, 256).unwrap_err();
        assert!(err.contains("token id 300 at position 2 is beyond the vocabulary of 256"), "{err}");
        assert!(err.contains("at least 301"), "{err}");
        le = [5u32, 70_000].iter().flat_map(|i| i.to_le_bytes()).collect();
        let err = decode(&le, crds::TokenType::Uint32, 65_536).unwrap_err();
        assert!(err.contains("token id 70000 at position 1"), "{err}");
        // Beyond the largest vocabulary the appliance takes, whatever the job says.
        le = [5u32, 300_000].iter().flat_map(|i| i.to_le_bytes()).collect();
        let err = decode(&le, crds::TokenType::Uint32, 1 << 20).unwrap_err();
        assert!(err.contains("token id 300000 at position 1") && err.contains("at most 262144"), "{err}");

        let dir = std::env::temp_dir().join(format!("ws-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("train.bin");
        std::fs::write(&path, [1u8, 0, 2]).unwrap();
        let err = read(&path, crds::TokenType::Uint16, 256).unwrap_err().to_string();
        assert!(err.contains("train.bin") && err.contains("not a whole number"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
