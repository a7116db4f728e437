//! CS-2 systems as a node resource: a kubelet device plugin (API `v1beta1`) that advertises a fixed number of
//! `weightstream.dev/cs2` devices on its node.
//!
//! Why: the operator's gang admission counts the nodes' allocatable `weightstream.dev/cs2`, and engine pods
//! request one each, so the scheduler places an engine only where a CS-2 is free — the same path a real
//! accelerator takes into Kubernetes. The systems are simulated, so the count comes from configuration (a Helm
//! value) rather than from hardware discovery, and every device is always healthy.
//!
//! The protocol: the plugin serves the `DevicePlugin` gRPC service on a unix socket in the kubelet's
//! device-plugin directory, then calls `Registration.Register` on the kubelet's own socket there. The kubelet
//! dials back, keeps a `ListAndWatch` stream open for the device list and calls `Allocate` when a container is
//! given devices. A restarted kubelet wipes the directory and makes a new `kubelet.sock`; [`run`] notices and
//! serves and registers again.

mod server;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use server::Cs2Plugin;

/// The generated messages and services of the kubelet's device-plugin API (package `v1beta1`).
#[allow(missing_docs, clippy::all)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The API version this plugin speaks, as the kubelet expects it in a `RegisterRequest`.
pub const API_VERSION: &str = "v1beta1";
/// Where the kubelet looks for plugin sockets and serves its own.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket's file name inside the plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The plugin's socket's file name inside the plugin directory.
pub const DEFAULT_SOCKET_NAME: &str = "weightstream-cs2.sock";
/// The environment variable through which an engine container learns which CS-2s it was given.
pub const DEVICE_ENV: &str = "WS_CS2_DEVICE";
/// The health the kubelet counts as allocatable.
pub const HEALTHY: &str = "Healthy";
/// The most devices one node may advertise: a guard against a typo turning into a huge allocatable count.
pub const MAX_DEVICES: u32 = 1024;

/// Why the device plugin could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is unusable (a zero or absurd device count, a bad path).
    #[error("device plugin configuration: {0}")]
    Config(String),
    /// A socket could not be created, removed or inspected.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The kubelet could not be dialled.
    #[error("cannot reach the kubelet at {path}: {source}")]
    Connect {
        /// The kubelet's socket.
        path: PathBuf,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// The kubelet refused the registration.
    #[error("the kubelet refused the registration: {0}")]
    Register(#[from] tonic::Status),
}

/// Everything the plugin needs to know: what to advertise, and where the kubelet is.
#[derive(Debug, Clone)]
pub struct Config {
    /// The extended resource name (`weightstream.dev/cs2`).
    pub resource: String,
    /// How many CS-2 devices this node advertises.
    pub devices: u32,
    /// The kubelet's device-plugin directory; the plugin's socket goes here too.
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket (normally `<plugin_dir>/kubelet.sock`).
    pub kubelet_socket: PathBuf,
    /// The plugin's socket file name inside `plugin_dir`.
    pub socket_name: String,
    /// How often the sockets are checked for a kubelet restart, and registration retried.
    pub poll: Duration,
}

impl Config {
    /// The defaults for a node: `devices` CS-2s, the kubelet's standard directory.
    pub fn new(devices: u32) -> Self {
        let plugin_dir = PathBuf::from(DEFAULT_PLUGIN_DIR);
        Config {
            resource: crate::children::pods::engine::CS2_RESOURCE.into(),
            devices,
            kubelet_socket: plugin_dir.join(KUBELET_SOCKET),
            plugin_dir,
            socket_name: DEFAULT_SOCKET_NAME.into(),
            poll: Duration::from_secs(1),
        }
    }

    /// Refuses a configuration the kubelet would reject or that makes no sense, with the reason.
    pub fn validate(&self) -> Result<(), Error> {
        if self.devices == 0 || self.devices > MAX_DEVICES {
            return Err(Error::Config(format!("devices must be in 1..={MAX_DEVICES}, got {}", self.devices)));
        }
        let valid_name = self.resource.split_once('/').is_some_and(|(domain, name)| {
            !domain.is_empty() && !name.is_empty() && domain.contains('.') && !name.contains('/')
        });
        if !valid_name {
            return Err(Error::Config(format!(
                "resource must be a domain-qualified name like weightstream.dev/cs2, got {:?}",
                self.resource
            )));
        }
        if self.socket_name.is_empty() || self.socket_name.contains('/') || self.socket_name == KUBELET_SOCKET {
            return Err(Error::Config(format!(
                "socket name must be a plain file name other than {KUBELET_SOCKET}, got {:?}",
                self.socket_name
            )));
        }
        Ok(())
    }

    /// The plugin's own socket.
    pub fn socket_path(&self) -> PathBuf {
        self.plugin_dir.join(&self.socket_name)
    }
}

/// The device IDs a node with `n` CS-2s advertises: `cs2-0` … `cs2-<n-1>`, stable across restarts so the
/// kubelet's checkpoint of which pod holds which device stays valid.
pub fn device_ids(n: u32) -> Vec<String> {
    (0..n).map(|i| format!("cs2-{i}")).collect()
}

/// Picks `size` devices from `available`, those in `must_include` first, then the rest in ID order, so the
/// choice is deterministic. Unknown or repeated IDs are ignored.
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    let available: BTreeSet<&String> = available.iter().collect();
    let mut chosen: Vec<String> = Vec::with_capacity(size);
    let ordered = must_include.iter().filter(|d| available.contains(d)).chain(available.iter().copied());
    for d in ordered {
        if chosen.len() == size {
            break;
        }
        if !chosen.contains(d) {
            chosen.push(d.clone());
        }
    }
    chosen
}

/// What identifies a socket file: a recreated `kubelet.sock` has a new inode even at the same path.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Removes a stale socket from an earlier run; an absent file is fine.
fn remove_socket(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { what: "cannot remove the stale socket", path: path.into(), source }),
    }
}

/// Dials a gRPC server on a unix socket. The URI is a placeholder: the connector ignores it.
pub async fn connect_unix(path: &Path) -> Result<tonic::transport::Channel, Error> {
    let socket = path.to_path_buf();
    let connector = tower::service_fn(move |_: http::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
        .map_err(|source| Error::Connect { path: path.into(), source })
}

/// Announces the plugin to the kubelet.
pub async fn register(config: &Config) -> Result<(), Error> {
    let channel = connect_unix(&config.kubelet_socket).await?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    client
        .register(api::RegisterRequest {
            version: API_VERSION.into(),
            endpoint: config.socket_name.clone(),
            resource_name: config.resource.clone(),
            options: Some(Cs2Plugin::options()),
        })
        .await?;
    Ok(())
}

/// Serves the plugin and keeps it registered until `shutdown` resolves: serves on the plugin socket, registers
/// (retrying every `poll` while the kubelet is not up), then watches both sockets; when the kubelet restarts
/// (its socket is recreated, or ours was removed) it starts over. Returns after removing its socket.
pub async fn run(config: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    config.validate()?;
    tokio::pin!(shutdown);
    let socket = config.socket_path();
    loop {
        remove_socket(&socket)?;
        let listener = tokio::net::UnixListener::bind(&socket).map_err(|source| Error::Io {
            what: "cannot listen on",
            path: socket.clone(),
            source,
        })?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let plugin = Cs2Plugin::new(device_ids(config.devices), stop_rx.clone());
        let mut stop_server = stop_rx;
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(api::device_plugin_server::DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async move {
                    let _ = stop_server.wait_for(|stop| *stop).await;
                }),
        );
        tracing::info!(socket = %socket.display(), devices = config.devices, resource = %config.resource, "serving");
        let outcome = keep_registered(&config, &socket, &mut shutdown).await;
        let _ = stop_tx.send(true);
        // Graceful: open streams end with the stop signal; a peer that keeps its connection anyway is cut off.
        let abort = server.abort_handle();
        match tokio::time::timeout(Duration::from_secs(5), server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the gRPC server stopped with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the gRPC server task failed"),
            Err(_) => {
                tracing::warn!("the gRPC server did not stop within 5 s; closing it");
                abort.abort();
            }
        }
        match outcome {
            Ok(Next::Stop) => {
                remove_socket(&socket)?;
                tracing::info!("stopped");
                return Ok(());
            }
            Ok(Next::Restart) => tracing::info!("the kubelet restarted: serving and registering again"),
            Err(e) => {
                let _ = remove_socket(&socket);
                return Err(e);
            }
        }
    }
}

/// What [`keep_registered`] asks of [`run`].
enum Next {
    /// Shut down.
    Stop,
    /// The kubelet restarted: serve and register anew.
    Restart,
}

/// Registers, then waits for a kubelet restart or the shutdown signal.
async fn keep_registered<F>(config: &Config, socket: &Path, shutdown: &mut std::pin::Pin<&mut F>) -> Result<Next, Error>
where
    F: std::future::Future<Output = ()>,
{
    let kubelet = loop {
        let before = identity(&config.kubelet_socket);
        if before.is_some() {
            match register(config).await {
                Ok(()) => {
                    tracing::info!(kubelet = %config.kubelet_socket.display(), "registered with the kubelet");
                    break before;
                }
                // A kubelet that answers but refuses is misconfigured for us: retrying cannot help.
                Err(Error::Register(status)) => return Err(Error::Register(status)),
                Err(e) => tracing::warn!(error = %e, "registration failed; retrying"),
            }
        } else {
            tracing::info!(kubelet = %config.kubelet_socket.display(), "waiting for the kubelet's socket");
        }
        tokio::select! {
            _ = shutdown.as_mut() => return Ok(Next::Stop),
            _ = tokio::time::sleep(config.poll) => {}
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.as_mut() => return Ok(Next::Stop),
            _ = tokio::time::sleep(config.poll) => {}
        }
        if identity(socket).is_none() || identity(&config.kubelet_socket) != kubelet {
            return Ok(Next::Restart);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_are_stable_and_numbered_from_zero() {
        assert_eq!(device_ids(3), vec!["cs2-0", "cs2-1", "cs2-2"]);
    }

    #[test]
    fn preferred_takes_required_devices_first_then_in_order() {
        let avail = device_ids(4);
        assert_eq!(preferred(&avail, &["cs2-2".into()], 2), vec!["cs2-2", "cs2-0"]);
        assert_eq!(preferred(&avail, &[], 3), vec!["cs2-0", "cs2-1", "cs2-2"]);
        assert_eq!(preferred(&avail, &["nope".into()], 1), vec!["cs2-0"]);
        assert_eq!(preferred(&avail[..1], &[], 5), vec!["cs2-0"]);
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        assert!(Config::new(2).validate().is_ok());
        let e = Config::new(0).validate().unwrap_err().to_string();
        assert!(e.contains("devices must be in 1..=1024, got 0"), "{e}");
        let mut c = Config::new(1);
        c.resource = "cs2".into();
        assert!(c.validate().unwrap_err().to_string().contains("domain-qualified"));
        let mut c = Config::new(1);
        c.socket_name = "kubelet.sock".into();
        assert!(c.validate().unwrap_err().to_string().contains("plain file name"));
    }
}
