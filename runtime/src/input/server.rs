//! The `Input` gRPC service of one input worker, in front of the data it loaded. Every request must name the
//! worker's job and hold no more samples than an engine's shard (the plan's), so a caller cannot make the
//! worker build more than a step needs.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{DataInfo, Feed, LocalFeed};
use crate::protocol::pb::input_server::Input;
use crate::protocol::pb::{self, DescribeReply, DescribeRequest, ShardReply, ShardRequest};
use data::shard::Split;
use errors::Error;
use plan::limits::Limits;
use wire::grpc::JobGuard;
use wire::status::to_status;

/// The service of one input worker.
pub struct InputServer {
    job: JobGuard,
    /// The data, or why it could not be loaded: a worker whose data is unusable keeps serving that error, so
    /// MemoryX fails the job with the reason (a missing file, a corrupt tokenizer) instead of waiting on a
    /// worker that keeps crashing.
    feed: Result<Arc<LocalFeed>, Status>,
    limits: Arc<Limits>,
}

impl InputServer {
    /// Serves `feed` (or the error loading it gave) for `job`, refusing requests beyond the job's `limits`.
    pub fn new(job: String, feed: errors::Result<LocalFeed>, limits: Limits) -> InputServer {
        InputServer {
            job: JobGuard::new(job, "an input worker"),
            feed: feed.map(Arc::new).map_err(to_status),
            limits: Arc::new(limits),
        }
    }

    fn feed(&self) -> Result<&Arc<LocalFeed>, Status> {
        self.feed.as_ref().map_err(Clone::clone)
    }
}

/// The wire form of a [`DataInfo`].
pub fn info_to_reply(info: DataInfo) -> DescribeReply {
    DescribeReply {
        train_samples: info.train_samples as u64,
        test_samples: info.test_samples as u64,
        eval_samples: info.eval_samples,
        unigram_loss: info.unigram_loss,
    }
}

#[tonic::async_trait]
impl Input for InputServer {
    async fn describe(&self, request: Request<DescribeRequest>) -> Result<Response<DescribeReply>, Status> {
        self.job.check(&request.get_ref().job)?;
        Ok(Response::new(info_to_reply(self.feed()?.describe().map_err(to_status)?)))
    }

    async fn shard(&self, request: Request<ShardRequest>) -> Result<Response<ShardReply>, Status> {
        let r = request.into_inner();
        self.job.check(&r.job)?;
        self.feed()?;
        let split = match pb::Split::try_from(r.split) {
            Ok(pb::Split::Train) => Split::Train,
            Ok(pb::Split::Test) => Split::Test,
            Err(_) => return Err(Status::invalid_argument(format!("unknown split {}", r.split))),
        };
        Error::check_limit(
            || "the samples of a Shard request (an engine's shard of the batch)".into(),
            r.samples.len() as u64,
            self.limits.samples(1),
        )
        .map_err(to_status)?;
        let feed = self.feed()?.clone();
        let shard = tokio::task::spawn_blocking(move || feed.shard(split, &r.samples))
            .await
            .map_err(|e| Status::internal(format!("input task failed: {e}")))?
            .map_err(to_status)?;
        Ok(Response::new(ShardReply {
            rows: shard.inputs.rows as u32,
            cols: shard.inputs.cols as u32,
            inputs: shard.inputs.data,
            labels: shard.labels,
        }))
    }
}

/// The `Input` service of `server` for the network: its replies bounded by `reply_bytes`, the plan's largest
/// shard.
pub fn input_service(
    server: Arc<InputServer>,
    reply_bytes: usize,
) -> crate::protocol::pb::input_server::InputServer<InputServer> {
    crate::protocol::pb::input_server::InputServer::from_arc(server)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(reply_bytes)
}
