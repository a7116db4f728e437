//! The CS-2 device plugin binary: advertises `--devices` `weightstream.dev/cs2` devices to this node's kubelet
//! and keeps them registered across kubelet restarts. Runs as the chart's DaemonSet.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use operator::deviceplugin::{self, Config};

/// Advertises simulated CS-2 systems to the kubelet as an extended resource.
#[derive(Parser, Debug)]
#[command(name = "weightstream-device-plugin", version, about = "Advertises CS-2 systems to the kubelet")]
struct Args {
    /// CS-2 systems on this node.
    #[arg(long, env = "WS_CS2_DEVICES", default_value_t = 1)]
    devices: u32,
    /// The extended resource to advertise.
    #[arg(long, env = "WS_CS2_RESOURCE", default_value = operator::children::pods::engine::CS2_RESOURCE)]
    resource: String,
    /// The kubelet's device-plugin directory, where this plugin's socket goes.
    #[arg(long, env = "WS_DEVICE_PLUGIN_DIR", default_value = deviceplugin::DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// The kubelet's registration socket; `<plugin-dir>/kubelet.sock` when unset.
    #[arg(long, env = "WS_KUBELET_SOCKET")]
    kubelet_socket: Option<PathBuf>,
    /// This plugin's socket file name inside the plugin directory.
    #[arg(long, default_value = deviceplugin::DEFAULT_SOCKET_NAME)]
    socket_name: String,
    /// Milliseconds between checks for a restarted kubelet.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
}

#[tokio::main]
async fn main() {
    operator::init_logging();
    let args = Args::parse();
    let config = Config {
        resource: args.resource,
        devices: args.devices,
        kubelet_socket: args.kubelet_socket.unwrap_or_else(|| args.plugin_dir.join(deviceplugin::KUBELET_SOCKET)),
        plugin_dir: args.plugin_dir,
        socket_name: args.socket_name,
        poll: Duration::from_millis(args.poll_ms.max(10)),
    };
    if let Err(e) = deviceplugin::run(config, stop_signal()).await {
        tracing::error!(error = %e, "device plugin stopped");
        std::process::exit(1);
    }
}

/// Resolves on SIGTERM (what the kubelet sends a pod) or SIGINT. As PID 1 a process that installs no handler
/// would ignore SIGTERM and be killed only after the grace period.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
