//! MemoryX without a funnel: the SwarmX root of a job whose state is spread over weight servers streams each
//! layer straight from the servers' slices to its children, and hands each server its slice of the summed
//! gradients. The coordinator keeps the plan, the step and the checkpoints: it sends the batch
//! ([`super::direct::DirectRoot`], the client) and commits the step the root ([`StreamerService`]) staged.
//!
//! The root learns the servers from the coordinator's request (their number checked against the plan, each an
//! `https://` address dialled with the job's identity) and their masks from the coordinator (metered against
//! the plan's shapes), and runs exactly the loop the coordinator would ([`super::stream`]): the same layers,
//! the same sums in the same order, so the curve is the same bit for bit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tonic::{Request, Response, Status};

use super::remote::RemoteSwarm;
use super::{StepRequest, stream};
use crate::memoryx::remote::RemoteServer;
use crate::memoryx::slice::{LayerLengths, SliceId};
use crate::memoryx::store::MemoryX;
use crate::memoryx::weight_server::{Masking, WeightServer, layer_lengths};
use crate::optim::Recipe;
use crate::protocol::pb::streamer_server::{self, Streamer as StreamerRpc};
use crate::protocol::pb::{BeginStepRequest, StreamStepReply, StreamStepRequest};
use data::shard::Split;
use errors::{Error, Result};
use kernels::sparse::SparsePattern;
use plan::layout::ModelLayout;
use plan::limits::Limits;
use wire::grpc::{Dial, JobGuard};
use wire::identity::Identity;
use wire::status::to_status;

/// The longest weight-server address accepted: a URL, not a payload.
const MAX_ADDRESS: usize = 512;

/// What the root needs to reach the servers and its children: the job, its plan's bounds, and how to dial.
pub struct RootSite {
    /// The job's spec: the model, the optimizer and the plan's server count.
    pub spec: crds::TrainingJobSpec,
    /// The job's identity on the wire.
    pub job: String,
    /// Its children's addresses, in engine order.
    pub children: Vec<String>,
    /// Engines below it: what bounds a batch.
    pub engines: u32,
    /// The job's TLS identity.
    pub identity: Identity,
    /// How long a server or child may take to answer its first call.
    pub connect: Duration,
    /// How long one call may take.
    pub call: Duration,
    /// What the plan lets a message make this process hold.
    pub limits: Limits,
}

/// The servers and children a root streams between, once the coordinator has named the servers.
struct Attached {
    servers: Vec<String>,
    store: MemoryX,
    swarm: RemoteSwarm,
    layers: usize,
}

/// The `Streamer` service of a SwarmX root.
pub struct StreamerService {
    guard: JobGuard,
    site: Arc<RootSite>,
    handle: Handle,
    /// One step at a time; rebuilt when the coordinator names other servers.
    attached: Arc<Mutex<Option<Attached>>>,
}

impl StreamerService {
    /// The root's streamer at `site`, its blocking calls made on the runtime of `handle`.
    pub fn new(site: RootSite, handle: Handle) -> StreamerService {
        StreamerService {
            guard: JobGuard::new(site.job.clone(), "a SwarmX root"),
            site: Arc::new(site),
            handle,
            attached: Arc::new(Mutex::new(None)),
        }
    }

    /// The service for the network: each message is small (a batch's indices, a loss).
    pub fn into_server(self) -> streamer_server::StreamerServer<StreamerService> {
        streamer_server::StreamerServer::new(self)
    }

    /// Checks `r` (its job, its batch within the engines' shards, its split, its servers) and runs `work` on
    /// the attached servers and children, off the async threads.
    async fn run<T: Send + 'static>(
        &self,
        r: StreamStepRequest,
        split: Split,
        work: impl FnOnce(&mut Attached, &StepRequest) -> Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        self.guard.check(&r.job)?;
        let begin = r.begin.ok_or_else(|| Status::invalid_argument("a streamed step without its batch"))?;
        self.guard.check(&begin.job)?;
        let request = step_request(&begin, &self.site.limits, self.site.engines as usize).map_err(to_status)?;
        if request.split != split {
            return Err(Status::invalid_argument("a held-out batch asked to train, or a training batch to evaluate"));
        }
        let (site, attached, handle) = (self.site.clone(), self.attached.clone(), self.handle.clone());
        let servers = r.servers;
        tokio::task::spawn_blocking(move || {
            let mut held = attached.lock().map_err(|_| Error::Protocol("the streamer's state is poisoned".into()))?;
            if held.as_ref().is_none_or(|a| a.servers != servers) {
                *held = None;
                *held = Some(attach(&site, &handle, servers)?);
            }
            let a = held.as_mut().ok_or_else(|| Error::Protocol("no weight servers attached".into()))?;
            a.store.expect_step(request.step);
            work(a, &request)
        })
        .await
        .map_err(|e| Status::internal(format!("a streamed step failed: {e}")))?
        .map_err(to_status)
    }
}

#[tonic::async_trait]
impl StreamerRpc for StreamerService {
    async fn train(&self, request: Request<StreamStepRequest>) -> Result<Response<StreamStepReply>, Status> {
        let (loss, bytes) = self
            .run(request.into_inner(), Split::Train, |a, r| stream::train_passes(&a.store, &mut a.swarm, a.layers, r))
            .await?;
        Ok(Response::new(StreamStepReply { loss: Some(loss.into()), bytes }))
    }

    async fn evaluate(&self, request: Request<StreamStepRequest>) -> Result<Response<StreamStepReply>, Status> {
        let loss = self
            .run(request.into_inner(), Split::Test, |a, r| stream::eval_pass(&a.store, &mut a.swarm, a.layers, r))
            .await?;
        Ok(Response::new(StreamStepReply { loss: Some(loss.into()), bytes: 0 }))
    }
}

/// A batch as the coordinator sent it, refused when it holds more samples than the shards of the `engines`
/// below.
fn step_request(b: &BeginStepRequest, limits: &Limits, engines: usize) -> Result<StepRequest> {
    Error::check_limit(|| "the samples of a streamed step".into(), b.samples.len() as u64, limits.samples(engines))?;
    StepRequest::from_pb(b)
}

/// The root's view of the servers at `servers` (the coordinator first) and of its children: every address
/// checked, each server's slice and the coordinator's masks checked against the plan.
fn attach(site: &RootSite, handle: &Handle, servers: Vec<String>) -> Result<Attached> {
    let spec = &site.spec;
    let count = plan::memoryx::MemoryxPlan::for_spec(spec)?.servers;
    if servers.len() != count as usize {
        return Err(Error::Protocol(format!(
            "{} weight servers named; the plan spreads MemoryX over {count}",
            servers.len()
        )));
    }
    if let Some(bad) = servers.iter().find(|u| !u.starts_with("https://") || u.len() > MAX_ADDRESS) {
        let shown: String = bad.chars().take(64).collect();
        return Err(Error::Protocol(format!("weight server address '{shown}' refused: an https:// URL is required")));
    }
    let layout = ModelLayout::from_spec(&spec.model);
    let lengths = layer_lengths(&layout, &spec.training.optimizer, &Masking::of(&Recipe::of(spec, 0)));
    let dial = Dial::new(&site.identity, site.connect).with_call_timeout(site.call);
    let remote = servers
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let slice = SliceId { index: i as u32, count };
            RemoteServer::new(handle.clone(), url, &site.job, slice, &lengths, dial).map(Arc::new)
        })
        .collect::<Result<Vec<_>>>()?;
    let coordinator = remote.first().ok_or_else(|| Error::Protocol("no weight servers named".into()))?;
    let masks = (0..layout.linears.len())
        .map(|l| checked_mask(coordinator.mask(l, &site.limits)?, &layout, &lengths, l))
        .collect::<Result<Vec<_>>>()?;
    let remote = remote.into_iter().map(|s| s as Arc<dyn WeightServer>).collect();
    let layers = layout.linears.len();
    let store = MemoryX::with_masks(layout, masks, lengths, remote, None);
    let swarm = RemoteSwarm::connect_all(handle.clone(), &site.children, &site.job, dial, site.limits.clone())?;
    tracing::info!(
        servers = count,
        engines = super::Swarm::engines(&swarm),
        "streaming straight from the weight servers"
    );
    Ok(Attached { servers, store, swarm, layers })
}

/// Layer `l`'s mask as the coordinator sent it, refused unless it fits the layer: a mask where the plan has a
/// sparse layer (and none where it has not), as many non-zeros as the layer stores.
fn checked_mask(
    mask: Option<SparsePattern>,
    layout: &ModelLayout,
    lengths: &[LayerLengths],
    l: usize,
) -> Result<Option<SparsePattern>> {
    let shape = layout.linears.get(l).ok_or_else(|| Error::Protocol(format!("no layer {l}")))?;
    let stored = lengths.get(l).map_or(0, |n| n[0]);
    let fits = match &mask {
        Some(m) => shape.sparse && shape.tied_to.is_none() && m.nnz() == stored,
        None => !shape.sparse || shape.tied_to.is_some(),
    };
    if !fits {
        return Err(Error::Protocol(format!(
            "the coordinator's mask of layer {l} does not fit the layer the plan has ({} non-zeros stored)",
            stored
        )));
    }
    Ok(mask)
}
