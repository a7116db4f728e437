//! Labelled images (MNIST's kind of data set): features as bytes, turned into activations on demand.

use kernels::tensor::Mat;

use crate::shard::Shard;

/// Labelled examples with their features as bytes, turned into engine activations on demand.
#[derive(Clone, Debug, PartialEq)]
pub struct Images {
    /// Features per sample.
    pub features: usize,
    /// Sample-major feature bytes (`samples × features`).
    pub pixels: Vec<u8>,
    /// One class per sample.
    pub labels: Vec<u8>,
}

impl Images {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shard of `indices` as the engine holds it: features first, scaled to MNIST's usual zero mean and
    /// unit variance.
    pub fn shard(&self, indices: &[u32]) -> Shard {
        const MEAN: f32 = 0.1307;
        const STD: f32 = 0.3081;
        let n = indices.len();
        let normalised: [f32; 256] = std::array::from_fn(|p| (p as f32 / 255.0 - MEAN) / STD);
        let images: Vec<&[u8]> = indices
            .iter()
            .map(|&i| &self.pixels[i as usize * self.features..(i as usize + 1) * self.features])
            .collect();
        let mut inputs = Mat::zeros(self.features, n);
        // Feature by feature, so the writes run along a row of the features × samples matrix.
        for (f, row) in inputs.data.chunks_exact_mut(n.max(1)).enumerate() {
            for (x, image) in row.iter_mut().zip(&images) {
                *x = normalised[image[f] as usize];
            }
        }
        Shard { inputs, labels: indices.iter().map(|&i| u32::from(self.labels[i as usize])).collect() }
    }
}
