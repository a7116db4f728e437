//! The volumes a role's pod mounts: the job manifest and identity every role reads, and the data volume for the
//! roles that read it.

use crds::TrainingJob;
use crds::contract::{DATA_MOUNT, Role};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, KeyToPath, PersistentVolumeClaimVolumeSource, SecretVolumeSource, Volume, VolumeMount,
};
use kube::ResourceExt;
use plan::appliance::Plan;

use super::names;

/// What every role's pod mounts: the job manifest and the roles' part of the job's identity (readable by the
/// runtime's group only; the operator's key is not among the items).
pub(crate) fn role_volumes(job: &TrainingJob) -> Vec<Volume> {
    let items = wire::identity::MOUNTED
        .iter()
        .map(|f| KeyToPath { key: f.to_string(), path: f.to_string(), ..Default::default() })
        .collect();
    vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource { name: names::config(&job.name_any()), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "identity".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::identity(&job.name_any())),
                items: Some(items),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// The pod volumes and the container's mounts of a component of `role`: the job's own ([`role_volumes`]), and
/// the data volume, read-only at [`DATA_MOUNT`], for the roles that read it: input workers (the data), and
/// the roles that read a pretrained folder in it ([`Plan::reads_pretrained`]). No other pod mounts it, so a
/// job's data is read by the role that prepares it and by no other.
pub(crate) fn volumes_of(job: &TrainingJob, plan: &Plan, role: Role) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = role_volumes(job);
    let mut mounts = Vec::new();
    if let Some(claim) = job.spec.data.volume.as_ref().filter(|_| role == Role::Input || plan.reads_pretrained(role)) {
        volumes.push(Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "data".into(),
            mount_path: DATA_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    (volumes, mounts)
}

#[cfg(test)]
mod tests {
    use crds::contract::{DATA_MOUNT, EngineArgs, InputArgs, MemoryxArgs, ROLE_LABEL, Role};
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::ResourceExt;

    use crate::children::site::input_address;
    use crate::children::testing::{build, job, parse, role_pods, settings};

    /// With `spec.data.volume` and two workers per CS-2, each engine is fed by its own two workers, and only the
    /// input pods mount the claim, read-only, where their `--data-root` says.
    #[test]
    fn input_workers_alone_mount_the_data_volume_read_only() {
        let mut j = job(2);
        j.spec.data.volume = Some("corpus".into());
        j.spec.data.workers = 2;
        let d = build(&j, &settings(false), 2);
        let inputs = role_pods(&d, Role::Input);
        assert_eq!(inputs.len(), 4);
        for (i, p) in inputs.iter().enumerate() {
            let spec = p.spec.as_ref().unwrap();
            let claim =
                spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone()).expect("the data claim");
            assert_eq!((claim.claim_name.as_str(), claim.read_only), ("corpus", Some(true)));
            let c = &spec.containers[0];
            let mount = c.volume_mounts.iter().flatten().find(|m| m.name == "data").expect("mounted");
            assert_eq!((mount.mount_path.as_str(), mount.read_only), (DATA_MOUNT, Some(true)));
            let a: InputArgs = parse(c);
            assert_eq!((a.index, a.data_root.as_deref()), (i as u32, Some(std::path::Path::new(DATA_MOUNT))));
        }
        for p in d.pods.iter().filter(|p| p.labels()[ROLE_LABEL] != Role::Input.as_str()) {
            let mounts_data =
                p.spec.as_ref().unwrap().volumes.iter().flatten().any(|v| v.persistent_volume_claim.is_some());
            assert!(!mounts_data, "{} mounts the data volume", p.name_any());
        }
        let engines = role_pods(&d, Role::Engine);
        let a: EngineArgs = parse(&engines[1].spec.as_ref().unwrap().containers[0]);
        assert_eq!(a.inputs, vec![input_address("mnist", "ml", 2), input_address("mnist", "ml", 3)]);
        assert!(a.inputs[0].starts_with("https://mnist-input-2.mnist-input.ml.svc:7300"), "{:?}", a.inputs);
    }

    /// A job starting from a pretrained folder in its data volume: every weight server mounts the volume
    /// read-only and reads the folder under its `--data-root`; engines do so only when they prune a pipelined
    /// replica by magnitude (sparse), and SwarmX never.
    #[test]
    fn the_readers_of_a_pretrained_folder_mount_the_data_volume_read_only() {
        let mut j = job(2);
        j.spec.data = crds::DataSpec {
            kind: crds::DataKind::Text,
            path: "moby.txt".into(),
            volume: Some("corpus".into()),
            ..j.spec.data.clone()
        };
        j.spec.model = crds::ModelSpec {
            kind: crds::ModelKind::Llama,
            width: Some(64),
            heads: Some(4),
            kv_heads: Some(2),
            blocks: Some(2),
            intermediate_size: Some(96),
            context_length: Some(32),
            from: Some("models/tiny".into()),
            ..crds::ModelSpec::mlp(Vec::new(), crds::Activation::Gelu, 0.0)
        };
        j.spec.memoryx.servers = Some(2);
        let mounts_data = |spec: &PodSpec| {
            let claim = spec.volumes.iter().flatten().find_map(|v| v.persistent_volume_claim.clone());
            let mount = spec.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "data").cloned();
            match (claim, mount) {
                (Some(c), Some(m)) => {
                    assert_eq!(
                        (c.claim_name.as_str(), c.read_only, m.mount_path.as_str(), m.read_only),
                        ("corpus", Some(true), DATA_MOUNT, Some(true))
                    );
                    true
                }
                (None, None) => false,
                other => panic!("a claim without its mount or the reverse: {other:?}"),
            }
        };
        for (mode, sparsity, engines_read) in [
            (crds::ExecutionMode::WeightStreaming, 0.5, false),
            (crds::ExecutionMode::Pipelined, 0.0, false),
            (crds::ExecutionMode::Pipelined, 0.5, true),
        ] {
            j.spec.execution_mode = mode;
            j.spec.model.sparsity = sparsity;
            let d = build(&j, &settings(false), 2);
            let mx = d.memoryx.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            assert!(mounts_data(mx), "{mode:?}: MemoryX reads the folder");
            let a: MemoryxArgs = parse(&mx.containers[0]);
            assert_eq!(a.data_root.as_deref(), Some(std::path::Path::new(DATA_MOUNT)));
            for e in role_pods(&d, Role::Engine) {
                let spec = e.spec.as_ref().unwrap();
                assert_eq!(mounts_data(spec), engines_read, "{mode:?} sparsity {sparsity}: {}", e.name_any());
                let a: EngineArgs = parse(&spec.containers[0]);
                assert_eq!(a.data_root.is_some(), engines_read);
            }
            assert!(role_pods(&d, Role::Swarmx).iter().all(|p| !mounts_data(p.spec.as_ref().unwrap())));
        }
    }
}
