//! Input workers: the role that reads the job's data — decodes, tokenizes, shards — and serves each engine the
//! samples of its share of every step, as the seeds' input pre-processing servers do. Engines and MemoryX never
//! open a data file: MemoryX learns from a worker what the data holds ([`DataInfo`]) to plan the steps, and an
//! engine asks its workers for the samples a step names.
//!
//! - [`Feed`]: where an engine's samples come from, in this process ([`LocalFeed`]) or over the network
//!   ([`remote::RemoteFeed`], splitting each shard over the engine's workers).
//! - `server`: the `Input` gRPC service in front of a [`LocalFeed`].
//! - `node`: the `input` program.

pub mod node;
pub mod remote;
pub mod server;

use std::path::Path;
use std::sync::Arc;

use data::shard::Shard;
use data::shard::{Split, check_samples};
use data::{Dataset, split_even};
use errors::{Error, Result};
use kernels::tensor::Mat;

/// What a job's data holds, as MemoryX needs to know it: the number of steps an epoch has, which held-out
/// samples an evaluation reads, and the bar a language model must clear.
#[derive(Clone, Debug, PartialEq)]
pub struct DataInfo {
    /// Samples in the training split.
    pub train_samples: usize,
    /// Samples in the held-out split.
    pub test_samples: usize,
    /// The held-out samples an evaluation reads, in order.
    pub eval_samples: Vec<u32>,
    /// For a language model, the held-out loss of the training split's token frequencies.
    pub unigram_loss: Option<f64>,
}

impl DataInfo {
    /// What `train` and `test` hold.
    pub fn of(train: &Dataset, test: &Dataset) -> DataInfo {
        DataInfo {
            train_samples: train.len(),
            test_samples: test.len(),
            eval_samples: test.eval_samples(),
            unigram_loss: test.unigram_loss(train),
        }
    }
}

/// Where an engine's samples come from: it names a split and sample indices and gets its input matrix and
/// labels. One trait, so an engine in this process and an engine behind gRPC are fed the same way.
pub trait Feed: Send + Sync {
    /// What the data holds.
    fn describe(&self) -> Result<DataInfo>;

    /// The samples `samples` of `split`, in that order.
    fn shard(&self, split: Split, samples: &[u32]) -> Result<Shard>;
}

/// The data loaded in this process: what an input worker serves, and what `wsctl run --in-process` feeds its
/// engines from.
pub struct LocalFeed {
    train: Arc<Dataset>,
    test: Arc<Dataset>,
}

impl LocalFeed {
    /// Feeds from the splits `train` and `test`.
    pub fn new(train: Arc<Dataset>, test: Arc<Dataset>) -> LocalFeed {
        LocalFeed { train, test }
    }

    /// Loads the job's data, its paths taken inside `root` when the job names a volume.
    pub fn load(spec: &crds::TrainingJobSpec, root: Option<&Path>) -> Result<LocalFeed> {
        let (train, test) = data::load(spec, root)?;
        Ok(LocalFeed::new(Arc::new(train), Arc::new(test)))
    }

    fn split(&self, split: Split) -> &Dataset {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }
}

impl Feed for LocalFeed {
    fn describe(&self) -> Result<DataInfo> {
        Ok(DataInfo::of(&self.train, &self.test))
    }

    fn shard(&self, split: Split, samples: &[u32]) -> Result<Shard> {
        let data = self.split(split);
        check_samples(samples, data.len())?;
        Ok(data.shard(samples))
    }
}

/// The largest shard the plan lets an engine be sent: its samples, each `tokens_per_sample` columns of `rows`
/// values and a label per column. A worker's reply is checked against it before it is decoded, and the shard's
/// shape after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardBound {
    /// Samples per engine and step.
    pub samples: usize,
    /// Rows of the input matrix (features, or 1 for token ids).
    pub rows: usize,
    /// Columns per sample (1, or the context length).
    pub tokens_per_sample: usize,
}

impl ShardBound {
    /// The bound of the job `spec` describes.
    pub fn for_spec(spec: &crds::TrainingJobSpec) -> ShardBound {
        let layout = plan::layout::ModelLayout::from_spec(&spec.model);
        ShardBound {
            samples: plan::appliance::shard_of(spec).max(1),
            rows: layout.inputs(),
            tokens_per_sample: layout.tokens_per_sample(),
        }
    }

    /// Most bytes a worker's reply may take on the wire: 4 per input value, at most 5 per label (a varint), and
    /// room for the message's framing.
    pub fn reply_bytes(&self) -> usize {
        let cols = self.samples.saturating_mul(self.tokens_per_sample);
        cols.saturating_mul(self.rows.saturating_mul(4).saturating_add(5)).saturating_add(64 << 10)
    }
}

/// Joins the shards of consecutive runs of samples into the shard of all of them: columns side by side, in
/// order, so an engine fed by several workers holds exactly what one worker would have given it.
pub fn join_shards(parts: Vec<Shard>) -> Result<Shard> {
    let mut parts = parts.into_iter();
    let Some(first) = parts.next() else { return Err(Error::Protocol("no shard to join".into())) };
    let rest: Vec<Shard> = parts.collect();
    if rest.is_empty() {
        return Ok(first);
    }
    let rows = first.inputs.rows;
    if let Some(bad) = rest.iter().find(|s| s.inputs.rows != rows) {
        return Err(Error::Protocol(format!(
            "input workers disagree on the input rows ({rows} and {}); they must serve the same job",
            bad.inputs.rows
        )));
    }
    let all: Vec<&Shard> = std::iter::once(&first).chain(&rest).collect();
    let cols: usize = all.iter().map(|s| s.inputs.cols).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for s in &all {
            data.extend_from_slice(&s.inputs.data[r * s.inputs.cols..(r + 1) * s.inputs.cols]);
        }
    }
    let labels = all.iter().flat_map(|s| s.labels.iter().copied()).collect();
    Ok(Shard { inputs: Mat::from_vec(rows, cols, data), labels })
}

/// Splits an engine's samples over its `workers` input workers: contiguous runs whose sizes differ by at most
/// one, so [`join_shards`] of the workers' answers, in order, is the shard of all the samples.
pub fn per_worker(samples: &[u32], workers: usize) -> Vec<&[u32]> {
    split_even(samples, workers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use data::text::{TextWindows, Tokens};

    fn feed() -> LocalFeed {
        let bytes: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 251) as u8).collect();
        let train =
            Dataset::Text(TextWindows { tokens: Tokens::Bytes(bytes[..3000].to_vec()), vocab: 256, context: 8 });
        let test = Dataset::Text(TextWindows { tokens: Tokens::Bytes(bytes[3000..].to_vec()), vocab: 256, context: 8 });
        LocalFeed::new(Arc::new(train), Arc::new(test))
    }

    #[test]
    fn a_shard_split_over_workers_and_joined_is_the_shard_of_one_worker() {
        let f = feed();
        let samples: Vec<u32> = vec![5, 9, 1, 300, 44, 2, 17];
        let whole = f.shard(Split::Train, &samples).unwrap();
        for workers in 1..=4 {
            let parts = per_worker(&samples, workers).into_iter().map(|p| f.shard(Split::Train, p).unwrap()).collect();
            assert_eq!(join_shards(parts).unwrap(), whole, "{workers} workers");
        }
        // Features × samples, as an MLP's shard is laid out, join column by column too.
        let a = Shard { inputs: Mat::from_vec(2, 2, vec![1.0, 2.0, 10.0, 20.0]), labels: vec![0, 1] };
        let b = Shard { inputs: Mat::from_vec(2, 1, vec![3.0, 30.0]), labels: vec![2] };
        let j = join_shards(vec![a, b]).unwrap();
        assert_eq!(j.inputs.data, vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0]);
        assert_eq!(j.labels, vec![0, 1, 2]);
    }

    #[test]
    fn samples_beyond_the_data_are_refused() {
        let f = feed();
        let len = f.describe().unwrap().train_samples as u32;
        assert!(f.shard(Split::Train, &[len]).unwrap_err().to_string().contains("requested"));
        assert!(f.describe().unwrap().unigram_loss.is_some());
    }
}
