//! A local port whose connections reach a pod's port through the API server, as `kubectl port-forward` does:
//! a `127.0.0.1:0` listener, each accepted connection bridged to a new port-forward stream to the pod. The
//! traffic goes through the API server and the kubelet, so the job's NetworkPolicy (which admits only the job's
//! pods, the operator and scrapers) does not stand in the way, while the API server's RBAC
//! (`pods/portforward`) does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::net::{TcpListener, TcpStream};

use super::Error;

/// A running forward; dropping it closes the listener (connections in flight finish on their own).
pub struct Forward {
    /// Where to connect locally.
    pub addr: SocketAddr,
    /// The first bridging failure, so a client's "connection closed" can be explained.
    failure: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Forward {
    /// Listens on a free loopback port and forwards each connection to `port` of pod `pod`.
    pub async fn start(pods: Api<Pod>, pod: &str, port: u16) -> Result<Forward, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(Error::io("listening on 127.0.0.1"))?;
        let addr = listener.local_addr().map_err(Error::io("reading the local port"))?;
        let failure = Arc::new(Mutex::new(None));
        let (pod, seen) = (pod.to_string(), failure.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (pods, pod, seen) = (pods.clone(), pod.clone(), seen.clone());
                tokio::spawn(async move {
                    if let Err(e) = bridge(&pods, &pod, port, conn).await
                        && let Ok(mut f) = seen.lock()
                    {
                        f.get_or_insert(e);
                    }
                });
            }
        });
        Ok(Forward { addr, failure, task })
    }

    /// Why a bridged connection failed, if one did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies bytes both ways between `conn` and a fresh port-forward stream to `pod:port` until either side closes.
async fn bridge(pods: &Api<Pod>, pod: &str, port: u16, mut conn: TcpStream) -> Result<(), String> {
    let mut forwarder =
        pods.portforward(pod, &[port]).await.map_err(|e| format!("port-forward to pod {pod} port {port}: {e}"))?;
    let mut upstream = forwarder.take_stream(port).ok_or_else(|| format!("pod {pod}: no stream for port {port}"))?;
    let copied = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
    drop(upstream);
    let error = forwarder.take_error(port);
    let joined = forwarder.join().await;
    if let Some(e) = match error {
        Some(e) => e.await,
        None => None,
    } {
        return Err(format!("pod {pod} port {port}: {e}"));
    }
    copied.map(|_| ()).map_err(|e| format!("forwarding to pod {pod} port {port}: {e}"))?;
    joined.map_err(|e| format!("port-forward to pod {pod}: {e}"))
}
