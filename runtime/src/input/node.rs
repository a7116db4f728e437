//! The `input` program: one input worker on the network. It loads the job's data (inside the data volume when
//! the job names one), and serves the `Input` service to the engines it feeds and to MemoryX. Data that cannot
//! be loaded is not a crash: the worker keeps answering with the reason, which MemoryX puts in the job's status.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crds::contract::{InputArgs, Role};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::server::InputServer;
use super::{Feed, LocalFeed, ShardBound};
use crate::error::{Error, Result};
use crate::transport::{announce_ready, bind, load_identity, load_job, serve_http, serve_input, start};

/// Runs one input worker until it is stopped.
pub fn main(args: InputArgs) -> Result<()> {
    start(&args.common);
    let (job, job_id) = load_job(&args.common)?;
    let identity = load_identity(&args.common)?;
    let spec = job.spec;
    let started = std::time::Instant::now();
    let feed = LocalFeed::load(&spec, args.data_root.as_deref());
    let mut registry = Registry::default();
    let samples: Gauge<f64, AtomicU64> = Gauge::default();
    registry.register("ws_input_train_samples", "Samples in the training split this worker serves", samples.clone());
    match &feed {
        Ok(f) => {
            let info = f.describe()?;
            samples.set(info.train_samples as f64);
            tracing::info!(
                index = args.index,
                train = info.train_samples,
                test = info.test_samples,
                seconds = started.elapsed().as_secs_f64(),
                "data loaded"
            );
        }
        Err(e) => tracing::error!(index = args.index, "the data cannot be loaded: {e}"),
    }
    let bound = ShardBound::for_spec(&spec);
    let server = Arc::new(InputServer::new(job_id, feed, crate::plan::Limits::for_spec(&spec)));
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    rt.block_on(async move {
        let grpc = bind(args.listen, Role::Input, "grpc").await?;
        let http = bind(args.common.http, Role::Input, "http").await?;
        announce_ready(Role::Input, Some(&grpc), &http)?;
        {
            let identity = identity.clone();
            tokio::spawn(async move {
                serve_http(http, Arc::new(Mutex::new(registry)), &identity, axum::Router::new()).await
            });
        }
        serve_input(server, grpc, &identity, bound.reply_bytes()).await
    })
}
