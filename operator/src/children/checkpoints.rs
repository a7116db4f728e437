//! MemoryX's checkpoint volumes: the claim template each weight server's claim is made from, named and labelled
//! after the job's uid so it can outlive the job (`spec.checkpoint.retain`) without a later job of the same name
//! ever adopting it, and what the StatefulSet does with the claims when it is deleted.
//!
//! The StatefulSet controller makes the claims (`<template>-<set>-<ordinal>`), copying the template's labels and
//! annotations. With `Retain` the StatefulSet's claim retention policy is `Retain` for deletion too: the
//! controller gives the claims no owner, so neither the job's deletion (the operator's cleanup, or the garbage
//! collector should the finalizer be removed while the operator is down) nor the StatefulSet's removes them. With
//! `Delete` the controller makes the StatefulSet their owner, and the operator's cleanup deletes them by label.

use std::collections::BTreeMap;

use crds::contract::{JOB_LABEL, JOB_UID_LABEL, PULL_POLICY_ANNOTATION, RUNTIME_IMAGE_ANNOTATION, Role};
use crds::{RetainPolicy, TrainingJob};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::container::{image, pull_policy};
use super::hash::spec_hash;
use super::metadata::labels;
use super::pods::SPEC_HASH_ANNOTATION;
use super::settings::Settings;
use crate::Error;

/// Where MemoryX keeps its checkpoints (a persistent volume, so restarts and resumes continue from them).
pub const CHECKPOINT_DIR: &str = "/var/lib/weightstream/checkpoints";

/// The claim template's name, which is also the volume's in MemoryX's pod: `checkpoints-<uid>`. Each weight
/// server's claim is `checkpoints-<uid>-<job>-memoryx-<ordinal>`, so a job submitted again under the name of a
/// deleted one whose claims were kept gets claims of its own, and never resumes from nor prunes the old
/// checkpoints. (The uid, 36 characters, keeps the volume name within a DNS label's 63.)
pub fn volume_name(job: &TrainingJob) -> Result<String, Error> {
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    Ok(format!("checkpoints-{uid}"))
}

/// The claim template of the job's weight servers: the spec's size and storage class, MemoryX's labels and the
/// job's uid ([`JOB_UID_LABEL`]), by which `wsctl checkpoint` finds a deleted job's claim and the cleanup of a
/// `Delete` job finds its own; and the image the job runs, with which `wsctl` reads the claim once the job is gone.
pub fn claim_template(job: &TrainingJob, settings: &Settings) -> Result<PersistentVolumeClaim, Error> {
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let mut claim_labels = labels(&job.name_any(), Some(Role::Memoryx));
    claim_labels.insert(JOB_UID_LABEL.to_string(), uid);
    Ok(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(volume_name(job)?),
            labels: Some(claim_labels),
            annotations: Some(BTreeMap::from([
                (RUNTIME_IMAGE_ANNOTATION.to_string(), image(job, settings)),
                (PULL_POLICY_ANNOTATION.to_string(), pull_policy(job)),
            ])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: job.spec.checkpoint.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(job.spec.checkpoint.volume_size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// What the StatefulSet does with the claims: kept when it scales down (a suspended job resumes from them), and
/// when it is deleted as `spec.checkpoint.retain` says.
pub fn retention(job: &TrainingJob) -> StatefulSetPersistentVolumeClaimRetentionPolicy {
    let when_deleted = match job.spec.checkpoint.retain {
        RetainPolicy::Retain => "Retain",
        RetainPolicy::Delete => "Delete",
    };
    StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(when_deleted.into()),
        when_scaled: Some("Retain".into()),
    }
}

/// The label selector of the claims of the job `name` of uid `uid`, and of no earlier job of that name.
pub fn claims_selector(name: &str, uid: &str) -> String {
    format!("{JOB_LABEL}={name},{JOB_UID_LABEL}={uid}")
}

/// A StatefulSet's claim templates cannot change once it exists, and its claims are made: when `existing` (a
/// StatefulSet of the job made earlier, by an operator that named or labelled the claims otherwise, or with
/// another volume size) has other templates than `desired`, `desired` keeps the existing ones, and MemoryX's
/// pod mounts the volume by the existing template's name (its spec hash updated to match).
pub fn keep_existing_claims(desired: &mut StatefulSet, existing: &StatefulSet) -> Result<(), Error> {
    let (Some(want), Some(have)) = (desired.spec.as_mut(), existing.spec.as_ref()) else { return Ok(()) };
    let theirs = have.volume_claim_templates.clone().unwrap_or_default();
    let ours = want.volume_claim_templates.clone().unwrap_or_default();
    let same = |a: &PersistentVolumeClaim, b: &PersistentVolumeClaim| {
        let spec = |c: &PersistentVolumeClaim| {
            c.spec.as_ref().map(|s| (s.resources.clone(), s.storage_class_name.clone(), s.access_modes.clone()))
        };
        a.metadata.name == b.metadata.name
            && a.metadata.labels == b.metadata.labels
            && a.metadata.annotations == b.metadata.annotations
            && spec(a) == spec(b)
    };
    if theirs.is_empty() || (theirs.len() == ours.len() && theirs.iter().zip(&ours).all(|(a, b)| same(a, b))) {
        return Ok(());
    }
    let (Some(old), Some(new)) =
        (theirs.first().and_then(|t| t.metadata.name.clone()), ours.first().and_then(|t| t.metadata.name.clone()))
    else {
        return Ok(());
    };
    want.volume_claim_templates =
        Some(theirs.into_iter().map(|t| PersistentVolumeClaim { status: None, ..t }).collect());
    let Some(pod) = want.template.spec.as_mut() else { return Ok(()) };
    for mount in pod.containers.iter_mut().flat_map(|c| c.volume_mounts.iter_mut().flatten()) {
        if mount.name == new {
            mount.name.clone_from(&old);
        }
    }
    let hash = spec_hash(pod)?;
    want.template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SPEC_HASH_ANNOTATION.into(), hash);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::testing::{build, job, settings};

    /// Under `Retain` (the default) the claims outlive the job: the StatefulSet keeps them when it is deleted (so
    /// the controller gives them no owner), and the template owns nothing and names the job and its uid. Under
    /// `Delete` the StatefulSet deletes them with itself (the controller makes it their owner).
    #[test]
    fn retained_claims_have_no_owner_and_carry_the_jobs_name_and_uid() {
        let j = job(2);
        assert_eq!(j.spec.checkpoint.retain, RetainPolicy::Retain, "retained unless the user asks otherwise");
        let sts = build(&j, &settings(false), 2).memoryx.spec.unwrap();
        let policy = sts.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!((policy.when_deleted.as_deref(), policy.when_scaled.as_deref()), (Some("Retain"), Some("Retain")));
        let claim = &sts.volume_claim_templates.unwrap()[0];
        assert!(claim.metadata.owner_references.is_none(), "a claim template owns nothing");
        let l = claim.metadata.labels.clone().unwrap();
        assert_eq!((l[JOB_LABEL].as_str(), l[JOB_UID_LABEL].as_str()), ("mnist", "1234-abcd"));
        assert_eq!(claim.metadata.name.as_deref(), Some("checkpoints-1234-abcd"));
        let a = claim.metadata.annotations.clone().unwrap();
        assert_eq!(
            (a[RUNTIME_IMAGE_ANNOTATION].as_str(), a[PULL_POLICY_ANNOTATION].as_str()),
            ("weightstream/runtime:0.1.0", "IfNotPresent")
        );
        // MemoryX mounts the volume by the template's name, where its --checkpoint-dir says.
        let pod = sts.template.spec.unwrap();
        let mount = pod.containers[0].volume_mounts.iter().flatten().find(|m| m.mount_path == CHECKPOINT_DIR).unwrap();
        assert_eq!(mount.name, "checkpoints-1234-abcd");

        let mut d = job(2);
        d.spec.checkpoint.retain = RetainPolicy::Delete;
        let policy =
            build(&d, &settings(false), 2).memoryx.spec.unwrap().persistent_volume_claim_retention_policy.unwrap();
        assert_eq!((policy.when_deleted.as_deref(), policy.when_scaled.as_deref()), (Some("Delete"), Some("Retain")));
        assert_eq!(
            claims_selector("mnist", "1234-abcd"),
            "weightstream.dev/job=mnist,weightstream.dev/job-uid=1234-abcd"
        );
    }

    /// A job submitted again under a deleted one's name (another uid) gets claims of its own: the StatefulSet
    /// names each claim after the template, so it never adopts the retained ones.
    #[test]
    fn a_namesake_gets_claims_of_its_own() {
        let first = job(2);
        let mut again = job(2);
        again.metadata.uid = Some("5678-ef01".into());
        let template = |j: &TrainingJob| {
            build(j, &settings(false), 2).memoryx.spec.unwrap().volume_claim_templates.unwrap()[0].clone()
        };
        assert_ne!(template(&first).metadata.name, template(&again).metadata.name);
        assert_eq!(template(&again).metadata.labels.unwrap()[JOB_UID_LABEL], "5678-ef01");
        let mut no_uid = job(2);
        no_uid.metadata.uid = None;
        assert!(claim_template(&no_uid, &settings(false)).is_err(), "no claim without the uid that keeps it apart");
    }

    /// A StatefulSet made earlier with other claim templates (an older operator's `checkpoints`, unlabelled)
    /// keeps them, since they cannot change, and MemoryX mounts the volume by their name; one made as now is
    /// applied unchanged.
    #[test]
    fn an_existing_statefulset_keeps_its_claim_templates() {
        let j = job(2);
        let desired = build(&j, &settings(false), 2).memoryx;
        let mut unchanged = desired.clone();
        keep_existing_claims(&mut unchanged, &desired).unwrap();
        assert_eq!(unchanged, desired);

        let mut old = desired.clone();
        let spec = old.spec.as_mut().unwrap();
        let template = &mut spec.volume_claim_templates.as_mut().unwrap()[0];
        template.metadata.name = Some("checkpoints".into());
        template.metadata.labels.as_mut().unwrap().remove(JOB_UID_LABEL);
        template.metadata.annotations = None;
        let pod = spec.template.spec.as_mut().unwrap();
        pod.containers[0]
            .volume_mounts
            .iter_mut()
            .flatten()
            .filter(|m| m.mount_path == CHECKPOINT_DIR)
            .for_each(|m| m.name = "checkpoints".into());
        let old_hash = spec_hash(pod).unwrap();

        let mut kept = desired.clone();
        keep_existing_claims(&mut kept, &old).unwrap();
        let spec = kept.spec.unwrap();
        assert_eq!(spec.volume_claim_templates, old.spec.as_ref().unwrap().volume_claim_templates);
        let pod = spec.template.spec.unwrap();
        let mount = pod.containers[0].volume_mounts.iter().flatten().find(|m| m.mount_path == CHECKPOINT_DIR).unwrap();
        assert_eq!(mount.name, "checkpoints");
        assert_eq!(
            spec.template.metadata.unwrap().annotations.unwrap()[SPEC_HASH_ANNOTATION],
            old_hash,
            "the old pod, not rolled"
        );
        assert_eq!(
            spec.persistent_volume_claim_retention_policy.and_then(|p| p.when_deleted).as_deref(),
            Some("Retain")
        );
    }
}
