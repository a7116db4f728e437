//! The `DevicePlugin` service the kubelet calls: the device list, allocation and the optional hooks.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, device_plugin_server::DevicePlugin,
};
use super::{DEVICE_ENV, HEALTHY, preferred};

/// The CS-2 device plugin's service: a fixed set of always-healthy devices, because the systems are simulated
/// and their number is configuration, not discovery.
#[derive(Debug, Clone)]
pub struct Cs2Plugin {
    devices: Vec<String>,
    known: BTreeSet<String>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Cs2Plugin {
    /// A plugin advertising `devices`; its `ListAndWatch` streams end when `stop` turns true, so a graceful
    /// server shutdown does not wait forever on the kubelet's open stream.
    pub fn new(devices: Vec<String>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        let known = devices.iter().cloned().collect();
        Cs2Plugin { devices, known, stop }
    }

    /// What the plugin tells the kubelet it supports: a preferred allocation (deterministic picks), no
    /// pre-start hook (there is nothing to prepare on a simulated system).
    pub fn options() -> DevicePluginOptions {
        DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
    }

    fn list(&self) -> ListAndWatchResponse {
        ListAndWatchResponse {
            devices: self
                .devices
                .iter()
                .map(|id| Device { id: id.clone(), health: HEALTHY.into(), topology: None })
                .collect(),
        }
    }

    fn check_known(&self, ids: &[String]) -> Result<(), Status> {
        match ids.iter().find(|id| !self.known.contains(*id)) {
            Some(id) => {
                Err(Status::invalid_argument(format!("unknown device {id:?}: this node has {:?}", self.devices)))
            }
            None => Ok(()),
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Cs2Plugin {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(Self::options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        // The list never changes, so the stream sends it once and then stays open (the kubelet takes a closed
        // stream for a dead plugin) until the plugin stops.
        let mut stop = self.stop.clone();
        let stream = futures::stream::once(std::future::ready(Ok(self.list())))
            .chain(futures::stream::pending())
            .take_until(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size)
                    .map_err(|_| Status::invalid_argument(format!("negative allocation size {}", r.allocation_size)))?;
                Ok(ContainerPreferredAllocationResponse {
                    device_i_ds: preferred(&r.available_device_i_ds, &r.must_include_device_i_ds, size),
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                self.check_known(&r.devices_ids)?;
                Ok(ContainerAllocateResponse {
                    envs: HashMap::from([(DEVICE_ENV.to_string(), r.devices_ids.join(","))]),
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.check_known(&request.into_inner().devices_ids)?;
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
