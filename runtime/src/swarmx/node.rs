//! The SwarmX program: one node of the fabric, serving the `Stage` service in front of its children.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::relay::{connect, Relay};
use crate::error::{Error, Result};
use crds::contract::{Role, SwarmxArgs};

use crate::transport::{announce_ready, bind, dial, load_identity, load_job, serve_http, serve_stage, start};

/// Runs a SwarmX node until it is stopped.
pub fn main(args: SwarmxArgs) -> Result<()> {
    start(&args.common);
    let (manifest, job) = load_job(&args.common)?;
    let limits = crate::plan::Limits::for_spec(&manifest.spec);
    let identity = load_identity(&args.common)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    rt.block_on(async move {
        let grpc = bind(args.listen, Role::Swarmx, "grpc").await?;
        let mut children = Vec::new();
        for url in &args.children {
            children.push(connect(url, &job, dial(&args.common, &identity, args.connect_timeout, &limits)).await?);
        }
        let relay = Relay::new(job, children, limits);
        let mut registry = Registry::default();
        let engines = Gauge::<i64>::default();
        engines.set(i64::from(relay.engines()));
        registry.register("ws_swarmx_engines", "Engines below this SwarmX node", engines);
        registry.register("ws_swarmx_reduce_seconds", "Backward broadcast to summed gradients", relay.reduce_seconds());
        let http = bind(args.common.http, Role::Swarmx, "http").await?;
        announce_ready(Role::Swarmx, Some(&grpc), &http)?;
        tracing::info!(engines = relay.engines(), "SwarmX node ready");
        let registry = Arc::new(Mutex::new(registry));
        let http_task = {
            let identity = identity.clone();
            tokio::spawn(async move { serve_http(http, registry, &identity, axum::Router::new()).await })
        };
        let served = serve_stage(Arc::new(relay), grpc, &identity).await;
        http_task.abort();
        served
    })
}

