//! The SwarmX program: one node of the fabric, serving the `Stage` service in front of its children, and the
//! `Streamer` with which the root streams straight from the weight servers when the coordinator asks it to.

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Routes;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crds::contract::{Role, SwarmxArgs};
use errors::{Error, Result};
use wire::program::Program;

use super::relay::{Relay, connect};
use super::streamer::{RootSite, StreamerService};
use crate::protocol::stage_server;

/// Runs a SwarmX node until it is stopped.
pub fn main(args: SwarmxArgs) -> Result<()> {
    // A node relays the same layers and sums the same gradients every step: its buffers are reused, not
    // faulted in again.
    crate::process::keep_allocator_warm();
    let program = Program::start(Role::Swarmx, &args.common)?;
    let children = program.runtime.block_on(async {
        let mut children = Vec::new();
        for url in &args.children {
            children.push(connect(url, &program.job_id, program.dial(args.connect_timeout)).await?);
        }
        Ok::<_, Error>(children)
    })?;
    let relay = Relay::new(program.job_id.clone(), children, program.limits.clone());
    let mut registry = Registry::default();
    let engines = Gauge::<i64>::default();
    engines.set(i64::from(relay.engines()));
    registry.register("ws_swarmx_engines", "Engines below this SwarmX node", engines);
    registry.register("ws_swarmx_reduce_seconds", "Backward broadcast to summed gradients", relay.reduce_seconds());
    let (grpc, http) = program.listen(args.listen)?;
    tracing::info!(engines = relay.engines(), "SwarmX node ready");
    let http = program.serve_http(http, registry, axum::Router::new());
    let site = RootSite {
        spec: program.job.spec.clone(),
        job: program.job_id.clone(),
        children: args.children.clone(),
        engines: relay.engines(),
        identity: program.identity.clone(),
        connect: Duration::from_secs(args.connect_timeout),
        call: program.dial(args.connect_timeout).call,
        limits: program.limits.clone(),
    };
    let streamer = StreamerService::new(site, program.runtime.handle().clone());
    let routes = Routes::new(stage_server(Arc::new(relay))).add_service(streamer.into_server());
    let served = program.runtime.block_on(wire::grpc::serve_routes(routes, grpc, &program.identity));
    http.abort();
    served
}
