//! The `input` program: one input worker on the network. It loads the job's data (inside the data volume when
//! the job names one), and serves the `Input` service to the engines it feeds and to MemoryX. Data that cannot
//! be loaded is not a crash: the worker keeps answering with the reason, which MemoryX puts in the job's status.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crds::contract::{InputArgs, Role};
use errors::Result;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use wire::program::Program;

use super::server::{InputServer, input_service};
use super::{Feed, LocalFeed, ShardBound};

/// Runs one input worker until it is stopped.
pub fn main(args: InputArgs) -> Result<()> {
    let program = Program::start(Role::Input, &args.common)?;
    let spec = &program.job.spec;
    let started = std::time::Instant::now();
    let feed = LocalFeed::load(spec, args.data_root.as_deref());
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
    let bound = ShardBound::for_spec(spec);
    let server = Arc::new(InputServer::new(program.job_id.clone(), feed, program.limits.clone()));
    let (grpc, http) = program.listen(args.listen)?;
    program.serve_http(http, registry, axum::Router::new());
    program.runtime.block_on(wire::grpc::serve(input_service(server, bound.reply_bytes()), grpc, &program.identity))
}
