//! The CS-2 device plugin against a fake kubelet: the test serves the kubelet's `Registration` service on a unix
//! socket in a temporary directory, runs the plugin against it, checks what it registered, then dials the
//! plugin's own socket as the kubelet would and checks the device list and allocation. It also restarts the
//! "kubelet" (a new socket, the plugin's socket wiped) and sees the plugin register again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::path::{Path, PathBuf};
use std::time::Duration;

use operator::deviceplugin::api::registration_server::{Registration, RegistrationServer};
use operator::deviceplugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty, PreStartContainerRequest,
    PreferredAllocationRequest, RegisterRequest, device_plugin_client::DevicePluginClient,
};
use operator::deviceplugin::{self, Config};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// The fake kubelet's registration service: hands each request to the test.
struct FakeKubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ws-dp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Serves the fake kubelet on `socket` until the returned sender is dropped or fired.
fn serve_kubelet(socket: &Path) -> (mpsc::UnboundedReceiver<RegisterRequest>, tokio::sync::oneshot::Sender<()>) {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet(tx)))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = stop_rx.await;
            }),
    );
    (rx, stop_tx)
}

async fn next_registration(rx: &mut mpsc::UnboundedReceiver<RegisterRequest>) -> RegisterRequest {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("no registration in 20 s")
        .expect("kubelet gone")
}

#[tokio::test]
async fn registers_lists_allocates_and_reregisters_after_a_kubelet_restart() {
    let dir = temp_dir("main");
    let kubelet_socket = dir.join("kubelet.sock");
    let (mut registrations, stop_kubelet) = serve_kubelet(&kubelet_socket);
    let config = Config {
        devices: 3,
        plugin_dir: dir.clone(),
        kubelet_socket: kubelet_socket.clone(),
        poll: Duration::from_millis(50),
        ..Config::new(3)
    };
    let (stop_plugin, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(deviceplugin::run(config, async {
        let _ = stopped.await;
    }));

    let reg = next_registration(&mut registrations).await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "weightstream.dev/cs2");
    assert_eq!(reg.endpoint, "weightstream-cs2.sock");
    let options = reg.options.expect("options are sent");
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);

    // Dial back as the kubelet does: the endpoint is relative to the plugin directory.
    let plugin_socket = dir.join(&reg.endpoint);
    let mut client = DevicePluginClient::new(deviceplugin::connect_unix(&plugin_socket).await.unwrap());
    let opts = client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(opts.get_preferred_allocation_available);

    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("a device list");
    let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["cs2-0", "cs2-1", "cs2-2"]);
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    // The stream stays open: no second message while nothing changes.
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.message()).await.is_err());

    let alloc = client
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest { devices_ids: vec!["cs2-1".into()] },
                ContainerAllocateRequest { devices_ids: vec!["cs2-0".into(), "cs2-2".into()] },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alloc.container_responses.len(), 2);
    assert_eq!(alloc.container_responses[0].envs["WS_CS2_DEVICE"], "cs2-1");
    assert_eq!(alloc.container_responses[1].envs["WS_CS2_DEVICE"], "cs2-0,cs2-2");

    let refused = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["gpu-9".into()] }],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("unknown device \"gpu-9\""), "{}", refused.message());

    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["cs2-2".into(), "cs2-1".into(), "cs2-0".into()],
                must_include_device_i_ds: vec!["cs2-2".into()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds, ["cs2-2", "cs2-0"]);

    client.pre_start_container(PreStartContainerRequest { devices_ids: vec!["cs2-0".into()] }).await.unwrap();

    // A kubelet restart: it wipes the plugin sockets and serves a new kubelet.sock. The plugin registers again
    // and serves a fresh socket, and the old ListAndWatch stream ends.
    let _ = stop_kubelet.send(());
    std::fs::remove_file(&plugin_socket).unwrap();
    let (mut registrations, stop_kubelet) = serve_kubelet(&kubelet_socket);
    let again = next_registration(&mut registrations).await;
    assert_eq!(again.endpoint, "weightstream-cs2.sock");
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("old stream ends");
    assert!(!matches!(ended, Ok(Some(_))), "the old stream sends nothing more");
    let mut client = DevicePluginClient::new(deviceplugin::connect_unix(&plugin_socket).await.unwrap());
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().expect("a device list").devices.len(), 3);

    // Shutdown removes the socket.
    let _ = stop_plugin.send(());
    tokio::time::timeout(Duration::from_secs(10), plugin).await.expect("plugin stops").unwrap().unwrap();
    assert!(!plugin_socket.exists(), "the plugin removes its socket on shutdown");
    let _ = stop_kubelet.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn waits_for_a_kubelet_that_is_not_up_yet() {
    let dir = temp_dir("late");
    let kubelet_socket = dir.join("kubelet.sock");
    let config = Config {
        plugin_dir: dir.clone(),
        kubelet_socket: kubelet_socket.clone(),
        poll: Duration::from_millis(50),
        ..Config::new(1)
    };
    let (stop_plugin, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(deviceplugin::run(config, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!plugin.is_finished(), "no kubelet yet is no reason to stop");
    let (mut registrations, stop_kubelet) = serve_kubelet(&kubelet_socket);
    assert_eq!(next_registration(&mut registrations).await.resource_name, "weightstream.dev/cs2");
    let _ = stop_plugin.send(());
    tokio::time::timeout(Duration::from_secs(10), plugin).await.expect("plugin stops").unwrap().unwrap();
    let _ = stop_kubelet.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_bad_device_count_is_one_clear_error() {
    let err = deviceplugin::run(Config::new(0), std::future::pending()).await.unwrap_err();
    assert_eq!(err.to_string(), "device plugin configuration: devices must be in 1..=1024, got 0");
}
