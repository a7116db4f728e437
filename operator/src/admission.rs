//! Gang admission: a job gets all of its CS-2s at once or none. The pool's state is derived every time from
//! the jobs themselves (`status.allocatedCs2`), never remembered, so an operator restart loses nothing.

use std::cmp::Reverse;

use crds::{Phase, TrainingJob};
use kube::ResourceExt;

/// A job as admission sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// `namespace/name`, which identifies the job.
    pub key: String,
    /// Higher is admitted first.
    pub priority: i32,
    /// Creation time in seconds since the epoch: equal priorities are admitted first come, first served.
    pub created: i64,
    /// CS-2s it holds now.
    pub holds: u32,
    /// CS-2s it waits for (0 when it waits for nothing: running, suspended, finished).
    pub wants: u32,
}

impl Claim {
    /// The claim of a job as it stands in the API server.
    pub fn of(job: &TrainingJob) -> Claim {
        let status = job.status.clone().unwrap_or_default();
        let holds = status.allocated_cs2.unwrap_or(0);
        let terminal = status.phase.is_some_and(Phase::is_terminal);
        let deleting = job.metadata.deletion_timestamp.is_some();
        let wants = if holds == 0 && !terminal && !deleting && !job.spec.suspend { job.spec.cs2 } else { 0 };
        Claim {
            key: format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any()),
            priority: job.spec.priority,
            created: job.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            holds,
            wants,
        }
    }
}

/// What admission says about one job.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// All its CS-2s are free and no job ahead of it is waiting: start it.
    Admit,
    /// It waits; `reason` is a condition reason and `message` says for what.
    Wait {
        /// A CamelCase reason for the `Admitted` condition.
        reason: &'static str,
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
    let mut queue: Vec<&Claim> = claims.iter().filter(|c| c.wants > 0).collect();
    queue.sort_by_key(|c| (Reverse(c.priority), c.created, c.key.clone()));
    let mut ahead = 0;
    for c in queue {
        if c.wants > pool {
            if c.key == key {
                return Verdict::Wait {
                    reason: "ExceedsPool",
                    message: format!("needs {} CS-2s but the whole pool has {pool}", c.wants),
                };
            }
            continue;
        }
        if c.wants > free {
            if c.key == key {
                return Verdict::Wait {
                    reason: "InsufficientCapacity",
                    message: format!("needs {} CS-2s, {free} of {pool} free", c.wants),
                };
            }
            return Verdict::Wait {
                reason: "WaitingForEarlierJobs",
                message: format!("{} job(s) ahead in the queue wait for CS-2s first ({free} of {pool} free)", ahead + 1),
            };
        }
        if c.key == key {
            return Verdict::Admit;
        }
        free -= c.wants;
        ahead += 1;
    }
    Verdict::Wait { reason: "NotWaiting", message: "the job does not wait for CS-2s".into() }
}

/// Whether a running job may grow by `extra` CS-2s now: only from what is free after every waiting job that
/// admission would start first, so growing never jumps the queue.
pub fn may_grow(pool: u32, claims: &[Claim], extra: u32) -> bool {
    let used: u32 = claims.iter().map(|c| c.holds).sum();
    let waiting: u32 = claims.iter().filter(|c| c.wants > 0 && c.wants <= pool).map(|c| c.wants).sum();
    pool.saturating_sub(used).saturating_sub(waiting) >= extra
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, priority: i32, created: i64, holds: u32, wants: u32) -> Claim {
        Claim { key: key.into(), priority, created, holds, wants }
    }

    #[test]
    fn admits_only_whole_gangs() {
        let claims = [c("a", 0, 1, 3, 0), c("b", 0, 2, 0, 2)];
        assert!(matches!(decide(4, &claims, "b"), Verdict::Wait { reason: "InsufficientCapacity", .. }));
        assert_eq!(decide(5, &claims, "b"), Verdict::Admit);
    }

    #[test]
    fn first_come_first_served_and_no_overtaking() {
        let claims = [c("big", 0, 1, 0, 4), c("small", 0, 2, 0, 1), c("running", 0, 0, 2, 0)];
        // 2 free: the big job waits, and the small one behind it must not jump ahead.
        assert!(matches!(decide(4, &claims, "big"), Verdict::Wait { reason: "InsufficientCapacity", .. }));
        assert!(matches!(decide(4, &claims, "small"), Verdict::Wait { reason: "WaitingForEarlierJobs", .. }));
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
        assert!(matches!(decide(4, &claims, "huge"), Verdict::Wait { reason: "ExceedsPool", .. }));
        assert_eq!(decide(4, &claims, "small"), Verdict::Admit);
    }

    #[test]
    fn growth_never_jumps_the_queue() {
        let claims = [c("running", 0, 1, 2, 0), c("queued", 0, 2, 0, 2)];
        assert!(!may_grow(4, &claims, 1));
        assert!(may_grow(5, &claims, 1));
        assert!(may_grow(4, &[c("running", 0, 1, 2, 0)], 2));
    }
}
