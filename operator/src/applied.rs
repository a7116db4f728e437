//! What each job's children were last applied as, so that a pass whose children are unchanged does not apply
//! them again: a running job is polled every few seconds, and re-applying its Secret check, ConfigMap, Services,
//! NetworkPolicy and StatefulSet on every poll is most of the API server's work on a shared cluster while
//! nothing changes.
//!
//! A record is kept per job uid with the fingerprint of what was applied; it is trusted for [`REFRESH`] only, so
//! a child someone deleted or edited by hand is restored within that time (and at once by any change to the
//! job, which changes the fingerprint). It is memory only: a restarted or newly leading operator applies
//! everything on its first pass, as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Error;
use crate::children::desired::Desired;
use crate::children::hash::fnv;

/// How long an unchanged application is trusted before the children are applied again anyway.
pub const REFRESH: Duration = Duration::from_secs(60);

/// The fingerprint of the children a pass applies besides the pods (which are counted against what exists on
/// every pass): their ConfigMap, Services, NetworkPolicy and MemoryX's StatefulSet.
pub fn fingerprint(desired: &Desired) -> Result<String, Error> {
    #[derive(Serialize)]
    struct Applied<'a> {
        config: &'a k8s_openapi::api::core::v1::ConfigMap,
        services: &'a [k8s_openapi::api::core::v1::Service],
        network_policy: &'a k8s_openapi::api::networking::v1::NetworkPolicy,
        memoryx: &'a k8s_openapi::api::apps::v1::StatefulSet,
    }
    let all = Applied {
        config: &desired.config,
        services: &desired.services,
        network_policy: &desired.network_policy,
        memoryx: &desired.memoryx,
    };
    let json = serde_json::to_vec(&all).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(fnv(&json))
}

/// The last application per job uid: its fingerprint and when it was made.
#[derive(Default)]
pub struct Applications {
    by_uid: Mutex<HashMap<String, (String, Instant)>>,
}

impl Applications {
    /// Whether the job `uid`'s children were applied as `fingerprint` less than [`REFRESH`] before `now`.
    pub fn current(&self, uid: &str, fingerprint: &str, now: Instant) -> bool {
        let Ok(by_uid) = self.by_uid.lock() else { return false };
        by_uid.get(uid).is_some_and(|(f, at)| f == fingerprint && now.saturating_duration_since(*at) < REFRESH)
    }

    /// Records that the job `uid`'s children were applied as `fingerprint` at `now`.
    pub fn record(&self, uid: &str, fingerprint: String, now: Instant) {
        if let Ok(mut by_uid) = self.by_uid.lock() {
            by_uid.insert(uid.to_string(), (fingerprint, now));
        }
    }

    /// Forgets the job `uid`: its next application is made in full (it failed, its children were released, or
    /// the job is gone).
    pub fn forget(&self, uid: &str) {
        if let Ok(mut by_uid) = self.by_uid.lock() {
            by_uid.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::testing::{build, job, settings};

    #[test]
    fn an_unchanged_application_is_trusted_until_the_refresh_and_a_changed_one_never() {
        let a = Applications::default();
        let t = Instant::now();
        assert!(!a.current("u", "f1", t), "nothing was applied yet");
        a.record("u", "f1".into(), t);
        assert!(a.current("u", "f1", t + Duration::from_secs(1)));
        assert!(a.current("u", "f1", t + REFRESH - Duration::from_millis(1)));
        assert!(!a.current("u", "f1", t + REFRESH), "applied again once the refresh is due");
        assert!(!a.current("u", "f2", t + Duration::from_secs(1)), "a changed job is applied at once");
        assert!(!a.current("other", "f1", t + Duration::from_secs(1)), "another job (a namesake) has its own");
        a.forget("u");
        assert!(!a.current("u", "f1", t + Duration::from_secs(1)), "a forgotten job is applied in full");
    }

    #[test]
    fn the_fingerprint_follows_the_children_and_not_the_pass() {
        let j = job(4);
        let same = fingerprint(&build(&j, &settings(true), 4)).unwrap();
        assert_eq!(same, fingerprint(&build(&j, &settings(true), 4)).unwrap(), "the same job builds the same");
        assert_ne!(same, fingerprint(&build(&j, &settings(true), 2)).unwrap(), "a rescale changes the children");
        let mut steps = j.clone();
        steps.spec.training.steps = Some(7);
        assert_ne!(same, fingerprint(&build(&steps, &settings(true), 4)).unwrap(), "so does a spec change");
    }
}
