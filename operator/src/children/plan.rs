//! The plan of a job at the size it holds, refused here when it cannot run: a shard that cannot fit an engine,
//! a memory budget below one layer, a checkpoint volume too small for what it must keep.

use crds::{PlanStatus, SwarmxTreeStatus, TrainingJob};
use kube::ResourceExt;
use plan::appliance::Plan;

use super::names;
use crate::Error;

/// Refuses a checkpoint volume that cannot hold what weight server 0 (the coordinator) keeps on it: the
/// checkpoints the job keeps and the one being written, each of the whole state (the coordinator writes every
/// server's slice, so a checkpoint can be pulled from one place and resumed on any number of servers), plus its
/// disk tier (the part of its slice beyond its memory budget). Every server has a volume of this size (the
/// StatefulSet's claim template); such a job would otherwise fail at its first full disk, hours in, instead of now.
pub(crate) fn check_volume(c: &crds::CheckpointSpec, m: &plan::memoryx::MemoryxPlan) -> Result<(), Error> {
    let volume = crds::quantity_bytes(&c.volume_size)
        .ok_or_else(|| Error::Plan(format!("spec.checkpoint.volumeSize '{}' is not a quantity", c.volume_size)))?;
    let state = m.server_bytes.saturating_mul(u64::from(m.servers));
    let checkpoints = state.saturating_mul(u64::from(c.keep) + 1);
    let needed = checkpoints.saturating_add(m.disk_bytes);
    if volume < needed {
        return Err(Error::Plan(format!(
            "spec.checkpoint.volumeSize {} is smaller than what the coordinator (weight server 0 of {}) keeps on its \
             volume: {} checkpoints of the whole state ({} kept + 1 being written, {checkpoints} bytes) and its disk \
             tier ({} bytes), {needed} bytes in all: raise volumeSize, lower spec.checkpoint.keep or raise \
             spec.memoryx.memoryBytes",
            c.volume_size,
            m.servers,
            u64::from(c.keep) + 1,
            c.keep,
            m.disk_bytes
        )));
    }
    Ok(())
}

/// The job's spec as it runs on `cs2` CS-2s (the allocated count). An elastic job on fewer than it asks for runs
/// the full job's shards as micro-batches, so its curve stays the full job's; at its full size that is already
/// the spec's own micro-batch. The fewest CS-2s it may shrink to are checked where the spec's own size is.
pub(crate) fn at_size(spec: &crds::TrainingJobSpec, cs2: u32) -> crds::TrainingJobSpec {
    let mut running = spec.clone();
    if spec.min_cs2.is_some() && cs2 < spec.cs2 {
        running.training.micro_batch_size = Some(spec.micro_batch());
    }
    running.cs2 = cs2;
    running.min_cs2 = spec.min_cs2.filter(|&m| m <= cs2);
    running
}

/// The plan for the job at `cs2` engines (the allocated count, which differs from the spec while a rescale
/// waits), and the same in the terms of the status. A job whose shard cannot fit an engine is refused here.
pub fn plan(job: &TrainingJob, cs2: u32, fan_out: u32) -> Result<(Plan, PlanStatus), Error> {
    let spec = at_size(&job.spec, cs2);
    let plan = Plan::for_spec(&spec, fan_out).map_err(|e| match e {
        // The plan's own refusal says what to change; its "plan:" prefix would only repeat ours.
        errors::Error::Plan(why) => Error::Plan(why),
        other => Error::Plan(other.to_string()),
    })?;
    check_volume(&spec.checkpoint, &plan.memoryx)?;
    let name = job.name_any();
    let status = PlanStatus {
        cs2,
        shard: plan.shard as u64,
        memoryx_bytes: plan.memoryx_bytes,
        engine_sram_bytes: plan.engine_sram_bytes,
        peak_engine_bytes: plan.peak_engine_bytes,
        execution_mode: plan.execution_mode,
        step_bytes: plan.step_bytes,
        swarmx: SwarmxTreeStatus {
            fan_out: plan.swarmx.fan_out,
            depth: plan.swarmx.depth(),
            nodes: plan.swarmx.nodes().map(|n| names::swarmx(&name, n.level, n.index)).collect(),
        },
        engines: (0..cs2).map(|i| names::engine(&name, i)).collect(),
    };
    Ok((plan, status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::desired::desired;
    use crate::children::testing::{job, settings};

    #[test]
    fn a_job_too_big_for_the_engine_is_refused_with_the_reason() {
        let mut j = job(1);
        j.spec.engine.sram_bytes = Some(1024);
        let err = plan(&j, 1, 2).unwrap_err().to_string();
        assert!(err.contains("SRAM") || err.contains("sram") || err.contains("bytes"), "{err}");
        assert!(desired(&j, &settings(false), 1).is_err());
    }

    #[test]
    fn a_volume_too_small_for_the_checkpoints_kept_is_refused() {
        let mut j = job(2);
        let (p, _) = plan(&j, 2, 2).unwrap();
        let per = p.memoryx.server_bytes;
        assert_eq!(p.memoryx.disk_bytes, 0, "one server keeps the whole state in memory by default");
        j.spec.checkpoint.keep = 2;
        j.spec.checkpoint.volume_size = format!("{}", 3 * per);
        assert!(plan(&j, 2, 2).is_ok(), "room for two kept and one being written");
        j.spec.checkpoint.volume_size = format!("{}", 3 * per - 1);
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.contains("spec.checkpoint.volumeSize") && err.contains("3 checkpoints"), "{err}");
    }

    /// The coordinator's volume holds the checkpoints of every slice and its own disk tier.
    #[test]
    fn the_volume_holds_whole_checkpoints_and_a_disk_tier() {
        let mut j = job(2);
        j.spec.model.layers = vec![784, 64, 512, 512, 512, 512, 512, 10];
        j.spec.memoryx.servers = Some(4);
        let (p, _) = plan(&j, 2, 2).unwrap();
        let m = p.memoryx.clone();
        assert_eq!(m.servers, 4);
        assert!(m.server_bytes * 4 >= p.memoryx_bytes - 8 * p.layers.iter().map(|l| l.weights as u64).sum::<u64>());
        assert!(m.server_bytes < p.memoryx_bytes, "a slice is smaller than the state");
        j.spec.checkpoint.keep = 1;
        j.spec.checkpoint.volume_size = format!("{}", 2 * 4 * m.server_bytes);
        assert!(plan(&j, 2, 2).is_ok(), "two whole checkpoints fit: one kept, one being written");
        j.spec.checkpoint.volume_size = format!("{}", 2 * 4 * m.server_bytes - 1);
        assert!(plan(&j, 2, 2).is_err(), "a checkpoint is every server's slice");
        // A memory budget below a slice puts the rest on the disk tier, which the volume must hold too.
        j.spec.memoryx.memory_bytes = Some(m.min_memory_bytes);
        j.spec.checkpoint.volume_size = "1Ti".into();
        let disk = plan(&j, 2, 2).unwrap().0.memoryx.disk_bytes;
        assert!(disk > 0, "part of each slice on disk");
        let state = 4 * plan(&j, 2, 2).unwrap().0.memoryx.server_bytes;
        j.spec.checkpoint.volume_size = format!("{}", 2 * state + disk);
        assert!(plan(&j, 2, 2).is_ok());
        j.spec.checkpoint.volume_size = format!("{}", 2 * state + disk - 1);
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.contains("weight server 0 of 4") && err.contains("disk tier"), "{err}");
    }

    /// A memory budget below what one server needs for a layer is refused with the plan's own words, once.
    #[test]
    fn a_memory_budget_below_one_layer_is_refused_with_the_numbers() {
        let mut j = job(2);
        j.spec.memoryx.memory_bytes = Some(1 << 20);
        j.spec.memoryx.servers = Some(1);
        j.spec.model.layers = vec![784, 1024, 10];
        let err = plan(&j, 2, 2).unwrap_err().to_string();
        assert!(err.starts_with("the plan refuses the job: spec.memoryx.memoryBytes"), "{err}");
        assert!(err.contains("raise memoryBytes"), "{err}");
        assert!(desired(&j, &settings(false), 2).is_err());
    }
}
