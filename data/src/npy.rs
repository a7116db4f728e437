//! NumPy `.npy` files (format versions 1–3), read without NumPy: the magic, a Python-literal header giving
//! `descr`, `fortran_order` and `shape`, then the array's bytes in C order. The header is parsed here, since
//! the three keys are all that is needed and a crate for them would bring more than it saves.

use std::io::Read;
use std::path::Path;

use super::array::{Array, Dtype};
use errors::{Error, Result};

/// The largest header accepted: NumPy pads headers to 64 bytes and real ones are under 200; a longer one is
/// not a `.npy` file this reader can trust.
const MAX_HEADER: usize = 64 << 10;

/// Reads a `.npy` file: the header first, then, once its shape times its element size is checked against the
/// file's size (and [`crate::file::MAX_DATA_BYTES`]), the data.
pub fn read(path: &Path) -> Result<Array> {
    let shown = path.display();
    let bad = |what: String| {
        Error::Data(format!("{shown} is not a NumPy .npy file this reader takes: {what}; save it with numpy.save"))
    };
    let meta =
        std::fs::metadata(path).map_err(|e| Error::Data(format!("cannot open {shown} ({e}); check spec.data.path")))?;
    if !meta.is_file() {
        return Err(Error::Data(format!("{shown} is not a regular file; save the array with numpy.save")));
    }
    let mut file =
        std::io::BufReader::new(std::fs::File::open(path).map_err(|e| Error::io(format!("opening {shown}"), e))?);
    let mut magic = [0u8; 8];
    file.read_exact(&mut magic).map_err(|_| bad("shorter than the magic bytes".into()))?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err(bad("no \\x93NUMPY magic".into()));
    }
    let major = magic[6];
    let header_len = match major {
        1 => {
            let mut b = [0u8; 2];
            file.read_exact(&mut b).map_err(|_| bad("truncated header".into()))?;
            usize::from(u16::from_le_bytes(b))
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            file.read_exact(&mut b).map_err(|_| bad("truncated header".into()))?;
            u32::from_le_bytes(b) as usize
        }
        v => return Err(bad(format!("format version {v}"))),
    };
    if header_len > MAX_HEADER {
        return Err(bad(format!("a header of {header_len} bytes")));
    }
    let mut header = vec![0u8; header_len];
    file.read_exact(&mut header).map_err(|_| bad("truncated header".into()))?;
    let header = String::from_utf8_lossy(&header);
    let (dtype, shape) = parse_header(&header).map_err(bad)?;
    let offset = 8 + if major == 1 { 2 } else { 4 } + header_len as u64;
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    let want = elements.and_then(|n| n.checked_mul(dtype.width() as u64));
    let Some(want) = want.filter(|&w| w <= crate::file::MAX_DATA_BYTES) else {
        return Err(Error::Data(format!(
            "{shown}: the shape {shape:?} holds more than {} bytes, the most a data file may hold; subsample it",
            crate::file::MAX_DATA_BYTES
        )));
    };
    if meta.len() != offset + want {
        return Err(bad(format!(
            "its header gives the shape {shape:?} of {} ({want} bytes of data) but the file holds {} bytes after the \
             header; the file is truncated or not what its header says",
            dtype.name(),
            meta.len().saturating_sub(offset)
        )));
    }
    let mut data = vec![0u8; want as usize];
    file.read_exact(&mut data).map_err(|e| Error::io(format!("reading {shown}"), e))?;
    Ok(Array { dtype, shape, data })
}

/// The dtype and shape of a header such as `{'descr': '<f4', 'fortran_order': False, 'shape': (100, 8), }`.
fn parse_header(header: &str) -> std::result::Result<(Dtype, Vec<usize>), String> {
    let value = |key: &str| -> std::result::Result<&str, String> {
        let at = header.find(&format!("'{key}'")).ok_or_else(|| format!("no '{key}' in its header"))?;
        let rest = &header[at + key.len() + 2..];
        let colon = rest.find(':').ok_or_else(|| format!("no value for '{key}'"))?;
        Ok(rest[colon + 1..].trim_start())
    };
    let descr = value("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .ok_or_else(|| "a 'descr' that is not a simple dtype string (structured arrays are not read)".to_string())?;
    let dtype = match descr {
        "<f4" => Dtype::F32,
        "<f8" => Dtype::F64,
        "|u1" | "<u1" => Dtype::U8,
        "|i1" | "<i1" => Dtype::I8,
        "<i2" => Dtype::I16,
        "<u2" => Dtype::U16,
        "<i4" => Dtype::I32,
        "<u4" => Dtype::U32,
        "<i8" => Dtype::I64,
        "<u8" => Dtype::U64,
        other => {
            return Err(format!(
                "the dtype '{other}' (little-endian float32/float64 or integers are read; convert with \
                 array.astype('<f4'))"
            ));
        }
    };
    let fortran = value("fortran_order")?;
    if fortran.starts_with("True") {
        return Err("Fortran order (save a C-ordered copy: numpy.save(path, numpy.ascontiguousarray(array)))".into());
    } else if !fortran.starts_with("False") {
        return Err("a 'fortran_order' that is neither True nor False".into());
    }
    let shape = value("shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| "a 'shape' that is not a tuple".to_string())?;
    let mut dims = Vec::new();
    for d in inner.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        dims.push(d.trim_end_matches('L').parse::<usize>().map_err(|_| format!("the shape entry '{d}'"))?);
    }
    Ok((dtype, dims))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// Fuzzing the header parser (proptest): a header numpy writes, with any characters changed, cut or
        /// inserted, parses to a dtype and shape or is refused with a reason; any text at all does not panic.
        #[test]
        fn a_changed_header_parses_or_is_refused(
            dims in proptest::collection::vec(0usize..100_000, 0..4),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<char>(), 0u8..3), 0..4),
            noise in ".{0,200}",
        ) {
            let shape: Vec<String> = dims.iter().map(usize::to_string).collect();
            let mut header: Vec<char> =
                format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", shape.join(", "))
                    .chars()
                    .collect();
            let pristine = edits.is_empty();
            for (at, c, how) in edits {
                let i = at.index(header.len() + 1);
                match how {
                    0 if i < header.len() => header[i] = c,
                    1 => header.insert(i, c),
                    _ => header.truncate(i),
                }
            }
            let header: String = header.into_iter().collect();
            match parse_header(&header) {
                Ok((dtype, got)) if pristine => prop_assert_eq!((dtype, got), (Dtype::F32, dims)),
                Ok(_) => {}
                Err(e) => prop_assert!(!pristine && !e.is_empty(), "{e}"),
            }
            let _ = parse_header(&noise);
        }
    }

    /// Writes `data` as a `.npy` file of `descr` and `shape`, padded as numpy.save pads (version 1).
    pub(crate) fn write_npy(path: &Path, descr: &str, fortran: bool, shape: &[usize], data: &[u8]) {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
        let mut header = format!(
            "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
            if fortran { "True" } else { "False" }
        );
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn headers_give_dtype_and_shape() {
        let (d, s) = parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100, 8), }").unwrap();
        assert_eq!((d, s), (Dtype::F32, vec![100, 8]));
        let (d, s) = parse_header("{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }").unwrap();
        assert_eq!((d, s), (Dtype::I64, vec![7]));
        assert!(parse_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }").unwrap_err().contains(">f4"));
        let err = parse_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }").unwrap_err();
        assert!(err.contains("Fortran order"), "{err}");
    }

    #[test]
    fn files_round_trip_and_short_ones_are_refused_before_reading() {
        let dir = std::env::temp_dir().join(format!("ws-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inputs.npy");
        let values: Vec<u8> = [1.5f32, -2.0, 3.25, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_npy(&path, "<f4", false, &[3, 2], &values);
        let a = read(&path).unwrap();
        assert_eq!((a.dtype, a.shape.clone(), a.data.clone()), (Dtype::F32, vec![3, 2], values.clone()));
        // A header promising more than the file holds (or a huge shape) is caught from the sizes alone.
        write_npy(&path, "<f4", false, &[4, 2], &values);
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("[4, 2]"), "{err}");
        write_npy(&path, "<f8", false, &[1 << 40, 1 << 20], &values);
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
        write_npy(&path, "<f4", true, &[3, 2], &values);
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("Fortran order") && err.contains("inputs.npy"), "{err}");
        std::fs::write(&path, b"PK\x03\x04 a zip").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("magic"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
