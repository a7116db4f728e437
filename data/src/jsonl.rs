//! JSON Lines corpora: one JSON object per line with its text in `spec.data.textField`, as most datasets on the
//! Hugging Face hub export. The documents are joined with a line break into one text, then read as bytes or
//! tokenized like a `text` file.

use std::path::Path;

use errors::{Error, Result};

/// Reads a `.jsonl` file (gzip when it ends in `.gz`) and returns its documents' texts joined by `\n`.
pub fn read(path: &Path, field: &str) -> Result<Vec<u8>> {
    let bytes = crate::file::read_data_file(path)?;
    join(&bytes, field).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// The texts of `field` in each line of `bytes`, joined by `\n`; blank lines are skipped.
pub fn join(bytes: &[u8], field: &str) -> std::result::Result<Vec<u8>, String> {
    // The texts are never longer than the file that holds them (JSON escapes only lengthen them).
    let mut out = Vec::with_capacity(bytes.len());
    let mut documents = 0usize;
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let number = n + 1;
        let value: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| format!("line {number} is not JSON ({e}); each line must be one JSON object"))?;
        let Some(object) = value.as_object() else {
            return Err(format!("line {number} is not a JSON object; each line must be {{\"{field}\": \"...\"}}"));
        };
        let text = match object.get(field) {
            Some(serde_json::Value::String(s)) => s,
            Some(other) => {
                return Err(format!(
                    "line {number}: the field \"{field}\" is not a string (it is {}); set spec.data.textField to \
                     the field holding the text",
                    kind(other)
                ));
            }
            None => {
                let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
                keys.truncate(10);
                return Err(format!(
                    "line {number} has no field \"{field}\" (it has {}); set spec.data.textField to the field \
                     holding the text",
                    if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
                ));
            }
        };
        if documents > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(text.as_bytes());
        documents += 1;
    }
    if documents == 0 {
        return Err("no documents (the file is empty); give one JSON object per line".into());
    }
    Ok(out)
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_joined_by_line_breaks() {
        let file = b"{\"text\": \"Call me Ishmael.\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"caf\\u00e9\\nnext\"}\r\n";
        assert_eq!(join(file, "text").unwrap(), "Call me Ishmael.\ncafé\nnext".as_bytes());
        assert_eq!(join(b"{\"body\": \"a\"}\n{\"body\": \"b\"}", "body").unwrap(), b"a\nb");
    }

    #[test]
    fn bad_lines_are_reported_by_number() {
        let err = join(b"{\"text\": \"a\"}\n{\"text\": \"b\"\n", "text").unwrap_err();
        assert!(err.starts_with("line 2 is not JSON"), "{err}");
        let err = join(b"{\"text\": \"a\"}\n{\"body\": \"b\"}\n", "text").unwrap_err();
        assert!(err.contains("line 2 has no field \"text\" (it has body)") && err.contains("textField"), "{err}");
        let err = join(b"{\"text\": 3}\n", "text").unwrap_err();
        assert!(err.contains("line 1: the field \"text\" is not a string (it is a number)"), "{err}");
        let err = join(b"[\"text\"]\n", "text").unwrap_err();
        assert!(err.contains("line 1 is not a JSON object"), "{err}");
        assert!(join(b"\n\n", "text").unwrap_err().contains("no documents"));
    }
}
