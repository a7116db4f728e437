//! The engine program: one simulated CS-2 on the network. It loads the job's data itself (as the seeds'
//! input servers feed each engine directly), runs the runtime's engine program on a [`crate::SimWse`], and
//! serves the `Stage` service to its SwarmX node.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use runtime::data::mnist::{self, Split};
use runtime::engine::server::EngineServer;
use runtime::model::ModelLayout;
use runtime::transport::{bind, serve_http, serve_stage, CommonArgs};
use runtime::{Error, Result};

/// Flags of the `sim-wse` program.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Address of the gRPC service (port 0 picks one).
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// This engine's place among the job's engines (its CS-2), used in names and errors.
    #[arg(long, env = "WS_INDEX", default_value_t = 0)]
    pub index: u32,
}

/// Runs one engine until it is stopped.
pub fn main(args: Args) -> Result<()> {
    args.common.start();
    let (job, job_id) = args.common.load()?;
    let spec = job.spec;
    let data = Path::new(&spec.data.path);
    let train = Arc::new(mnist::load(data, Split::Train)?);
    let test = Arc::new(mnist::load(data, Split::Test)?);
    let layout = ModelLayout::from_spec(&spec.model);
    let layers = layout.linears.len();
    let engine = crate::engine(format!("engine-{}", args.index), layout, &spec.engine);
    let server = EngineServer::new(job_id, layers, Box::new(engine), train, test);
    let rt = tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))?;
    rt.block_on(async move {
        let grpc = bind(args.listen, "engine", "grpc").await?;
        let http = bind(args.common.http, "engine", "http").await?;
        let mut registry = Registry::default();
        let sram = Gauge::<i64>::default();
        sram.set(crate::preset::sram_bytes(&spec.engine).min(i64::MAX as u64) as i64);
        registry.register("ws_engine_sram_bytes", "SRAM budget of this engine", sram);
        tokio::spawn(serve_http(http, Arc::new(Mutex::new(registry)), axum::Router::new()));
        tracing::info!(index = args.index, "engine ready");
        serve_stage(server, grpc).await
    })
}
