//! Where a TrainingJob manifest comes from: a file, or `-` for standard input, so a program that built a job
//! (the Python package, a script) hands it over without writing a file. Either way the text is bounded before
//! it is read whole: a manifest is a few KiB, so more is not a manifest.

use std::io::Read;
use std::path::Path;

/// The path that means standard input.
pub const STDIN: &str = "-";
/// Most bytes of a manifest read.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The manifest's text, from the file at `path` or from standard input for `-`.
pub fn read(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    let read = if path.as_os_str() == STDIN {
        std::io::stdin().lock().take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text)?
    } else {
        std::fs::File::open(path)?.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text)?
    };
    if read as u64 > MAX_MANIFEST_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {MAX_MANIFEST_BYTES} bytes, which no TrainingJob is"),
        ));
    }
    Ok(text)
}

/// How errors name the manifest: its path, or "standard input".
pub fn label(path: &Path) -> String {
    if path.as_os_str() == STDIN { "standard input".into() } else { path.display().to_string() }
}
