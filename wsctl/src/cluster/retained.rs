//! A deleted job's checkpoints, in the claims it left behind (`spec.checkpoint.retain: Retain`, the default):
//! found by the job's name label, and read through a short-lived pod that mounts weight server 0's claim (the
//! coordinator writes whole checkpoints there) read-only and serves it with `checkpoint-server`, MemoryX's own
//! checkpoint routes. The pod presents an identity issued for it alone (its Secret is owned by the pod), wsctl
//! the matching client certificate, over a port-forward; the pod is deleted when the command ends, and stops by
//! itself at its deadline should the command die first.

use std::collections::BTreeMap;
use std::time::Duration;

use crds::contract::{
    HTTP_PORT, JOB_LABEL, JOB_UID_LABEL, PULL_POLICY_ANNOTATION, ROLE_LABEL, RUNTIME_IMAGE_ANNOTATION, Role,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, KeyToPath, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe, SeccompProfile, Secret,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use wire::identity::{Identity, MOUNTED};

use super::portforward::Forward;
use super::{Cluster, Error};

/// The image that reads a claim when the claim does not name the one its job ran (a claim made before the
/// operator recorded it).
pub const DEFAULT_IMAGE: &str = concat!("weightstream/runtime:", env!("CARGO_PKG_VERSION"));
/// The user the runtime image runs as, and the group that owns the checkpoint volume's files.
const RUNTIME_UID: i64 = 65532;
/// Where the reader mounts the claim (read-only) and the identity.
const CHECKPOINT_DIR: &str = "/var/lib/weightstream/checkpoints";
const IDENTITY_DIR: &str = "/var/run/weightstream/identity";
/// The label on a reader pod naming the job whose claim it reads (not the job label: a later job of the same
/// name must not take the reader for one of its pods).
pub const READER_LABEL: &str = "weightstream.dev/checkpoint-reader";

/// The claims job `job` left in the namespace: each weight server's, of every earlier job of that name.
pub async fn claims(cluster: &Cluster, job: &str) -> Result<Vec<PersistentVolumeClaim>, Error> {
    let ns = &cluster.namespace;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let selector = format!("{JOB_LABEL}={job},{ROLE_LABEL}={}", Role::Memoryx);
    let action = format!("list the checkpoint claims of {ns}/{job}");
    Ok(api.list(&ListParams::default().labels(&selector)).await.map_err(Error::other(action))?.items)
}

/// Weight server 0's claim (`<template>-<job>-memoryx-0`, the StatefulSet controller's name) of the newest job
/// among `claims` (of the job of uid `uid` only, when given), and how many claims of other jobs of the same name
/// there are besides.
pub fn newest_server0<'a>(
    claims: &'a [PersistentVolumeClaim],
    job: &str,
    uid: Option<&str>,
) -> Option<(&'a PersistentVolumeClaim, usize)> {
    let suffix = format!("-{job}-memoryx-0");
    let mut zeros: Vec<&PersistentVolumeClaim> =
        claims.iter().filter(|c| c.name_any().ends_with(&suffix) && c.metadata.deletion_timestamp.is_none()).collect();
    let others = zeros.len();
    if let Some(uid) = uid {
        zeros.retain(|c| c.labels().get(JOB_UID_LABEL).map(String::as_str) == Some(uid));
    }
    let others = others - zeros.len().min(1);
    zeros.sort_by(|a, b| b.creation_timestamp().map(|t| t.0).cmp(&a.creation_timestamp().map(|t| t.0)));
    let newest = zeros.first().copied()?;
    Some((newest, if uid.is_some() { others } else { zeros.len() - 1 }))
}

/// The reader pod `name` of `claim` (job `job`'s), serving with the identity in Secret `name`, gone after
/// `deadline_seconds` at the latest. It passes Pod Security "restricted" and mounts the claim read-only.
pub fn reader_pod(name: &str, job: &str, claim: &PersistentVolumeClaim, deadline_seconds: i64) -> Pod {
    let annotation = |key: &str| claim.annotations().get(key).cloned();
    let image = annotation(RUNTIME_IMAGE_ANNOTATION).unwrap_or_else(|| DEFAULT_IMAGE.to_string());
    let https = |path: &str| HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(HTTP_PORT)),
        scheme: Some("HTTPS".into()),
        ..Default::default()
    };
    let items =
        MOUNTED.iter().map(|f| KeyToPath { key: f.to_string(), path: f.to_string(), ..Default::default() }).collect();
    let container = Container {
        name: "checkpoint-server".into(),
        image: Some(image),
        image_pull_policy: annotation(PULL_POLICY_ANNOTATION),
        command: Some(vec!["checkpoint-server".into()]),
        args: Some(vec![
            "--dir".into(),
            CHECKPOINT_DIR.into(),
            "--identity".into(),
            IDENTITY_DIR.into(),
            "--listen".into(),
            format!("0.0.0.0:{HTTP_PORT}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(HTTP_PORT),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(https("/healthz")),
            period_seconds: Some(1),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "checkpoints".into(),
                mount_path: CHECKPOINT_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "identity".into(),
                mount_path: IDENTITY_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "weightstream".to_string()),
                ("app.kubernetes.io/component".to_string(), "checkpoint-reader".to_string()),
                (READER_LABEL.to_string(), job.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(vec![
                Volume {
                    name: "checkpoints".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.name_any(),
                        read_only: Some(true),
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "identity".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(name.into()),
                        items: Some(items),
                        default_mode: Some(0o440),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(deadline_seconds),
            termination_grace_period_seconds: Some(1),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(RUNTIME_UID),
                run_as_group: Some(RUNTIME_UID),
                fs_group: Some(RUNTIME_UID),
                // The volume's root is the runtime group's already (MemoryX wrote it): nothing to change on it.
                fs_group_change_policy: Some("OnRootMismatch".into()),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A reader pod serving a retained claim, reached through a port-forward.
pub struct Reader {
    pods: Api<Pod>,
    name: String,
    /// The forward to the pod's HTTPS port.
    pub forward: Forward,
    /// The base URL through the forward.
    pub base: String,
    /// The client identity the pod accepts.
    pub identity: Identity,
    /// The claim it reads.
    pub claim: String,
}

impl Reader {
    /// Deletes the pod (its Secret, owned by it, goes with it); a failure is only reported: the pod stops at
    /// its deadline anyway.
    pub async fn close(self) {
        let Reader { pods, name, forward, .. } = self;
        drop(forward);
        if let Err(e) = pods.delete(&name, &DeleteParams::background()).await {
            eprintln!(
                "wsctl: could not delete the checkpoint reader pod {name}: {e} (it stops by itself at its deadline)"
            );
        }
    }
}

/// Starts a reader of job `job`'s newest claim of weight server 0 (that of the job of uid `uid`, when given: a
/// job that exists but whose MemoryX is not running), and waits for it to serve (at most `timeout`, which also
/// bounds the pod's life).
pub async fn open(cluster: &Cluster, job: &str, uid: Option<&str>, timeout: Duration) -> Result<Reader, Error> {
    let ns = cluster.namespace.clone();
    let all = claims(cluster, job).await?;
    let (claim, earlier) =
        newest_server0(&all, job, uid).ok_or_else(|| Error::NotFound { namespace: ns.clone(), name: job.into() })?;
    let uid = claim.labels().get(JOB_UID_LABEL).cloned().unwrap_or_else(|| "unknown".into());
    if earlier > 0 {
        eprintln!(
            "wsctl: reading claim {} (job uid {uid}); {earlier} other job(s) named {job} left claims too \
             (`kubectl get pvc -n {ns} -l {JOB_LABEL}={job}` lists them)",
            claim.name_any()
        );
    }
    let issued =
        wire::identity::issue(job, &[]).map_err(|e| Error::Invalid(format!("cannot issue a reader identity: {e}")))?;
    let name = format!("{}-checkpoint-reader-{}", truncate(job, 30), suffix());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let deadline = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX).saturating_add(30);
    let pod = reader_pod(&name, job, claim, deadline);
    let created = pods.create(&PostParams::default(), &pod).await.map_err(Error::other(format!(
        "create the checkpoint reader pod {ns}/{name} for claim {}",
        claim.name_any()
    )))?;
    let reader_secret = secret(&name, &created, &issued);
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &ns);
    let made = secrets
        .create(&PostParams::default(), &reader_secret)
        .await
        .map_err(Error::other(format!("create Secret {ns}/{name}")));
    if let Err(e) = made {
        let _ = pods.delete(&name, &DeleteParams::background()).await;
        return Err(e);
    }
    if let Err(e) = wait_ready(&pods, &name, &ns, timeout).await {
        let _ = pods.delete(&name, &DeleteParams::background()).await;
        return Err(e);
    }
    let forward = Forward::start(pods.clone(), &name, HTTP_PORT).await?;
    let base = format!("https://{}", forward.addr);
    Ok(Reader { pods, name, forward, base, identity: issued.operator_identity(), claim: claim.name_any() })
}

/// The Secret with the reader's server identity, owned by its pod so it goes with it.
fn secret(name: &str, pod: &Pod, issued: &wire::identity::Issued) -> Secret {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: pod.meta().uid.clone().unwrap_or_default(),
        ..Default::default()
    };
    let data = issued
        .files()
        .into_iter()
        .filter(|(k, _)| MOUNTED.contains(k))
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())));
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), owner_references: Some(vec![owner]), ..Default::default() },
        type_: Some("Opaque".into()),
        data: Some(data.collect()),
        ..Default::default()
    }
}

/// Waits for the reader pod to be ready, or says why it is not with the command that shows more.
async fn wait_ready(pods: &Api<Pod>, name: &str, ns: &str, timeout: Duration) -> Result<(), Error> {
    let started = tokio::time::Instant::now();
    let mut last = None;
    while started.elapsed() < timeout {
        let pod = pods.get(name).await.map_err(Error::other(format!("read pod {ns}/{name}")))?;
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            return Ok(());
        }
        if phase == "Failed" || phase == "Succeeded" {
            return Err(Error::Invalid(format!(
                "the checkpoint reader pod {ns}/{name} ended ({phase}) before serving; `kubectl logs {name} -n {ns}` says why"
            )));
        }
        last = Some(format!("pod {name} {phase}; `kubectl describe pod {name} -n {ns}` says why"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(Error::Timeout {
        after: started.elapsed(),
        what: format!("the checkpoint reader pod {ns}/{name} to serve"),
        last,
    })
}

/// At most `n` bytes of `s` (a DNS label's room for the pod name's suffix).
fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => s[..i].trim_end_matches('-'),
        None => s,
    }
}

/// Eight hex digits that differ between two readers started at once.
fn suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn claim(name: &str, uid: &str, created_secs: i64) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.name = Some(name.into());
        c.metadata.labels = Some(BTreeMap::from([(JOB_UID_LABEL.to_string(), uid.to_string())]));
        c.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created_secs).unwrap()));
        c
    }

    /// The newest job's server-0 claim is read; other servers' claims and other jobs' are not mistaken for it.
    #[test]
    fn the_newest_jobs_server_0_claim_is_read() {
        let claims = vec![
            claim("checkpoints-u1-mnist-memoryx-0", "u1", 100),
            claim("checkpoints-u2-mnist-memoryx-1", "u2", 300),
            claim("checkpoints-u2-mnist-memoryx-0", "u2", 200),
            claim("checkpoints-u3-xmnist-memoryx-0", "u3", 400),
            claim("checkpoints-u4-mnist-memoryx-01", "u4", 500),
        ];
        let (c, earlier) = newest_server0(&claims, "mnist", None).expect("a claim");
        assert_eq!((c.name_any().as_str(), earlier), ("checkpoints-u2-mnist-memoryx-0", 1));
        assert!(newest_server0(&claims[1..2], "mnist", None).is_none(), "server 1 holds no whole checkpoint");
        // A job that still exists reads its own claim, not a newer namesake's.
        let (c, others) = newest_server0(&claims, "mnist", Some("u1")).expect("its own claim");
        assert_eq!((c.name_any().as_str(), others), ("checkpoints-u1-mnist-memoryx-0", 1));
        assert!(newest_server0(&claims, "mnist", Some("u9")).is_none());
    }

    /// The reader mounts the claim read-only, runs the claim's image, and passes Pod Security "restricted".
    #[test]
    fn the_reader_pod_mounts_the_claim_read_only_and_is_restricted() {
        let mut c = claim("checkpoints-u1-mnist-memoryx-0", "u1", 1);
        c.metadata.annotations = Some(BTreeMap::from([
            (RUNTIME_IMAGE_ANNOTATION.to_string(), "reg.local/ws:dev".to_string()),
            (PULL_POLICY_ANNOTATION.to_string(), "Never".to_string()),
        ]));
        let pod = reader_pod("mnist-checkpoint-reader-1", "mnist", &c, 90);
        let spec = pod.spec.as_ref().unwrap();
        let claim = spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone()).unwrap();
        assert_eq!((claim.claim_name.as_str(), claim.read_only), ("checkpoints-u1-mnist-memoryx-0", Some(true)));
        let container = &spec.containers[0];
        assert!(container.volume_mounts.iter().flatten().all(|m| m.read_only == Some(true)));
        assert_eq!(
            (container.image.as_deref(), container.image_pull_policy.as_deref()),
            (Some("reg.local/ws:dev"), Some("Never"))
        );
        assert_eq!(spec.active_deadline_seconds, Some(90));
        let sc = container.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.allow_privilege_escalation, sc.read_only_root_filesystem, sc.run_as_non_root),
            (Some(false), Some(true), Some(true))
        );
        assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()), Some("RuntimeDefault"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(!pod.labels().contains_key(JOB_LABEL), "a later job of the same name must not take it for its own");
        let unannotated = reader_pod("r", "mnist", &claim_of("x"), 1);
        assert_eq!(unannotated.spec.unwrap().containers[0].image.as_deref(), Some(DEFAULT_IMAGE));
    }

    fn claim_of(name: &str) -> PersistentVolumeClaim {
        claim(name, "u", 1)
    }

    #[test]
    fn reader_names_fit_a_dns_label() {
        let long = "a".repeat(60);
        let name = format!("{}-checkpoint-reader-{}", truncate(&long, 30), suffix());
        assert!(name.len() <= 63, "{name}");
        assert_eq!(truncate("ab-", 2), "ab");
        assert_eq!(truncate("mnist", 30), "mnist");
    }
}
