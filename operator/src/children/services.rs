//! The headless Services that give each pod of a role a stable DNS name (`<pod>.<service>`).

use crds::TrainingJob;
use crds::contract::{HTTP_PORT, Role};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::metadata::{labels, meta};
use super::names;
use crate::Error;

/// A headless Service for one role: it gives each pod a stable DNS name (`<pod>.<service>`), which is how the
/// roles find each other.
pub(crate) fn headless_service(job: &TrainingJob, name: String, role: Role) -> Result<Service, Error> {
    let ports = role.grpc_port().into_iter().chain([("http", HTTP_PORT)]);
    Ok(Service {
        metadata: meta(job, name, Some(role))?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels(&job.name_any(), Some(role))),
            ports: Some(
                ports
                    .map(|(n, p)| ServicePort {
                        name: Some(n.to_string()),
                        port: i32::from(p),
                        target_port: Some(IntOrString::Int(i32::from(p))),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The four headless Services: MemoryX (its weight servers' gRPC port, by which the coordinator reaches the
/// other servers, and the HTTP port the operator polls), SwarmX, engines and input workers.
pub fn services(job: &TrainingJob) -> Result<Vec<Service>, Error> {
    let name = job.name_any();
    Ok(vec![
        headless_service(job, names::memoryx(&name), Role::Memoryx)?,
        headless_service(job, names::swarmx_service(&name), Role::Swarmx)?,
        headless_service(job, names::engine_service(&name), Role::Engine)?,
        headless_service(job, names::input_service(&name), Role::Input)?,
    ])
}
