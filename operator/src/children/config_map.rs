//! The ConfigMap every role mounts: the job manifest as the data plane reads it, at the size it is assembled for.

use std::collections::BTreeMap;

use crds::TrainingJob;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use super::metadata::meta;
use super::names;
use super::plan::at_size;
use crate::Error;

/// Where every role finds the job manifest.
pub const CONFIG_DIR: &str = "/etc/weightstream";

/// The ConfigMap every role mounts: the job manifest as the data plane reads it, with the CS-2 count the
/// appliance is assembled for. The roles compute the plan from it themselves, so only what they read is here
/// and hashed into the pods: a new operator whose plan gains a field restarts no running job.
pub fn config_map(job: &TrainingJob, cs2: u32) -> Result<ConfigMap, Error> {
    // Only what the data plane reads: the fields that concern the operator alone (suspension, priority, the
    // restart limit, images and resources, what becomes of the checkpoints after the job) are left at their
    // defaults, so changing them — suspending above all — does not change the configuration hash and replace
    // running pods.
    let defaults: crds::TrainingJobSpec = serde_json::from_value(serde_json::json!({
        "model": job.spec.model,
        "data": job.spec.data,
        "training": job.spec.training,
    }))
    .map_err(|e| Error::Serialize(e.to_string()))?;
    let spec = crds::TrainingJobSpec {
        suspend: defaults.suspend,
        restart_limit: defaults.restart_limit,
        priority: defaults.priority,
        priority_class_name: defaults.priority_class_name,
        active_deadline_seconds: defaults.active_deadline_seconds,
        min_cs2: defaults.min_cs2,
        images: defaults.images,
        resources: defaults.resources,
        checkpoint: crds::CheckpointSpec { retain: defaults.checkpoint.retain, ..job.spec.checkpoint.clone() },
        ..at_size(&job.spec, cs2)
    };
    let manifest = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "TrainingJob",
        // The uid lets MemoryX tell this job's checkpoints from those of an earlier job of the same name.
        "metadata": { "name": job.name_any(), "namespace": job.namespace(), "uid": job.uid() },
        "spec": spec,
    });
    let job_yaml = serde_yaml::to_string(&manifest).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(ConfigMap {
        metadata: meta(job, names::config(&job.name_any()), None)?,
        data: Some(BTreeMap::from([(JOB_FILE.to_string(), job_yaml)])),
        ..Default::default()
    })
}

/// The ConfigMap key, and file name under [`CONFIG_DIR`], of the job manifest.
pub(crate) const JOB_FILE: &str = "job.yaml";

#[cfg(test)]
mod tests {
    use crate::children::plan::plan;
    use crate::children::testing::{build, config_hash, job, settings};

    #[test]
    fn config_map_carries_the_allocated_size_and_the_status_the_plan() {
        let j = job(4);
        let d = build(&j, &settings(false), 2);
        let data = d.config.data.clone().unwrap();
        assert_eq!(data.len(), 1, "only what the data plane reads");
        let parsed = crds::parse_training_job(&data["job.yaml"]).expect("the data plane can parse it");
        assert_eq!(parsed.spec.cs2, 2);
        assert_eq!(parsed.spec.model, j.spec.model);
        let (p, _) = plan(&j, 2, 2).unwrap();
        assert_eq!((d.plan.cs2, d.plan.shard), (2, 32));
        assert_eq!(d.plan.engines, ["mnist-engine-0", "mnist-engine-1"]);
        assert_eq!(d.plan.swarmx.nodes, ["mnist-swarmx-0-0"]);
        assert_eq!(d.plan.swarmx.depth, 1);
        assert_eq!(d.plan.memoryx_bytes, p.memoryx_bytes);
        assert_eq!(parsed.spec.training.micro_batch_size, None, "a rescale to 2 is a 2-CS-2 job");
        // An elastic job shrunk to 2 runs the 4-CS-2 job's shards as micro-batches; at 4 its shards are those.
        let mut elastic = job(4);
        elastic.spec.min_cs2 = Some(2);
        let shrunk = |n| {
            let data = build(&elastic, &settings(false), n).config.data.unwrap();
            crds::parse_training_job(&data["job.yaml"]).expect("parses").spec.training.micro_batch_size
        };
        assert_eq!((shrunk(2), shrunk(4)), (Some(16), None));
        assert_eq!(
            (plan(&elastic, 2, 2).unwrap().0.micro_batch, plan(&elastic, 4, 2).unwrap().0.micro_batch),
            (16, 16)
        );
    }

    #[test]
    fn suspending_or_reprioritising_does_not_change_what_the_pods_read() {
        let j = job(4);
        let before = config_hash(&j, 4);
        let mut k = j.clone();
        k.spec.suspend = true;
        k.spec.priority = 7;
        k.spec.priority_class_name = Some("high".into());
        k.spec.restart_limit = 9;
        k.spec.checkpoint.retain = crds::RetainPolicy::Delete;
        assert_eq!(config_hash(&k, 4), before, "no pod is replaced by a suspend");
        k.spec.training.seed += 1;
        assert_ne!(config_hash(&k, 4), before, "training changes do reach the pods");
    }
}
