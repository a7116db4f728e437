//! One stored TrainingJob at a time: the operator reads jobs as they are stored and decodes each on its own, so
//! an object the Rust type cannot hold (stored before a schema maximum existed, or written past the schema by
//! whoever can loosen it) is reported on that object alone — and never fails the list or the watch that every
//! other job's reconcile depends on.

use crds::conditions::{ConditionType, Reason};
use crds::{TrainingJob, TrainingJobStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::admission::{Claim, PriorityClasses};
use crate::status;

/// A stored TrainingJob that does not decode: what the operator can still say and do about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its generation, for the condition's `observedGeneration`.
    pub generation: Option<i64>,
    /// The resourceVersion read, so a status written about it is a compare-and-swap.
    pub resource_version: Option<String>,
    /// Why it does not decode, with the path of the offending field (`spec.training.batchSize: …`).
    pub error: String,
    /// Its status (empty when it has none yet), when that part still decodes (the status is the operator's
    /// own writing; a broken spec is what a tenant or a schema change leaves behind).
    pub status: Option<TrainingJobStatus>,
}

impl Undecodable {
    /// `namespace/name`, as admission keys jobs.
    pub fn key(&self) -> String {
        crate::job_key(&self.namespace, &self.name)
    }

    /// What it weighs in admission: the CS-2s its status says it holds stay taken (its pods may still run
    /// and the operator cannot tell), and it waits for nothing.
    pub fn claim(&self) -> Claim {
        let holds = self.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
        Claim::undecodable(self.key(), self.namespace.clone(), holds)
    }
}

/// A stored job, decoded or not.
pub type Stored = Result<TrainingJob, Undecodable>;

/// Decodes one stored object into a [`TrainingJob`], or says why it cannot, naming the field.
// Either side is a value the reconciler keeps in its list, not an error passed up: the same size by design.
#[allow(clippy::result_large_err)]
pub fn decode(obj: &DynamicObject) -> Stored {
    let broken = |error: String| {
        // No status yet is an empty one; a status that does not decode either is none the operator can build on.
        let status = match obj.data.get("status") {
            None | Some(serde_json::Value::Null) => Some(TrainingJobStatus::default()),
            Some(s) => serde_json::from_value::<TrainingJobStatus>(s.clone()).ok(),
        };
        Undecodable {
            namespace: obj.namespace().unwrap_or_default(),
            name: obj.name_any(),
            generation: obj.metadata.generation,
            resource_version: obj.resource_version(),
            error,
            status,
        }
    };
    let value = match serde_json::to_value(obj) {
        Ok(v) => v,
        Err(e) => return Err(broken(e.to_string())),
    };
    serde_path_to_error::deserialize::<_, TrainingJob>(value).map_err(|e| {
        let path = e.path().to_string();
        broken(if path == "." { e.into_inner().to_string() } else { format!("{path}: {}", e.into_inner()) })
    })
}

/// Every stored job's claim on the pool, decoded or not.
pub fn claims(all: &[Stored], classes: &PriorityClasses) -> Vec<Claim> {
    all.iter()
        .map(|s| match s {
            Ok(job) => Claim::of(job, classes),
            Err(u) => u.claim(),
        })
        .collect()
}

/// The status to write on an undecodable job: its own status (phase and allocation kept, since the operator
/// can change nothing about the job) with `Ready=False`, reason `InvalidSpec` and the decoding error, so the
/// owner sees what to fix without the operator's logs. `None` when its status does not decode either: then
/// the Event alone says it.
pub fn invalid_spec_status(u: &Undecodable, now: Timestamp) -> Option<TrainingJobStatus> {
    let mut s = u.status.clone()?;
    let message = format!(
        "the operator cannot read this TrainingJob, so it is neither admitted nor changed: {} (the API server \
         stored a value the TrainingJob type does not allow; fix the field or recreate the job)",
        u.error
    );
    status::set_condition(
        &mut s.conditions,
        ConditionType::Ready,
        false,
        Reason::InvalidSpec,
        message,
        u.generation,
        now,
    );
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{self, Verdict};

    fn stored(job: &TrainingJob) -> serde_json::Value {
        serde_json::to_value(job).unwrap()
    }

    fn dynamic(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    /// A job as the API server may hold it once the schema that refused its batch size was loosened: 2^32
    /// does not fit the u32 the type reads it into.
    fn broken(name: &str, holds: Option<u32>) -> DynamicObject {
        let mut v = stored(&crds::testing::mlp_job(name, "ns", 2));
        v["spec"]["training"]["batchSize"] = serde_json::json!(4_294_967_296_u64);
        if let Some(h) = holds {
            v["status"] = serde_json::json!({ "phase": "Running", "allocatedCs2": h });
        }
        dynamic(v)
    }

    #[test]
    fn a_good_job_decodes_and_a_broken_one_names_its_field() {
        let good = crds::testing::mlp_job("good", "ns", 2);
        let decoded = decode(&dynamic(stored(&good))).expect("a good job decodes");
        assert_eq!((decoded.spec, decoded.metadata), (good.spec, good.metadata));
        let u = decode(&broken("bad", None)).unwrap_err();
        assert_eq!((u.namespace.as_str(), u.name.as_str()), ("ns", "bad"));
        assert!(u.error.starts_with("spec.training.batchSize: ") && u.error.contains("4294967296"), "{}", u.error);
        assert_eq!(u.status, Some(TrainingJobStatus::default()), "no status yet is an empty one");
        let s = invalid_spec_status(&u, Timestamp::from_second(1).unwrap()).expect("a status to write");
        assert_eq!((s.phase, s.conditions.len()), (None, 1));
    }

    #[test]
    fn a_broken_job_does_not_stop_the_good_ones_being_admitted() {
        // What the typed list did: one undecodable item fails the whole list, and so every job.
        let items = serde_json::json!({ "items": [stored(&crds::testing::mlp_job("good", "ns", 2)), serde_json::to_value(broken("bad", Some(1))).unwrap()] });
        assert!(serde_json::from_value::<Vec<TrainingJob>>(items["items"].clone()).is_err());
        // Decoded one by one, the good job is admitted and the broken one keeps what it holds.
        let all: Vec<Stored> =
            serde_json::from_value::<Vec<DynamicObject>>(items["items"].clone()).unwrap().iter().map(decode).collect();
        assert!(all[0].is_ok() && all[1].is_err());
        let claims = claims(&all, &PriorityClasses::default());
        assert_eq!(admission::decide(3, &claims, "ns/good"), Verdict::Admit);
        assert!(
            matches!(
                admission::decide(2, &claims, "ns/good"),
                Verdict::Wait { reason: Reason::InsufficientCapacity, .. }
            ),
            "its CS-2 stays taken"
        );
    }

    #[test]
    fn a_broken_job_shows_invalid_spec_in_ready_and_keeps_its_phase() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let u = decode(&broken("bad", Some(1))).unwrap_err();
        let s = invalid_spec_status(&u, now).expect("its status decodes");
        assert_eq!((s.phase, s.allocated_cs2), (Some(crds::Phase::Running), Some(1)));
        let c = s.conditions.iter().find(|c| ConditionType::Ready.of(c)).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", Reason::InvalidSpec.as_str()));
        assert!(c.message.contains("spec.training.batchSize") && c.message.contains("4294967296"), "{}", c.message);
        // The same error again changes nothing, so nothing is written and no Event repeats.
        let again = Undecodable { status: Some(s.clone()), ..u.clone() };
        assert_eq!(invalid_spec_status(&again, Timestamp::from_second(2_000_000).unwrap()), Some(s));
        // A status that does not decode either leaves only the Event.
        let mut v = serde_json::to_value(broken("worse", None)).unwrap();
        v["status"] = serde_json::json!({ "allocatedCs2": -1 });
        assert_eq!(invalid_spec_status(&decode(&dynamic(v)).unwrap_err(), now), None);
    }
}
