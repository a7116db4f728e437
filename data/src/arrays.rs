//! Named arrays of inputs and labels for MLPs, so any input width and class count trains: a `.safetensors` file
//! holding both tensors, or a folder of NumPy `.npy` files (`INPUTS.npy`, `LABELS.npy` after
//! `spec.data.inputs`/`labels`). Inputs are `[samples, features]` of a float or integer dtype, taken as they are
//! (no normalisation: the user's features are the user's); labels `[samples]` of an integer dtype.

use std::path::Path;

use super::array::{Array, ArrayRef, Dtype};
use crate::shard::Shard;
use errors::{Error, Result};
use kernels::tensor::Mat;

/// Share of the samples held out when no held-out file is named, taken from the end (at least one sample).
pub const HELD_OUT: f64 = 0.05;

/// Samples of `features` values each with one class each: what an MLP trains on.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrays {
    /// Features per sample (the model's input width).
    pub features: usize,
    /// Sample-major features (`samples × features`).
    pub inputs: Vec<f32>,
    /// One class per sample, below the model's output width.
    pub labels: Vec<u32>,
}

impl Arrays {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shard of `indices` as the engine holds it: features × samples, the values as given.
    pub fn shard(&self, indices: &[u32]) -> Shard {
        let n = indices.len();
        let f = self.features;
        let mut inputs = Mat::zeros(f, n);
        // Sample by sample, each sample's features contiguous in the source.
        for (j, &i) in indices.iter().enumerate() {
            let sample = &self.inputs[i as usize * f..(i as usize + 1) * f];
            for (k, &x) in sample.iter().enumerate() {
                inputs.data[k * n + j] = x;
            }
        }
        Shard { inputs, labels: indices.iter().map(|&i| self.labels[i as usize]).collect() }
    }

    /// Splits off the last [`HELD_OUT`] of the samples (at least one) as the held-out split.
    pub fn hold_out_tail(mut self, source: &Path) -> Result<(Arrays, Arrays)> {
        let n = self.len();
        if n < 2 {
            return Err(Error::Data(format!(
                "{} holds {n} sample(s), too few to hold one out; add samples or name spec.data.heldOutPath",
                source.display()
            )));
        }
        let held = ((n as f64 * HELD_OUT) as usize).max(1);
        let cut = n - held;
        let test = Arrays {
            features: self.features,
            inputs: self.inputs.split_off(cut * self.features),
            labels: self.labels.split_off(cut),
        };
        Ok((self, test))
    }
}

/// Reads the inputs and labels a job names from `path` (a `.safetensors` file or a folder of `.npy` files) and
/// checks them against the model: as many features as `spec.model.layers[0]`, every label below the last width.
pub fn load(path: &Path, spec: &crds::TrainingJobSpec) -> Result<Arrays> {
    let (inputs_name, labels_name) = (&spec.data.inputs, &spec.data.labels);
    let layers = &spec.model.layers;
    let (Some(&width), Some(&classes)) = (layers.first(), layers.last()) else {
        return Err(Error::Data(
            "spec.data.kind arrays trains an mlp: give spec.model.layers from the input width to the class count"
                .into(),
        ));
    };
    let shown = path.display();
    let checked = |inputs: ArrayRef, labels: ArrayRef| {
        from_arrays(&inputs, &labels, width as usize, classes as usize)
            .map_err(|e| Error::Data(format!("{shown}: {e}")))
    };
    if path.is_dir() {
        let (inputs, labels) = (npy_in(path, inputs_name)?, npy_in(path, labels_name)?);
        return checked(inputs.view(), labels.view());
    }
    let bytes = crate::file::read_data_file(path)?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
        Error::Data(format!(
            "{shown} is not a safetensors file ({e}); write one with safetensors' save_file, or point \
             spec.data.path at a folder of .npy files"
        ))
    })?;
    let take = |name: &str| -> Result<ArrayRef> {
        let view = st.tensor(name).map_err(|_| {
            let mut names: Vec<&str> = st.names();
            names.sort_unstable();
            Error::Data(format!(
                "{shown} has no tensor '{name}' (it holds {}); set spec.data.inputs and spec.data.labels to \
                 the names of the inputs and labels",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ))
        })?;
        let dtype = Dtype::from_safetensors(view.dtype()).ok_or_else(|| {
            Error::Data(format!(
                "{shown}: the tensor '{name}' is {:?}, which is not read; store float32, float64 or an integer type",
                view.dtype()
            ))
        })?;
        Ok(ArrayRef { dtype, shape: view.shape().to_vec(), data: view.data() })
    };
    // Converted straight from the file's bytes: no copy of the tensors is made on the way.
    checked(take(inputs_name)?, take(labels_name)?)
}

/// Reads `NAME.npy` from the folder `dir`, listing the arrays it holds when `NAME.npy` is missing.
fn npy_in(dir: &Path, name: &str) -> Result<Array> {
    if name.contains(['/', '\\']) || name == ".." {
        return Err(Error::Data(format!(
            "the array name '{name}' is a path; give a plain name (NAME.npy in {})",
            dir.display()
        )));
    }
    let path = dir.join(format!("{name}.npy"));
    if !path.exists() {
        let mut present: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".npy")).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        present.sort_unstable();
        return Err(Error::Data(format!(
            "{} has no array '{name}' ({name}.npy; it holds {}); set spec.data.inputs and spec.data.labels to the \
             names of the inputs and labels",
            dir.display(),
            if present.is_empty() { "no .npy files".to_string() } else { present.join(", ") }
        )));
    }
    super::npy::read(&path)
}

/// Checks and converts a pair of arrays against the model's input width and class count.
pub fn from_arrays(
    inputs: &ArrayRef,
    labels: &ArrayRef,
    width: usize,
    classes: usize,
) -> std::result::Result<Arrays, String> {
    let [samples, features] = inputs.shape[..] else {
        return Err(format!(
            "the inputs have the shape {:?}; they must be [samples, features] (reshape images to one row each)",
            inputs.shape
        ));
    };
    if features != width {
        return Err(format!(
            "the inputs have {features} features but the model's first layer takes {width}; set \
             spec.model.layers[0] to {features}"
        ));
    }
    let label_rows = match labels.shape[..] {
        [n] | [n, 1] => n,
        _ => return Err(format!("the labels have the shape {:?}; they must be [samples]", labels.shape)),
    };
    if label_rows != samples {
        return Err(format!(
            "the inputs hold {samples} samples but the labels {label_rows}; give one label per sample"
        ));
    }
    if samples == 0 {
        return Err("the arrays hold no samples".into());
    }
    let inputs_f32 = to_f32(inputs)?;
    if let Some(i) = inputs_f32.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "input {} of sample {} is {}; replace missing or infinite values before training",
            i % features,
            i / features,
            inputs_f32[i]
        ));
    }
    let labels_u32 = to_labels(labels, classes)?;
    Ok(Arrays { features, inputs: inputs_f32, labels: labels_u32 })
}

/// The values of a float or integer array as f32.
fn to_f32(a: &ArrayRef) -> std::result::Result<Vec<f32>, String> {
    let d = a.data;
    let mut out = Vec::with_capacity(d.len() / a.dtype.width());
    match a.dtype {
        Dtype::F32 => d.chunks_exact(4).for_each(|b| out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        Dtype::F64 => d.chunks_exact(8).for_each(|b| out.push(f64::from_le_bytes(b8(b)) as f32)),
        Dtype::U8 => d.iter().for_each(|&b| out.push(f32::from(b))),
        Dtype::I8 => d.iter().for_each(|&b| out.push(f32::from(b as i8))),
        Dtype::I16 => d.chunks_exact(2).for_each(|b| out.push(f32::from(i16::from_le_bytes([b[0], b[1]])))),
        Dtype::U16 => d.chunks_exact(2).for_each(|b| out.push(f32::from(u16::from_le_bytes([b[0], b[1]])))),
        Dtype::I32 => d.chunks_exact(4).for_each(|b| out.push(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)),
        Dtype::U32 => d.chunks_exact(4).for_each(|b| out.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)),
        Dtype::I64 => d.chunks_exact(8).for_each(|b| out.push(i64::from_le_bytes(b8(b)) as f32)),
        Dtype::U64 => d.chunks_exact(8).for_each(|b| out.push(u64::from_le_bytes(b8(b)) as f32)),
    }
    Ok(out)
}

fn b8(b: &[u8]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// The classes of an integer array, each checked to be below `classes`.
fn to_labels(a: &ArrayRef, classes: usize) -> std::result::Result<Vec<u32>, String> {
    let d = a.data;
    let mut out = Vec::with_capacity(d.len() / a.dtype.width());
    let mut push = |v: i128| -> std::result::Result<(), String> {
        if v < 0 || v >= classes as i128 {
            return Err(format!(
                "label {v} of sample {} is not a class of the model's last layer (0 to {}); set the last of \
                 spec.model.layers to the number of classes",
                out.len(),
                classes.saturating_sub(1)
            ));
        }
        out.push(v as u32);
        Ok(())
    };
    match a.dtype {
        Dtype::F32 | Dtype::F64 => {
            return Err(format!(
                "the labels are {}; store classes as integers (labels.astype('int64'))",
                a.dtype.name()
            ));
        }
        Dtype::U8 => d.iter().try_for_each(|&b| push(i128::from(b)))?,
        Dtype::I8 => d.iter().try_for_each(|&b| push(i128::from(b as i8)))?,
        Dtype::I16 => d.chunks_exact(2).try_for_each(|b| push(i128::from(i16::from_le_bytes([b[0], b[1]]))))?,
        Dtype::U16 => d.chunks_exact(2).try_for_each(|b| push(i128::from(u16::from_le_bytes([b[0], b[1]]))))?,
        Dtype::I32 => {
            d.chunks_exact(4).try_for_each(|b| push(i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))))?
        }
        Dtype::U32 => {
            d.chunks_exact(4).try_for_each(|b| push(i128::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))))?
        }
        Dtype::I64 => d.chunks_exact(8).try_for_each(|b| push(i128::from(i64::from_le_bytes(b8(b)))))?,
        Dtype::U64 => d.chunks_exact(8).try_for_each(|b| push(i128::from(u64::from_le_bytes(b8(b)))))?,
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::tests::write_npy;

    fn spec(path: &Path, layers: Vec<u32>) -> crds::TrainingJobSpec {
        let mut s = crate::tests::example("fc-mnist.yaml");
        s.model.layers = layers;
        s.data = crds::DataSpec::local(crds::DataKind::Arrays, path.to_string_lossy());
        s
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ws-arrays-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_safetensors(path: &Path, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn safetensors_and_npy_round_trip_to_the_same_samples() {
        let dir = temp("rt");
        let x: Vec<f32> = (0..30).map(|i| i as f32 * 0.5 - 3.0).collect();
        let y: Vec<i64> = (0..10).map(|i| i % 3).collect();
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let st = dir.join("data.safetensors");
        write_safetensors(
            &st,
            &[
                ("inputs", safetensors::Dtype::F32, vec![10, 3], xb.clone()),
                ("labels", safetensors::Dtype::I64, vec![10], yb.clone()),
            ],
        );
        let a = load(&st, &spec(&st, vec![3, 8, 3])).unwrap();
        assert_eq!((a.features, a.len()), (3, 10));
        assert_eq!(a.inputs, x);
        assert_eq!(a.labels, vec![0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        let npy = dir.join("npy");
        std::fs::create_dir_all(&npy).unwrap();
        // float64 inputs are read as f32; int32 labels as classes.
        let x64: Vec<u8> = x.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect();
        let y32: Vec<u8> = y.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
        write_npy(&npy.join("inputs.npy"), "<f8", false, &[10, 3], &x64);
        write_npy(&npy.join("labels.npy"), "<i4", false, &[10], &y32);
        assert_eq!(load(&npy, &spec(&npy, vec![3, 8, 3])).unwrap(), a);
        // Shards are features × samples, the values untouched.
        let s = a.shard(&[4, 1]);
        assert_eq!((s.inputs.rows, s.inputs.cols), (3, 2));
        assert_eq!(s.inputs.data, vec![x[12], x[3], x[13], x[4], x[14], x[5]]);
        assert_eq!(s.labels, vec![1, 1]);
        let (train, test) = a.clone().hold_out_tail(&st).unwrap();
        assert_eq!((train.len(), test.len()), (9, 1));
        assert_eq!(test.inputs, x[27..]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn arrays_that_disagree_with_the_model_are_clear_errors() {
        let dir = temp("bad");
        let st = dir.join("d.safetensors");
        let x: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let y = vec![0u8, 1, 2, 3];
        write_safetensors(
            &st,
            &[("x", safetensors::Dtype::F32, vec![4, 3], x.clone()), ("y", safetensors::Dtype::U8, vec![4], y.clone())],
        );
        let err = load(&st, &spec(&st, vec![3, 4])).unwrap_err().to_string();
        assert!(err.contains("no tensor 'inputs' (it holds x, y)"), "{err}");
        let mut s = spec(&st, vec![4, 4]);
        s.data.inputs = "x".into();
        s.data.labels = "y".into();
        let err = load(&st, &s).unwrap_err().to_string();
        assert!(err.contains("3 features but the model's first layer takes 4"), "{err}");
        s.model.layers = vec![3, 3];
        let err = load(&st, &s).unwrap_err().to_string();
        assert!(err.contains("label 3 of sample 3") && err.contains("0 to 2"), "{err}");
        s.model.layers = vec![3, 4];
        assert_eq!(load(&st, &s).unwrap().len(), 4);
        write_safetensors(
            &st,
            &[
                ("x", safetensors::Dtype::F32, vec![4, 3], x.clone()),
                ("y", safetensors::Dtype::U8, vec![3], y[..3].to_vec()),
            ],
        );
        let err = load(&st, &s).unwrap_err().to_string();
        assert!(err.contains("4 samples but the labels 3"), "{err}");
        write_safetensors(
            &st,
            &[("x", safetensors::Dtype::F32, vec![12], x.clone()), ("y", safetensors::Dtype::U8, vec![4], y.clone())],
        );
        assert!(load(&st, &s).unwrap_err().to_string().contains("[samples, features]"));
        write_safetensors(
            &st,
            &[
                ("x", safetensors::Dtype::BF16, vec![4, 3], x[..24].to_vec()),
                ("y", safetensors::Dtype::U8, vec![4], y.clone()),
            ],
        );
        assert!(load(&st, &s).unwrap_err().to_string().contains("BF16"));
        let yf: Vec<u8> = [0f32, 1.0, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_safetensors(
            &st,
            &[("x", safetensors::Dtype::F32, vec![4, 3], x.clone()), ("y", safetensors::Dtype::F32, vec![4], yf)],
        );
        assert!(load(&st, &s).unwrap_err().to_string().contains("store classes as integers"));
        std::fs::write(&st, b"garbage").unwrap();
        assert!(load(&st, &s).unwrap_err().to_string().contains("not a safetensors file"));
        // A folder missing the named array lists what it has.
        let npy = dir.join("npy");
        std::fs::create_dir_all(&npy).unwrap();
        write_npy(&npy.join("features.npy"), "<f4", false, &[4, 3], &x);
        let err = load(&npy, &spec(&npy, vec![3, 4])).unwrap_err().to_string();
        assert!(err.contains("no array 'inputs'") && err.contains("holds features"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
