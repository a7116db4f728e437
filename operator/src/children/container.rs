//! A role's container: its image, argv rendered from the contract's type, ports, probes, default memory request
//! and locked-down security context.

use std::collections::BTreeMap;

use crds::contract::{HTTP_PORT, RoleArgs};
use crds::{PullPolicy, TrainingJob};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, Probe, ResourceRequirements, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config_map::CONFIG_DIR;
use super::identity::IDENTITY_DIR;
use super::pods::STATELESS_GRACE_SECONDS;
use super::settings::Settings;

/// The data-plane image: the job's, else the operator's default.
pub(crate) fn image(job: &TrainingJob, settings: &Settings) -> String {
    job.spec.images.runtime.clone().unwrap_or_else(|| settings.default_image.clone())
}

/// The job's image pull policy as Kubernetes spells it (`IfNotPresent` by default).
pub(crate) fn pull_policy(job: &TrainingJob) -> String {
    match job.spec.images.pull_policy.unwrap_or(PullPolicy::IfNotPresent) {
        PullPolicy::Always => "Always",
        PullPolicy::IfNotPresent => "IfNotPresent",
        PullPolicy::Never => "Never",
    }
    .into()
}

/// The role's container running `args`, rendered from the contract's type.
pub(crate) fn container<A: RoleArgs>(
    job: &TrainingJob,
    settings: &Settings,
    args: &A,
    resources: Option<ResourceRequirements>,
    extra_mounts: Vec<VolumeMount>,
) -> Container {
    let role = A::ROLE;
    let mut mounts = vec![
        VolumeMount {
            name: "config".into(),
            mount_path: CONFIG_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: "identity".into(),
            mount_path: IDENTITY_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
    ];
    mounts.extend(extra_mounts);
    let port = |(n, p): (&str, u16)| ContainerPort {
        name: Some(n.into()),
        container_port: i32::from(p),
        ..Default::default()
    };
    Container {
        name: role.as_str().into(),
        image: Some(image(job, settings)),
        image_pull_policy: Some(pull_policy(job)),
        command: Some(vec![role.binary().into()]),
        args: Some(args.argv()),
        ports: Some(role.grpc_port().into_iter().chain([("http", HTTP_PORT)]).map(port).collect()),
        readiness_probe: Some(Probe { http_get: Some(healthz()), period_seconds: Some(2), ..Default::default() }),
        // Liveness is judged only once the program serves its health (up to 5 minutes for a slow start: a
        // busy node, a large pretrained model read before training).
        startup_probe: Some(Probe {
            http_get: Some(healthz()),
            period_seconds: Some(2),
            failure_threshold: Some(150),
            ..Default::default()
        }),
        // A frozen process (SIGSTOP, a hung host) stops answering while its pod still runs: the kubelet kills
        // it after three missed checks (about 15 s), without waiting out a grace period it cannot use. An engine,
        // SwarmX node or input worker then fails and the operator replaces it, counted against restartLimit;
        // a weight server restarts in place, counted the same way. Checks are cheap and answered off the
        // compute threads, so a busy component is never taken for a frozen one.
        liveness_probe: Some(Probe {
            http_get: Some(healthz()),
            period_seconds: Some(5),
            timeout_seconds: Some(5),
            failure_threshold: Some(3),
            termination_grace_period_seconds: Some(STATELESS_GRACE_SECONDS),
            ..Default::default()
        }),
        resources,
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every role's health endpoint, for the kubelet's probes: over TLS like every endpoint; the kubelet verifies
/// no certificate and `/healthz` asks for none.
pub(crate) fn healthz() -> HTTPGetAction {
    HTTPGetAction {
        path: Some("/healthz".into()),
        port: IntOrString::Int(i32::from(HTTP_PORT)),
        scheme: Some("HTTPS".into()),
        ..Default::default()
    }
}

/// What the scheduler reserves for a role by default: the memory the plan says it holds, plus room for the
/// program, its data and its buffers. Only a request: a limit guessed wrong would kill a healthy job, so limits
/// stay with `spec.resources`, which replaces this default whole.
pub(crate) fn memory_request(plan_bytes: u64) -> Option<ResourceRequirements> {
    const PROGRAM: u64 = 128 << 20;
    let mib = (plan_bytes.saturating_add(PROGRAM)).div_ceil(1 << 20);
    Some(ResourceRequirements {
        requests: Some(BTreeMap::from([("memory".to_string(), Quantity(format!("{mib}Mi")))])),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use crds::PullPolicy;
    use crds::contract::{HTTP_PORT, Role};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube::ResourceExt;

    use crate::children::testing::{build, containers, job, plan_of, role_pods, settings};

    /// A frozen pod is found by the kubelet (a liveness probe on every container, on the port the program
    /// serves health on), and MemoryX's pod is given the plan's time to checkpoint when it is stopped.
    #[test]
    fn every_container_is_probed_for_liveness_and_memoryx_has_time_to_checkpoint() {
        let j = job(4);
        let d = build(&j, &settings(true), 4);
        let memoryx = d.memoryx.spec.clone().unwrap().template.spec.unwrap();
        assert_eq!(memoryx.termination_grace_period_seconds, Some(plan_of(&j).stop_seconds() as i64));
        assert!(plan_of(&j).stop_seconds() >= 30);
        for c in containers(&d) {
            let probe = c.liveness_probe.as_ref().unwrap_or_else(|| panic!("{} has no liveness probe", c.name));
            let http = probe.http_get.as_ref().expect("an HTTP probe");
            assert_eq!(
                (http.path.as_deref(), &http.port, http.scheme.as_deref()),
                (Some("/healthz"), &IntOrString::Int(i32::from(HTTP_PORT)), Some("HTTPS"))
            );
            let window = probe.period_seconds.unwrap() * probe.failure_threshold.unwrap();
            assert!(
                window <= 20 && probe.timeout_seconds.unwrap() >= 5,
                "{}: found within 20 s, a busy one not mistaken",
                c.name
            );
        }
        // A frozen engine, SwarmX node or input worker is killed by its pod's grace period (restartPolicy
        // Never), so that one must be as short as its probe's, or its replacement waits out 30 s.
        for p in &d.pods {
            let spec = p.spec.as_ref().expect("a pod spec");
            let probe = spec.containers[0].liveness_probe.as_ref().and_then(|l| l.termination_grace_period_seconds);
            assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "{}", p.name_any());
            assert_eq!(
                spec.termination_grace_period_seconds,
                probe,
                "{}: killed as soon as its probe fails",
                p.name_any()
            );
            assert!(probe.is_some_and(|g| g <= 5), "{}", p.name_any());
        }
    }

    #[test]
    fn images_and_resources_follow_the_spec() {
        let mut j = job(1);
        j.spec.images.runtime = Some("registry.local/ws:dev".into());
        j.spec.images.pull_policy = Some(PullPolicy::Never);
        let pods = role_pods(&build(&j, &settings(false), 1), Role::Engine);
        let c = &pods[0].spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.local/ws:dev"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        let default = role_pods(&build(&job(1), &settings(false), 1), Role::Engine);
        assert_eq!(
            default[0].spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("weightstream/runtime:0.1.0")
        );
    }
}
