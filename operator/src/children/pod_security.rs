//! The pod spec every role runs in, which passes Pod Security "restricted".

use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, SeccompProfile, Volume};

/// The user the runtime image runs as (`images/build.sh`); also the group that owns the checkpoint volume.
pub const RUNTIME_UID: i64 = 65532;

/// A pod spec for `containers` that passes Pod Security "restricted": non-root, the runtime's default seccomp
/// profile, no service-account token (the data plane never talks to the API server), and the checkpoint
/// volume's files owned by the runtime's group so MemoryX can write them.
pub(crate) fn restricted_pod(containers: Vec<Container>, volumes: Vec<Volume>) -> PodSpec {
    PodSpec {
        containers,
        volumes: Some(volumes),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUNTIME_UID),
            run_as_group: Some(RUNTIME_UID),
            fs_group: Some(RUNTIME_UID),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::testing::{build, job, settings};

    /// The checks of Pod Security "restricted" (v1.34) that a pod spec can fail, as the API server applies them.
    fn restricted_violations(spec: &PodSpec) -> Vec<String> {
        let mut v = Vec::new();
        let pod = spec.security_context.clone().unwrap_or_default();
        fn seccomp(p: &Option<SeccompProfile>) -> Option<&str> {
            p.as_ref().map(|p| p.type_.as_str())
        }
        if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
            v.push("host namespaces".into());
        }
        for vol in spec.volumes.iter().flatten() {
            let allowed = vol.config_map.is_some()
                || vol.secret.is_some()
                || vol.empty_dir.is_some()
                || vol.persistent_volume_claim.is_some()
                || vol.projected.is_some()
                || vol.downward_api.is_some();
            if !allowed {
                v.push(format!("volume {} of a restricted type", vol.name));
            }
        }
        for c in &spec.containers {
            let sc = c.security_context.clone().unwrap_or_default();
            if sc.allow_privilege_escalation != Some(false) {
                v.push(format!("{}: allowPrivilegeEscalation", c.name));
            }
            if sc.privileged == Some(true) {
                v.push(format!("{}: privileged", c.name));
            }
            let drops_all =
                sc.capabilities.as_ref().and_then(|k| k.drop.as_ref()).is_some_and(|d| d.iter().any(|x| x == "ALL"));
            let adds = sc
                .capabilities
                .as_ref()
                .and_then(|k| k.add.as_ref())
                .is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE"));
            if !drops_all || adds {
                v.push(format!("{}: capabilities", c.name));
            }
            if sc.run_as_non_root.or(pod.run_as_non_root) != Some(true) {
                v.push(format!("{}: runAsNonRoot", c.name));
            }
            if sc.run_as_user.or(pod.run_as_user) == Some(0) {
                v.push(format!("{}: runAsUser 0", c.name));
            }
            if !matches!(
                seccomp(&sc.seccomp_profile).or(seccomp(&pod.seccomp_profile)),
                Some("RuntimeDefault" | "Localhost")
            ) {
                v.push(format!("{}: seccompProfile", c.name));
            }
            if c.ports.iter().flatten().any(|p| p.host_port.is_some()) {
                v.push(format!("{}: hostPort", c.name));
            }
        }
        v
    }

    #[test]
    fn every_pod_passes_pod_security_restricted() {
        let d = build(&job(4), &settings(true), 4);
        let mut specs = vec![d.memoryx.spec.clone().unwrap().template.spec.unwrap()];
        specs.extend(d.pods.iter().map(|p| p.spec.clone().unwrap()));
        assert_eq!(specs.len(), 1 + 3 + 4 + 4, "MemoryX, the tree, the engines and their input workers");
        for spec in specs {
            assert_eq!(restricted_violations(&spec), Vec::<String>::new(), "{:?}", spec.hostname);
            assert_eq!(spec.automount_service_account_token, Some(false), "no API token in the data plane");
            assert!(
                spec.containers
                    .iter()
                    .all(|c| c.security_context.as_ref().and_then(|s| s.read_only_root_filesystem) == Some(true))
            );
            assert_eq!(
                spec.security_context.and_then(|s| s.fs_group),
                Some(RUNTIME_UID),
                "MemoryX can write its volume"
            );
        }
    }
}
