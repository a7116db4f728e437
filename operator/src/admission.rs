//! Gang admission: a job gets all of its CS-2s at once or none. The pool's state is derived every time from
//! the jobs themselves (`status.allocatedCs2`), never remembered, so an operator restart loses nothing.
//!
//! The queue's order is decided between tenants by what cluster admins control and within a tenant by what
//! the tenant says: first the value of the job's Kubernetes `PriorityClass` (`spec.priorityClassName`, or the
//! cluster's `globalDefault` class, or 0 — as for pods), then creation order; a namespace's own
//! `spec.priority` only reorders that namespace's jobs among the places they already hold in the queue. So no
//! tenant moves ahead of another by writing a number, and a job naming a class that does not exist is never
//! admitted (`PriorityClassNotFound`) and blocks no one.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crds::conditions::{ConditionType, Reason};
use crds::{Phase, TrainingJob};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::ResourceExt;

/// The cluster's PriorityClasses as admission needs them: each class's value and the `globalDefault` one's,
/// read from the API server (cluster admins create them; tenants cannot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriorityClasses {
    values: BTreeMap<String, i32>,
    global_default: Option<i32>,
}

impl PriorityClasses {
    /// From the listed classes. With several `globalDefault` classes, the lowest value is the default, as the
    /// API server's Priority admission plugin picks it for pods.
    pub fn new(classes: &[PriorityClass]) -> PriorityClasses {
        let mut pc = PriorityClasses::default();
        for c in classes {
            pc.values.insert(c.name_any(), c.value);
            if c.global_default == Some(true) {
                pc.global_default = Some(pc.global_default.map_or(c.value, |d| d.min(c.value)));
            }
        }
        pc
    }

    /// The value a job naming `name` is ordered by: the class's, the global default's when it names none, or
    /// `None` when it names a class that does not exist.
    pub fn value_of(&self, name: Option<&str>) -> Option<i32> {
        match name {
            Some(n) => self.values.get(n).copied(),
            None => Some(self.global_default.unwrap_or(0)),
        }
    }
}

/// A job as admission sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// `namespace/name`, which identifies the job.
    pub key: String,
    /// The job's namespace: the tenant whose own `spec.priority` may reorder its jobs.
    pub namespace: String,
    /// The value of its PriorityClass, which orders the queue first; `None` when `spec.priorityClassName`
    /// names a class that does not exist (the job is then never admitted and waits in no one's way).
    pub class: Option<i32>,
    /// The class it names, for the message when the class is missing.
    pub class_name: Option<String>,
    /// `spec.priority`: higher first, but only among the same namespace's jobs of the same class value.
    pub priority: i32,
    /// Creation time in seconds since the epoch: equal priorities are admitted first come, first served.
    pub created: i64,
    /// CS-2s it holds now.
    pub holds: u32,
    /// CS-2s it waits for (0 when it waits for nothing: running, suspended, finished).
    pub wants: u32,
    /// Whether it cannot start whatever is free (its data volume's claim does not exist): it waits outside the
    /// queue, blocking no one, until its own pass finds the claim.
    pub blocked: bool,
}

impl Claim {
    /// The claim of a job as it stands in the API server, with the cluster's PriorityClasses.
    pub fn of(job: &TrainingJob, classes: &PriorityClasses) -> Claim {
        let status = job.status.clone().unwrap_or_default();
        let holds = status.allocated_cs2.unwrap_or(0);
        let terminal = status.phase.is_some_and(Phase::is_terminal);
        let deleting = job.metadata.deletion_timestamp.is_some();
        // A job under Kueue waits in Kueue's queue, not in this one.
        let kueue = crate::kueue::workload::queue_of(job).is_some();
        let waits = holds == 0 && !terminal && !deleting && !job.spec.suspend && !kueue;
        let wants = if waits { job.spec.cs2 } else { 0 };
        let namespace = job.namespace().unwrap_or_default();
        Claim {
            key: crate::job_key(&namespace, &job.name_any()),
            namespace,
            class: classes.value_of(job.spec.priority_class_name.as_deref()),
            class_name: job.spec.priority_class_name.clone(),
            priority: job.spec.priority,
            created: job.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            holds,
            wants,
            blocked: status
                .conditions
                .iter()
                .any(|c| ConditionType::Admitted.of(c) && Reason::DataVolumeNotFound.of(c)),
        }
    }

    /// The claim of a job the operator cannot decode: it keeps what its status says it holds (its pods may
    /// still run), and waits for nothing, since nothing can be assembled from a spec that cannot be read.
    pub fn undecodable(key: String, namespace: String, holds: u32) -> Claim {
        Claim {
            key,
            namespace,
            class: None,
            class_name: None,
            priority: 0,
            created: 0,
            holds,
            wants: 0,
            blocked: false,
        }
    }
}

/// The waiting jobs in the order admission takes them: by class value (higher first), then creation time;
/// then each namespace's jobs of one class value are dealt, in its own `spec.priority` order, into the places
/// they hold between them. Jobs whose class does not exist are left out.
pub fn queue(claims: &[Claim]) -> Vec<&Claim> {
    let mut places: Vec<&Claim> = claims.iter().filter(|c| c.wants > 0 && c.class.is_some() && !c.blocked).collect();
    places.sort_by_key(|c| (Reverse(c.class), c.created, c.key.clone()));
    let mut own: BTreeMap<(&str, Option<i32>), Vec<&Claim>> = BTreeMap::new();
    for c in &places {
        own.entry((c.namespace.as_str(), c.class)).or_default().push(c);
    }
    for jobs in own.values_mut() {
        // Last first, so `pop` deals them in order.
        jobs.sort_by_key(|c| (c.priority, Reverse(c.created), Reverse(c.key.clone())));
    }
    places.iter().map(|&c| own.get_mut(&(c.namespace.as_str(), c.class)).and_then(Vec::pop).unwrap_or(c)).collect()
}

/// Where the job `key` stands among the waiting jobs, 1 being next; `None` when it does not wait in the queue
/// (it holds its CS-2s, or names a PriorityClass that does not exist).
pub fn position(claims: &[Claim], key: &str) -> Option<u32> {
    queue(claims).iter().position(|c| c.key == key).and_then(|i| u32::try_from(i + 1).ok())
}

/// What admission says about one job.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// All its CS-2s are free and no job ahead of it is waiting: start it.
    Admit,
    /// Kueue admitted its Workload: start it on `cs2` CS-2s (fewer than `spec.cs2` under partial admission).
    Kueue {
        /// The engines' count in Kueue's admission.
        cs2: u32,
        /// The ClusterQueue whose quota it uses.
        cluster_queue: String,
    },
    /// It waits; `reason` is a condition reason and `message` says for what.
    Wait {
        /// The reason for the `Admitted` condition.
        reason: Reason,
        /// A sentence for people.
        message: String,
    },
}

/// Decides whether the job `key` may start, given the pool size and every job's claim.
///
/// Waiting jobs are taken in priority order, then creation order; each is admitted while its whole gang fits
/// what is free. The first that does not fit blocks everyone behind it, so a large job is never starved by a
/// stream of small ones. A job larger than the whole pool blocks no one: it can never start.
pub fn decide(pool: u32, claims: &[Claim], key: &str) -> Verdict {
    let used: u32 = claims.iter().map(|c| c.holds).sum();
    let mut free = pool.saturating_sub(used);
    if let Some(c) = claims.iter().find(|c| c.key == key && c.wants > 0 && c.class.is_none()) {
        return Verdict::Wait {
            reason: Reason::PriorityClassNotFound,
            message: format!(
                "spec.priorityClassName names PriorityClass '{}', which does not exist: ask a cluster admin for it, \
                 or name another",
                c.class_name.as_deref().unwrap_or_default()
            ),
        };
    }
    let mut ahead = 0;
    for c in queue(claims) {
        if c.wants > pool {
            if c.key == key {
                return Verdict::Wait {
                    reason: Reason::ExceedsPool,
                    message: format!("needs {} CS-2s but the whole pool has {pool}", c.wants),
                };
            }
            continue;
        }
        if c.wants > free {
            if c.key == key {
                return Verdict::Wait {
                    reason: Reason::InsufficientCapacity,
                    message: format!("needs {} CS-2s, {free} of {pool} free", c.wants),
                };
            }
            return Verdict::Wait {
                reason: Reason::WaitingForEarlierJobs,
                message: format!(
                    "{} job(s) ahead in the queue wait for CS-2s first ({free} of {pool} free)",
                    ahead + 1
                ),
            };
        }
        if c.key == key {
            return Verdict::Admit;
        }
        free -= c.wants;
        ahead += 1;
    }
    Verdict::Wait { reason: Reason::NotWaiting, message: "the job does not wait for CS-2s".into() }
}

/// Whether a running job may grow by `extra` CS-2s now: only from what is free after every waiting job that
/// admission would start first, so growing never jumps the queue.
pub fn may_grow(pool: u32, claims: &[Claim], extra: u32) -> bool {
    let used: u32 = claims.iter().map(|c| c.holds).sum();
    let waiting: u32 = claims
        .iter()
        .filter(|c| c.wants > 0 && c.wants <= pool && c.class.is_some() && !c.blocked)
        .map(|c| c.wants)
        .sum();
    pool.saturating_sub(used).saturating_sub(waiting) >= extra
}

/// The waiting job that takes running job `key`'s CS-2s, when the operator preempts: the first job in the queue
/// that fits the pool but not what is free (once the jobs admission starts before it have theirs) takes them
/// from running jobs of a lower PriorityClass value only, the lowest value first and the newest first among
/// equals, as few as cover what it lacks. `None` when `key` is not among those, or when all of them together
/// would not be enough (no job is preempted in vain). A job being preempted holds its CS-2s until its
/// checkpoint is written, so every pass until then names it again.
pub fn preempted_by<'a>(pool: u32, claims: &'a [Claim], key: &str) -> Option<&'a Claim> {
    let used: u32 = claims.iter().map(|c| c.holds).sum();
    let mut free = pool.saturating_sub(used);
    let head = queue(claims).into_iter().find(|c| {
        let fits_now = c.wants <= free;
        if fits_now {
            free -= c.wants;
        }
        c.wants <= pool && !fits_now
    })?;
    let rank = |c: &Claim| c.class.unwrap_or(i32::MIN);
    let mut lower: Vec<&Claim> = claims.iter().filter(|c| c.holds > 0 && rank(c) < rank(head)).collect();
    lower.sort_by_key(|c| (rank(c), Reverse(c.created), c.key.clone()));
    let mut chosen = false;
    for c in lower {
        if free >= head.wants {
            break;
        }
        free += c.holds;
        chosen |= c.key == key;
    }
    (free >= head.wants && chosen).then_some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, priority: i32, created: i64, holds: u32, wants: u32) -> Claim {
        Claim {
            key: key.into(),
            namespace: "ns".into(),
            class: Some(0),
            class_name: None,
            priority,
            created,
            holds,
            wants,
            blocked: false,
        }
    }

    /// A job of namespace `ns` in a class of value `class`, waiting for `wants` CS-2s.
    fn t(ns: &str, name: &str, class: Option<i32>, priority: i32, created: i64, wants: u32) -> Claim {
        Claim {
            key: format!("{ns}/{name}"),
            namespace: ns.into(),
            class,
            class_name: Some("some-class".into()),
            priority,
            created,
            holds: 0,
            wants,
            blocked: false,
        }
    }

    /// A job whose data claim is missing waits outside the queue: the job behind it is admitted.
    #[test]
    fn a_job_whose_data_volume_is_missing_blocks_no_one() {
        let mut a = c("a", 0, 1, 0, 4);
        a.blocked = true;
        let claims = vec![a, c("b", 0, 2, 0, 4)];
        assert_eq!(decide(4, &claims, "b"), Verdict::Admit);
        assert_eq!(position(&claims, "a"), None);
        assert!(may_grow(4, &claims[..1], 4));
    }

    fn order(claims: &[Claim]) -> Vec<&str> {
        queue(claims).into_iter().map(|c| c.key.as_str()).collect()
    }

    #[test]
    fn a_tenants_own_priority_never_jumps_another_tenant() {
        // b raises its number to the maximum; a was first. Between tenants, only the class and age count.
        let claims = [t("a", "first", Some(0), 0, 1, 2), t("b", "pushy", Some(0), 1000, 2, 2)];
        assert_eq!(order(&claims), ["a/first", "b/pushy"]);
        assert_eq!(decide(2, &claims, "a/first"), Verdict::Admit);
        assert!(matches!(decide(2, &claims, "b/pushy"), Verdict::Wait { reason: Reason::InsufficientCapacity, .. }));
        // Within b, its priority reorders its own jobs among the places they hold.
        let claims = [
            t("b", "old", Some(0), 0, 1, 1),
            t("a", "mid", Some(0), 0, 2, 1),
            t("b", "urgent", Some(0), 5, 3, 1),
            t("a", "late", Some(0), 9, 4, 1),
        ];
        assert_eq!(order(&claims), ["b/urgent", "a/late", "b/old", "a/mid"]);
    }

    #[test]
    fn the_priority_class_value_orders_before_age_and_spec_priority() {
        let claims = [
            t("a", "default", Some(0), 1000, 1, 2),
            t("b", "batch", Some(-10), 1000, 0, 2),
            t("c", "prod", Some(100_000), -1000, 9, 2),
        ];
        assert_eq!(order(&claims), ["c/prod", "a/default", "b/batch"]);
        assert_eq!(decide(2, &claims, "c/prod"), Verdict::Admit);
        // The same tenant in two classes: its priority does not carry a job across classes.
        let claims = [t("a", "low", Some(1), 1000, 1, 1), t("a", "high", Some(2), 0, 2, 1)];
        assert_eq!(order(&claims), ["a/high", "a/low"]);
    }

    #[test]
    fn a_missing_priority_class_is_never_admitted_and_blocks_no_one() {
        let claims = [t("a", "ghost", None, 1000, 1, 1), t("b", "real", Some(0), 0, 2, 1)];
        match decide(4, &claims, "a/ghost") {
            Verdict::Wait { reason, message } => {
                assert_eq!(reason, "PriorityClassNotFound");
                assert!(message.contains("'some-class'"), "{message}");
            }
            v => panic!("admitted without its class: {v:?}"),
        }
        assert_eq!(decide(1, &claims, "b/real"), Verdict::Admit);
        assert!(may_grow(2, &claims[..1], 2), "a job that cannot start holds back no growth");
    }

    #[test]
    fn classes_give_their_value_and_the_lowest_global_default() {
        let pc = |name: &str, value: i32, default: bool| PriorityClass {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            value,
            global_default: default.then_some(true),
            ..Default::default()
        };
        let none = PriorityClasses::new(&[pc("high", 1000, false)]);
        assert_eq!(
            (none.value_of(Some("high")), none.value_of(None), none.value_of(Some("gone"))),
            (Some(1000), Some(0), None)
        );
        let defaults = PriorityClasses::new(&[pc("d1", 50, true), pc("d2", 20, true), pc("high", 1000, false)]);
        assert_eq!(defaults.value_of(None), Some(20));
        let mut j = crds::testing::mlp_job("j", "ns", 2);
        j.spec.priority_class_name = Some("high".into());
        let claim = Claim::of(&j, &defaults);
        assert_eq!((claim.class, claim.namespace.as_str(), claim.wants), (Some(1000), "ns", 2));
        j.spec.priority_class_name = None;
        assert_eq!(Claim::of(&j, &defaults).class, Some(20));
        let broken = Claim::undecodable("ns/x".into(), "ns".into(), 3);
        assert_eq!((broken.holds, broken.wants), (3, 0));
        assert!(
            matches!(
                decide(4, &[broken, Claim::of(&j, &defaults)], "ns/j"),
                Verdict::Wait { reason: Reason::InsufficientCapacity, .. }
            ),
            "what a broken job holds stays taken"
        );
    }

    #[test]
    fn admits_only_whole_gangs() {
        let claims = [c("a", 0, 1, 3, 0), c("b", 0, 2, 0, 2)];
        assert!(matches!(decide(4, &claims, "b"), Verdict::Wait { reason: Reason::InsufficientCapacity, .. }));
        assert_eq!(decide(5, &claims, "b"), Verdict::Admit);
    }

    #[test]
    fn first_come_first_served_and_no_overtaking() {
        let claims = [c("big", 0, 1, 0, 4), c("small", 0, 2, 0, 1), c("running", 0, 0, 2, 0)];
        // 2 free: the big job waits, and the small one behind it must not jump ahead.
        assert!(matches!(decide(4, &claims, "big"), Verdict::Wait { reason: Reason::InsufficientCapacity, .. }));
        assert!(matches!(decide(4, &claims, "small"), Verdict::Wait { reason: Reason::WaitingForEarlierJobs, .. }));
        // When the running job is gone, the big one starts first.
        let freed = [c("big", 0, 1, 0, 4), c("small", 0, 2, 0, 1)];
        assert_eq!(decide(4, &freed, "big"), Verdict::Admit);
        assert!(matches!(decide(4, &freed, "small"), Verdict::Wait { .. }));
        assert_eq!(decide(5, &freed, "small"), Verdict::Admit);
    }

    #[test]
    fn priority_before_age() {
        let claims = [c("old", 0, 1, 0, 2), c("urgent", 10, 5, 0, 2)];
        assert_eq!(decide(2, &claims, "urgent"), Verdict::Admit);
        assert!(matches!(decide(2, &claims, "old"), Verdict::Wait { .. }));
    }

    #[test]
    fn a_job_larger_than_the_pool_blocks_no_one() {
        let claims = [c("huge", 0, 1, 0, 9), c("small", 0, 2, 0, 1)];
        assert!(matches!(decide(4, &claims, "huge"), Verdict::Wait { reason: Reason::ExceedsPool, .. }));
        assert_eq!(decide(4, &claims, "small"), Verdict::Admit);
    }

    #[test]
    fn a_waiting_job_knows_its_place_in_the_queue() {
        let claims = [c("running", 0, 1, 2, 0), c("first", 0, 2, 0, 2), c("second", 0, 3, 0, 1)];
        assert_eq!(position(&claims, "first"), Some(1));
        assert_eq!(position(&claims, "second"), Some(2));
        assert_eq!(position(&claims, "running"), None, "a job holding its CS-2s does not queue");
    }

    #[test]
    fn growth_never_jumps_the_queue() {
        let claims = [c("running", 0, 1, 2, 0), c("queued", 0, 2, 0, 2)];
        assert!(!may_grow(4, &claims, 1));
        assert!(may_grow(5, &claims, 1));
        assert!(may_grow(4, &[c("running", 0, 1, 2, 0)], 2));
    }

    /// A job of class value `class` holding `holds` CS-2s, created at `created`.
    fn r(name: &str, class: i32, created: i64, holds: u32) -> Claim {
        Claim { holds, wants: 0, ..t("ns", name, Some(class), 0, created, 0) }
    }

    /// Preemption takes from lower classes only, the lowest and newest first, as few jobs as cover the need,
    /// and nobody when that is not enough.
    #[test]
    fn preemption_takes_the_fewest_lowest_newest_jobs_and_only_when_it_is_enough() {
        let high = t("ns", "high", Some(100), 0, 10, 4);
        let who = |claims: &[Claim]| -> Vec<String> {
            claims.iter().filter(|c| preempted_by(4, claims, &c.key).is_some()).map(|c| c.key.clone()).collect()
        };
        // One lower job holding the whole pool gives it up, to the waiting high one.
        let claims = vec![r("low", 0, 1, 4), high.clone()];
        assert_eq!(preempted_by(4, &claims, "ns/low").map(|c| c.key.as_str()), Some("ns/high"));
        assert_eq!(who(&claims), ["ns/low"]);
        // Two lower jobs of 2: both go for 4; for 2, only the newer one.
        assert_eq!(who(&[r("old", 0, 1, 2), r("new", 0, 2, 2), high.clone()]), ["ns/old", "ns/new"]);
        let wants_two = Claim { wants: 2, ..high.clone() };
        assert_eq!(who(&[r("old", 0, 1, 2), r("new", 0, 2, 2), wants_two.clone()]), ["ns/new"]);
        // The lowest class goes first, even when older.
        assert_eq!(who(&[r("mid", 50, 1, 2), r("low", 0, 0, 2), wants_two.clone()]), ["ns/low"]);
        // Free CS-2s count: 2 free and a job of 2 to take covers 4.
        assert_eq!(who(&[r("low", 0, 1, 2), high.clone()]), ["ns/low"]);
        // The same class never preempts; a job of the same class holding half the pool makes the rest too little.
        assert!(who(&[r("peer", 100, 1, 4), high.clone()]).is_empty());
        assert!(who(&[r("peer", 100, 1, 2), r("low", 0, 2, 2), high.clone()]).is_empty());
        // A job larger than the pool preempts nobody; nor does a job that fits what is free.
        assert!(who(&[r("low", 0, 1, 4), Claim { wants: 8, ..high.clone() }]).is_empty());
        assert!(who(&[r("low", 0, 1, 2), wants_two]).is_empty());
    }
}
