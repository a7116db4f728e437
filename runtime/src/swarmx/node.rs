//! The SwarmX program: one node of the fabric, serving the `Stage` service in front of its children.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::relay::{connect, Relay};
use crate::error::{Error, Result};
use crate::transport::{bind, serve_http, serve_stage, CommonArgs};

/// Flags of the `swarmx` program.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Address of the gRPC service (port 0 picks one).
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The children, in engine order: engines or further SwarmX nodes (comma-separated URLs).
    #[arg(long, env = "WS_CHILDREN", value_delimiter = ',', required = true)]
    pub children: Vec<String>,
    /// Seconds to wait for every child to answer.
    #[arg(long, env = "WS_CONNECT_TIMEOUT", default_value_t = 120)]
    pub connect_timeout: u64,
}

/// Runs a SwarmX node until it is stopped.
pub fn main(args: Args) -> Result<()> {
    args.common.start();
    let (_, job) = args.common.load()?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    rt.block_on(async move {
        let grpc = bind(args.listen, "swarmx", "grpc").await?;
        let mut children = Vec::new();
        for url in &args.children {
            children.push(connect(url, &job, Duration::from_secs(args.connect_timeout)).await?);
        }
        let relay = Relay::new(job, children);
        let mut registry = Registry::default();
        let engines = Gauge::<i64>::default();
        engines.set(i64::from(relay.engines()));
        registry.register("ws_swarmx_engines", "Engines below this SwarmX node", engines);
        registry.register("ws_swarmx_reduce_seconds", "Backward broadcast to summed gradients", relay.reduce_seconds());
        let http = bind(args.common.http, "swarmx", "http").await?;
        tracing::info!(engines = relay.engines(), "SwarmX node ready");
        let registry = Arc::new(Mutex::new(registry));
        let http_task = tokio::spawn(async move {
            let app = axum::Router::new();
            let _ = serve_http(http, registry, app).await;
        });
        let served = serve_stage(Arc::new(relay), grpc).await;
        http_task.abort();
        served
    })
}

