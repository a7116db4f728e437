//! The operator binary: JSON logs, `/healthz` `/readyz` `/metrics`, leader election on a Lease, then the
//! controller until the lease is lost or the process is told to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use operator::Error;
use operator::config::{Config, Preemption};
use operator::coordinator::HttpCoordinator;
use operator::leader::Election;
use operator::metrics::Shared;

/// Runs the weightstream operator.
#[derive(Parser, Debug)]
#[command(name = "weightstream-operator", version, about = "Assembles weight-streaming appliances for TrainingJobs")]
struct Args {
    /// Watch only this namespace; all namespaces when unset.
    #[arg(long, env = "WS_NAMESPACE")]
    namespace: Option<String>,
    /// CS-2 systems in the pool when no node advertises weightstream.dev/cs2.
    #[arg(long, env = "WS_CS2_POOL")]
    cs2_pool: Option<u32>,
    /// The data-plane image for jobs that name none.
    #[arg(long, env = "WS_RUNTIME_IMAGE", default_value = operator::DEFAULT_RUNTIME_IMAGE)]
    runtime_image: String,
    /// Children per SwarmX node.
    #[arg(long, env = "WS_SWARMX_FAN_OUT", default_value_t = crds::contract::DEFAULT_FAN_OUT)]
    swarmx_fan_out: u32,
    /// Whether a waiting job may take the CS-2s of running jobs of a lower PriorityClass (they checkpoint first).
    #[arg(long, env = "WS_PREEMPTION", value_enum, default_value_t = Preemption::Never)]
    preemption: Preemption,
    /// Seconds between polls of a live job's MemoryX.
    #[arg(long, env = "WS_POLL_SECONDS", default_value_t = 3)]
    poll_seconds: u64,
    /// Reach each job's MemoryX at this URL instead of its Service (`{job}` and `{namespace}` are filled in),
    /// e.g. when the operator runs outside the cluster.
    #[arg(long, env = "WS_MEMORYX_URL")]
    memoryx_url: Option<String>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "WS_HTTP", default_value = "0.0.0.0:8080")]
    http: SocketAddr,
    /// Skip leader election (a single replica, or local development).
    #[arg(long, env = "WS_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// The operator's own namespace (the chart sets it from the pod's): the leader-election Lease lives there,
    /// and every job's NetworkPolicy admits the operator's pods from it.
    #[arg(long, env = "POD_NAMESPACE", default_value = operator::DEFAULT_NAMESPACE)]
    lease_namespace: String,
    /// Labels of the operator's own pods, `key=value,key=value` (the chart renders its pods' selector labels):
    /// every job's NetworkPolicy admits pods with these labels in the operator's namespace.
    #[arg(long, env = "WS_OPERATOR_POD_LABELS", default_value = "app.kubernetes.io/component=operator")]
    operator_pod_labels: String,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[tokio::main]
async fn main() {
    operator::init_logging();
    if let Err(e) = run(Args::parse()).await {
        tracing::error!(error = %e, "operator stopped");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Error> {
    if args.swarmx_fan_out < 2 {
        return Err(Error::Config(format!("--swarmx-fan-out must be at least 2, got {}", args.swarmx_fan_out)));
    }
    let client = kube::Client::try_default().await?;
    let version = client.apiserver_version().await?;
    tracing::info!(server = %version.git_version, "reached the API server");
    let shared = Shared::default();
    // Ready means "reached the API server and able to lead": a standby replica is ready too, so a rolling
    // update of a two-replica Deployment never waits on the replica that does not hold the lease.
    shared.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let listener = tokio::net::TcpListener::bind(args.http)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", args.http)))?;
    let router = operator::metrics::router(shared.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    let config = Config {
        namespace: args.namespace,
        pool: args.cs2_pool,
        default_image: args.runtime_image,
        fan_out: args.swarmx_fan_out,
        poll: Duration::from_secs(args.poll_seconds.max(1)),
        preemption: args.preemption,
        operator: operator::children::settings::OperatorPeer {
            namespace: args.lease_namespace.clone(),
            labels: operator::children::settings::OperatorPeer::parse_labels(&args.operator_pod_labels)?,
        },
    };
    let coordinator = match args.memoryx_url {
        Some(t) => Arc::new(HttpCoordinator::new(client.clone()).with_url_template(t)),
        None => Arc::new(HttpCoordinator::new(client.clone())),
    };
    // Kubernetes stops a pod with SIGTERM; a terminal sends SIGINT. Either ends the operator cleanly.
    let shutdown = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    if args.no_leader_election {
        return operator::reconcile::run(client, config, coordinator, shared, shutdown).await;
    }
    let identity = match args.identity {
        Some(i) => i,
        None => std::env::var("HOSTNAME").map_err(|_| Error::Config("set POD_NAME or --identity".into()))?,
    };
    let election = Election {
        namespace: args.lease_namespace,
        name: "weightstream-operator".into(),
        identity,
        lease_duration: Duration::from_secs(15),
    };
    tracing::info!(identity = %election.identity, "waiting for the leader lease");
    election.acquire(&client).await?;
    tracing::info!("leading");
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<Error>();
    let holder = {
        let (election, client) = (election.clone(), client.clone());
        tokio::spawn(async move {
            let _ = lost_tx.send(election.hold(&client).await);
        })
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(operator::reconcile::run(client, config, coordinator, shared, async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop_rx => {}
        }
    }));
    tokio::pin!(lost_rx);
    let outcome = tokio::select! {
        lost = &mut lost_rx => Err(lost.unwrap_or_else(|_| Error::Leadership("the lease holder stopped".into()))),
        done = controller => done.map_err(|e| Error::Config(format!("controller task: {e}")))?,
    };
    let _ = stop_tx.send(());
    holder.abort();
    outcome
}
