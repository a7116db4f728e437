//! Reading a data file, bounded: what every format reads its bytes through.

use std::path::Path;

use errors::{Error, Result};

/// The most bytes a data file may hold, compressed or not: data sets live in memory, so more is refused before
/// it is read rather than found out by the kernel's OOM killer (or never, for `/dev/zero`).
pub const MAX_DATA_BYTES: u64 = 2 << 30;

/// Reads a data file whole: a regular file (not a device, a FIFO or a folder) of at most [`MAX_DATA_BYTES`],
/// gunzipped when its name ends in `.gz` (and the gunzipped bytes bounded alike, so a gzip bomb stops early).
pub fn read_data_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Data(format!("cannot open {} ({e}); check spec.data.path", path.display())))?;
    if !meta.is_file() {
        return Err(Error::Data(format!(
            "{} is not a regular file; point spec.data.path at a data file (or, for mnist, a folder of them)",
            path.display()
        )));
    }
    let too_big = || {
        Error::Data(format!(
            "{} holds more than {} bytes, the most a data file may hold; split or subsample it",
            path.display(),
            MAX_DATA_BYTES
        ))
    };
    if meta.len() > MAX_DATA_BYTES {
        return Err(too_big());
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut bytes = Vec::new();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(file)
            .take(MAX_DATA_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::Data(format!("{} is not a complete gzip file ({e}); copy it again", path.display())))?;
    } else {
        std::io::BufReader::new(file)
            .take(MAX_DATA_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    }
    if bytes.len() as u64 > MAX_DATA_BYTES {
        return Err(too_big());
    }
    Ok(bytes)
}
