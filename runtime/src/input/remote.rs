//! An engine's input workers on the network. Each shard of samples is split over the engine's workers in
//! order, fetched from all of them at once, checked against the plan, and joined back, so the engine holds
//! exactly what a single worker would have given it. A worker that is gone fails the call as unavailable and
//! the step is rerun (the driver's retry), by which time a restarted worker answers again.

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tonic::transport::Channel;

use super::{DataInfo, Feed, ShardBound, join_shards, per_worker};
use crate::protocol::pb::input_client::InputClient;
use crate::protocol::pb::{self, DescribeRequest, ShardRequest};
use data::shard::Shard;
use data::shard::Split;
use errors::{Error, Result};
use kernels::tensor::Mat;
use wire::grpc::{Dial, channel};
use wire::status::from_status;

/// One engine's input workers, dialled over mutual TLS.
pub struct RemoteFeed {
    handle: tokio::runtime::Handle,
    job: String,
    workers: Vec<(String, InputClient<Channel>)>,
    bound: ShardBound,
    /// How long the workers may take to come up (and load their data) when first asked.
    connect: Duration,
    /// What the workers described, once they have.
    info: std::sync::OnceLock<DataInfo>,
}

impl RemoteFeed {
    /// The workers at `urls` for `job`, dialled lazily: nothing waits until the data is first needed, so an
    /// engine comes up while its workers are still loading. `bound` is the plan's largest shard. The feed's
    /// calls block: make them outside the async runtime whose `handle` is given (or from a blocking task).
    pub fn new(
        handle: tokio::runtime::Handle,
        urls: &[String],
        job: &str,
        dial: Dial<'_>,
        bound: ShardBound,
    ) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::Protocol("an engine needs at least one input worker (--inputs)".into()));
        }
        let limit = bound.reply_bytes();
        // A channel spawns its connection task on the runtime it is made in.
        let _runtime = handle.enter();
        let workers = urls
            .iter()
            .map(|url| {
                let client = InputClient::new(channel(url, dial)?)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(64 << 10);
                Ok((url.clone(), client))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RemoteFeed {
            handle,
            job: job.to_string(),
            workers,
            bound,
            connect: dial.connect,
            info: std::sync::OnceLock::new(),
        })
    }

    /// Asks every worker what it holds, waiting up to the connect timeout for each to answer, and checks they
    /// all hold the same data.
    fn ask(&self) -> Result<DataInfo> {
        let connect = self.connect;
        let infos = self.handle.block_on(try_join_all(self.workers.iter().map(|(url, client)| {
            let (mut client, job) = (client.clone(), self.job.clone());
            async move {
                let deadline = Instant::now() + connect;
                loop {
                    match client.describe(DescribeRequest { job: job.clone() }).await {
                        Ok(r) => return info_from_reply(r.into_inner()),
                        Err(s)
                            if s.code() == tonic::Code::FailedPrecondition
                                || s.code() == tonic::Code::InvalidArgument =>
                        {
                            return Err(Error::Protocol(format!("input worker {url}: {}", s.message())));
                        }
                        // A worker that cannot read its data says why (a missing file, a bad tokenizer): that
                        // is the job's error, not a worker still starting.
                        Err(s) if s.code() == tonic::Code::Internal || s.code() == tonic::Code::NotFound => {
                            return Err(from_status(s, &format!("input worker {url}")));
                        }
                        Err(s) if Instant::now() >= deadline => {
                            return Err(Error::Unavailable(format!(
                                "input worker {url} did not answer within {connect:?}: {}",
                                s.message()
                            )));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        })))?;
        let info = infos[0].clone();
        if let Some((i, other)) = infos
            .iter()
            .enumerate()
            .find(|(_, o)| (o.train_samples, o.test_samples) != (info.train_samples, info.test_samples))
        {
            return Err(Error::Protocol(format!(
                "input workers {} and {} hold different data ({} and {} training samples); they must read the same files",
                self.workers[0].0, self.workers[i].0, info.train_samples, other.train_samples
            )));
        }
        Ok(info)
    }
}

/// A worker's description, bounded: an evaluation reads at most the held-out split.
fn info_from_reply(r: pb::DescribeReply) -> Result<DataInfo> {
    if r.eval_samples.len() as u64 > r.test_samples || r.eval_samples.iter().any(|&i| u64::from(i) >= r.test_samples) {
        return Err(Error::Protocol("an input worker described evaluation samples beyond its held-out split".into()));
    }
    let size =
        |n: u64| usize::try_from(n).map_err(|_| Error::Protocol(format!("an input worker described {n} samples")));
    Ok(DataInfo {
        train_samples: size(r.train_samples)?,
        test_samples: size(r.test_samples)?,
        eval_samples: r.eval_samples,
        unigram_loss: r.unigram_loss,
    })
}

impl Feed for RemoteFeed {
    fn describe(&self) -> Result<DataInfo> {
        if let Some(info) = self.info.get() {
            return Ok(info.clone());
        }
        let info = self.ask()?;
        Ok(self.info.get_or_init(|| info).clone())
    }

    fn shard(&self, split: Split, samples: &[u32]) -> Result<Shard> {
        Error::check_limit(
            || "the samples of an engine's shard".into(),
            samples.len() as u64,
            self.bound.samples as u64,
        )?;
        let split = match split {
            Split::Train => pb::Split::Train,
            Split::Test => pb::Split::Test,
        };
        let parts = per_worker(samples, self.workers.len());
        let bound = self.bound;
        let calls = self.workers.iter().zip(parts).filter(|(_, p)| !p.is_empty()).map(|((url, client), part)| {
            let mut client = client.clone();
            let request = ShardRequest { job: self.job.clone(), split: split as i32, samples: part.to_vec() };
            let want = part.len();
            async move {
                let reply = client.shard(request).await.map_err(|s| from_status(s, &format!("input worker {url}")))?;
                shard_from_reply(reply.into_inner(), want, bound).map_err(|e| match e {
                    Error::Protocol(m) => Error::Protocol(format!("input worker {url}: {m}")),
                    e => e,
                })
            }
        });
        let shards = self.handle.block_on(try_join_all(calls))?;
        if shards.is_empty() {
            return Ok(Shard { inputs: Mat::zeros(self.bound.rows, 0), labels: Vec::new() });
        }
        join_shards(shards)
    }
}

/// A worker's reply as a shard of `samples` samples, refused unless its shape is exactly what the plan says
/// such a shard is.
fn shard_from_reply(r: pb::ShardReply, samples: usize, bound: ShardBound) -> Result<Shard> {
    let (rows, cols) = (r.rows as usize, r.cols as usize);
    let want_cols = samples * bound.tokens_per_sample;
    if rows != bound.rows || cols != want_cols || r.inputs.len() != rows * cols || r.labels.len() != cols {
        return Err(Error::Protocol(format!(
            "a shard of {rows}x{cols} inputs ({} values, {} labels) does not fit {samples} samples of a model of \
             {} input rows and {} tokens per sample",
            r.inputs.len(),
            r.labels.len(),
            bound.rows,
            bound.tokens_per_sample
        )));
    }
    Ok(Shard { inputs: Mat::from_vec(rows, cols, r.inputs), labels: r.labels })
}
