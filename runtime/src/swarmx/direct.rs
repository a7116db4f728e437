//! The coordinator's side of MemoryX without a funnel: the SwarmX root's `Streamer` ([`super::streamer`]), which
//! streams each step's layers straight from the weight servers, asked for a step with the batch alone.

use tokio::runtime::Handle;
use tonic::Response;
use tonic::transport::Channel;

use super::{StepRequest, Streamer};
use crate::model::loss::LossSum;
use crate::protocol::pb::streamer_client::StreamerClient;
use crate::protocol::pb::{StreamStepReply, StreamStepRequest};
use errors::{Error, Result};
use wire::status::from_status;

/// The coordinator's side: the root's `Streamer` over the root's channel, with the servers it streams from.
pub struct DirectRoot {
    handle: Handle,
    url: String,
    job: String,
    servers: Vec<String>,
    client: StreamerClient<Channel>,
}

impl DirectRoot {
    /// The `Streamer` of the root at `url` over `channel`, streaming from `servers` (the coordinator first).
    pub fn new(handle: Handle, url: &str, channel: Channel, job: &str, servers: Vec<String>) -> DirectRoot {
        let client = StreamerClient::new(channel);
        DirectRoot { handle, url: url.to_string(), job: job.to_string(), servers, client }
    }

    fn loss_of(&self, reply: &StreamStepReply) -> Result<LossSum> {
        let loss = reply
            .loss
            .ok_or_else(|| Error::Protocol(format!("{}: a streamed step's reply without its loss", self.url)))?;
        Ok(LossSum::from(loss))
    }

    fn call(&self, request: &StepRequest, train: bool) -> Result<StreamStepReply> {
        let begin = request.to_pb(&self.job);
        let r = StreamStepRequest { job: self.job.clone(), begin: Some(begin), servers: self.servers.clone() };
        let (mut client, url) = (self.client.clone(), self.url.clone());
        self.handle.block_on(async move {
            let reply = if train { client.train(r).await } else { client.evaluate(r).await };
            reply.map(Response::into_inner).map_err(|s| from_status(s, &url))
        })
    }
}

impl Streamer for DirectRoot {
    fn train(&mut self, request: &StepRequest) -> Result<(LossSum, u64)> {
        let reply = self.call(request, true)?;
        Ok((self.loss_of(&reply)?, reply.bytes))
    }

    fn evaluate(&mut self, request: &StepRequest) -> Result<LossSum> {
        let reply = self.call(request, false)?;
        self.loss_of(&reply)
    }
}
