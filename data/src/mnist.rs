//! The MNIST IDX format: big-endian magic and dimensions, then raw bytes. Files are found under their
//! standard names, raw or gzip-compressed, and every length is checked so a truncated download is reported
//! rather than trained on.

use std::path::{Path, PathBuf};

use crate::images::Images;
use errors::{Error, Result};

/// The two halves of the data set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The examples the model learns from (`train-*`).
    Train,
    /// The held-out examples it is evaluated on (`t10k-*`).
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Loads one split from `dir`, accepting `NAME` or `NAME.gz` for each file.
pub fn load(dir: &Path, split: Split) -> Result<Images> {
    let images = read_file(dir, &format!("{}-images-idx3-ubyte", split.prefix()))?;
    let labels = read_file(dir, &format!("{}-labels-idx1-ubyte", split.prefix()))?;
    let (image_dims, pixels) = parse_idx(&images.1, 3, &images.0)?;
    let (label_dims, labels_raw) = parse_idx(&labels.1, 1, &labels.0)?;
    if image_dims[0] != label_dims[0] {
        return Err(Error::Data(format!(
            "{} holds {} images but {} holds {} labels; the two files must come from the same split",
            images.0.display(),
            image_dims[0],
            labels.0.display(),
            label_dims[0]
        )));
    }
    if let Some(bad) = labels_raw.iter().find(|&&l| l > 9) {
        return Err(Error::Data(format!("{} holds label {bad}; MNIST labels are 0 to 9", labels.0.display())));
    }
    if image_dims[1] * image_dims[2] != 784 {
        return Err(Error::Data(format!(
            "{} holds {}x{} images; MNIST digits are 28x28",
            images.0.display(),
            image_dims[1],
            image_dims[2]
        )));
    }
    Ok(Images { features: 784, pixels: pixels.to_vec(), labels: labels_raw.to_vec() })
}

fn read_file(dir: &Path, name: &str) -> Result<(PathBuf, Vec<u8>)> {
    let raw = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    if raw.is_file() {
        return Ok((raw.clone(), crate::file::read_data_file(&raw)?));
    }
    if gz.is_file() {
        return Ok((gz.clone(), crate::file::read_data_file(&gz)?));
    }
    Err(Error::Data(format!(
        "{} not found (nor {}.gz); point spec.data.path at a folder holding the MNIST IDX files, \
         e.g. examples/data/mnist",
        raw.display(),
        name
    )))
}

/// Checks the header of an IDX file of unsigned bytes with `rank` dimensions and returns them and the payload.
fn parse_idx<'a>(bytes: &'a [u8], rank: usize, path: &Path) -> Result<(Vec<usize>, &'a [u8])> {
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(Error::Data(format!("{} is truncated: {} bytes, not even a header", path.display(), bytes.len())));
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if magic != 0x0800 | rank as u32 {
        return Err(Error::Data(format!(
            "{} is not an IDX file of {rank}-dimensional bytes (magic {magic:#010x}, {:#010x} expected)",
            path.display(),
            0x0800 | rank as u32
        )));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| u32::from_be_bytes([bytes[4 + 4 * i], bytes[5 + 4 * i], bytes[6 + 4 * i], bytes[7 + 4 * i]]) as usize)
        .collect();
    let want: usize = dims.iter().product();
    let have = bytes.len() - header;
    if have != want {
        return Err(Error::Data(format!(
            "{} is {}: its header promises {} bytes of data ({}) but it holds {have}; copy it again",
            path.display(),
            if have < want { "truncated" } else { "longer than its header says" },
            want,
            dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x"),
        )));
    }
    Ok((dims, &bytes[header..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/mnist")
    }

    #[test]
    fn reads_the_shipped_digits() {
        let train = load(&examples(), Split::Train).expect("train split");
        let test = load(&examples(), Split::Test).expect("test split");
        assert_eq!((train.len(), test.len()), (8000, 2000));
        assert!(train.labels.iter().all(|&l| l < 10));
        let mut counts = [0usize; 10];
        train.labels.iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| c > 600), "every digit is present: {counts:?}");
    }

    #[test]
    fn raw_files_missing_files_and_truncation_are_reported() {
        let dir = std::env::temp_dir().join(format!("ws-mnist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut images = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28];
        images.extend(vec![7u8; 2 * 784]);
        std::fs::write(dir.join("t10k-images-idx3-ubyte"), &images).unwrap();
        std::fs::write(dir.join("t10k-labels-idx1-ubyte"), [0, 0, 8, 1, 0, 0, 0, 2, 3, 9]).unwrap();
        let ok = load(&dir, Split::Test).expect("raw files load");
        assert_eq!(ok.labels, vec![3, 9]);

        std::fs::write(dir.join("t10k-images-idx3-ubyte"), &images[..1000]).unwrap();
        let err = load(&dir, Split::Test).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");

        let err = load(&dir, Split::Train).unwrap_err().to_string();
        assert!(err.contains("not found"), "{err}");

        std::fs::write(dir.join("train-images-idx3-ubyte.gz"), b"not gzip").unwrap();
        std::fs::write(dir.join("train-labels-idx1-ubyte"), [0, 0, 8, 1, 0, 0, 0, 0]).unwrap();
        let err = load(&dir, Split::Train).unwrap_err().to_string();
        assert!(err.contains("gzip"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
