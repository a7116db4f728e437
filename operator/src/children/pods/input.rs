//! The input workers, `spec.data.workers` per CS-2, which read the data volume (read-only).

use crds::TrainingJob;
use crds::contract::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use plan::appliance::Plan;
use plan::wiring::Wiring;

use super::pod;
use crate::Error;
use crate::children::container::container;
use crate::children::names;
use crate::children::pod_security::restricted_pod;
use crate::children::settings::Settings;
use crate::children::site::ClusterSite;
use crate::children::volumes::volumes_of;

/// The input workers, `spec.data.workers` per CS-2, which read the data volume (read-only).
pub(crate) fn input_pods(job: &TrainingJob, settings: &Settings, plan: &Plan, config: &str) -> Result<Vec<Pod>, Error> {
    let name = job.name_any();
    (0..plan.input_workers)
        .map(|i| {
            let (volumes, mounts) = volumes_of(job, plan, Role::Input);
            let c = container(
                job,
                settings,
                &Wiring::of(plan).input(&ClusterSite::of(job), i),
                job.spec.resources.input.clone(),
                mounts,
            );
            let spec = restricted_pod(vec![c], volumes);
            pod(job, names::input(&name, i), Role::Input, names::input_service(&name), spec, config)
        })
        .collect()
}
