//! `checkpoint-server`: a job's checkpoints served read-only from its volume, with nothing else of MemoryX.
//! `wsctl checkpoint list|pull` of a deleted job (whose checkpoint claim was retained) starts it in a
//! short-lived pod that mounts the claim, and fetches the files through a port-forward, presenting a certificate
//! of the identity it issued for that pod alone. The routes are MemoryX's own
//! ([`runtime::memoryx::checkpoint_routes`], and the run's records of [`runtime::coordinator::run_routes`] from
//! the volume's `run` folder): the same listing, the same names, the same bounded streaming.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use axum::Router;
use axum::routing::get;
use clap::Parser;

/// Serves `GET /checkpoints`, `GET /checkpoints/{file}`, `GET /run` and `GET /run/{file}` from a folder over
/// HTTPS, to holders of a certificate of the identity's CA only, and `/healthz` to anyone (the kubelet's probe).
#[derive(Parser)]
#[command(name = "checkpoint-server", version)]
struct Args {
    /// The folder of checkpoints (a job's volume, mounted read-only).
    #[arg(long)]
    dir: PathBuf,
    /// A folder with the identity to serve with and to require of clients: ca.crt, tls.crt, tls.key.
    #[arg(long)]
    identity: PathBuf,
    /// Where to listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checkpoint-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &Args) -> Result<(), String> {
    let identity = wire::identity::Identity::load(&args.identity).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let open = Router::new().route("/healthz", get(|| async { "ok" }));
        let protected = runtime::memoryx::checkpoint_routes::routes(Some(args.dir.clone()))
            .merge(runtime::coordinator::run_routes::routes(Some(args.dir.join(crds::contract::RUN_FOLDER))));
        wire::https::serve(listener, &identity, open, protected).await.map_err(|e| e.to_string())
    })
}
